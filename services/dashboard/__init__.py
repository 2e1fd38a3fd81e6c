"""The web dashboard: the ledger, the queues and the allocation events, live in a browser."""
