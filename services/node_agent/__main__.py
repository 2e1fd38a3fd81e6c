"""``python -m services.node_agent``: run the node-agent service; ``python -m
services.node_agent mps-control`` (``tessera node-agent mps-control``) runs the node's MPS
supervisor instead (services/node_agent/mps/supervisor.py)."""

import sys

from services.node_agent.service import NodeAgent, add_arguments
from shared.runtime import main_entry

if __name__ == "__main__":
    if sys.argv[1:2] == ["mps-control"]:
        from services.node_agent.mps.supervisor import main

        main(sys.argv[2:])
    else:
        main_entry(NodeAgent, add_arguments=add_arguments)
