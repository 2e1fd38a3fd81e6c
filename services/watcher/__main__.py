"""``python -m services.watcher``: run the watcher service."""

from services.watcher.service import Watcher
from shared.runtime import main_entry

if __name__ == "__main__":
    main_entry(Watcher)
