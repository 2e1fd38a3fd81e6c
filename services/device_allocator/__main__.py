"""``python -m services.device_allocator``: run the device-allocator service."""

from services.device_allocator.service import Allocator
from shared.runtime import main_entry

if __name__ == "__main__":
    main_entry(Allocator)
