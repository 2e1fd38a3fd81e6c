"""``python -m services.binder``: run the binder service."""

from services.binder.service import Binder
from shared.runtime import main_entry

if __name__ == "__main__":
    main_entry(Binder)
