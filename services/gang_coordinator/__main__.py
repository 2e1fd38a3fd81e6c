"""``python -m services.gang_coordinator``: run the gang-coordinator service."""

from services.gang_coordinator import service
from shared.runtime import main_entry

if __name__ == "__main__":
    main_entry(
        "gang-coordinator",
        service.main,
        add_arguments=getattr(service, "add_arguments", None),
    )
