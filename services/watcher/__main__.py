"""``python -m services.watcher``: run the watcher service."""

from services.watcher import service
from shared.runtime import main_entry

if __name__ == "__main__":
    main_entry(
        "watcher",
        service.main,
        add_arguments=getattr(service, "add_arguments", None),
    )
