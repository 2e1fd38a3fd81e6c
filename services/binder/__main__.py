"""``python -m services.binder``: run the binder service."""

from services.binder import service
from shared.runtime import main_entry

if __name__ == "__main__":
    main_entry(
        "binder",
        service.main,
        add_arguments=getattr(service, "add_arguments", None),
    )
