"""``python -m services.node_agent.mps``: the node's MPS supervisor (supervisor.py), as
``tessera node-agent mps-control`` runs it."""

from services.node_agent.mps.supervisor import main

if __name__ == "__main__":
    main()
