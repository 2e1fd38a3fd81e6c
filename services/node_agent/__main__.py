"""``python -m services.node_agent``: run the node-agent service."""

from services.node_agent import service
from shared.runtime import main_entry

if __name__ == "__main__":
    main_entry(
        "node-agent",
        service.main,
        add_arguments=getattr(service, "add_arguments", None),
    )
