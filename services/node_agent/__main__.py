"""``python -m services.node_agent``: run the node-agent service."""

from services.node_agent.service import NodeAgent, add_arguments
from shared.runtime import main_entry

if __name__ == "__main__":
    main_entry(NodeAgent, add_arguments=add_arguments)
