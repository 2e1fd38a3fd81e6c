"""``python -m services.device_allocator``: run the device-allocator service."""

from services.device_allocator import service
from shared.runtime import main_entry

if __name__ == "__main__":
    main_entry(
        "device-allocator",
        service.main,
        add_arguments=getattr(service, "add_arguments", None),
    )
