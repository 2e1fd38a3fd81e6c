"""``python -m services.gang_coordinator``: run the gang-coordinator service."""

from services.gang_coordinator.service import Coordinator
from shared.runtime import main_entry

if __name__ == "__main__":
    main_entry(Coordinator)
