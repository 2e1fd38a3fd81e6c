"""``python -m services.binder``: run the binder service."""

from services.binder.service import main
from shared.runtime import main_entry

if __name__ == "__main__":
    main_entry("binder", main)
