"""The five Tessera services; each is ``python -m services.<name>`` or ``tessera <name>``."""
