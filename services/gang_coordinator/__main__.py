"""``python -m services.gang_coordinator``: run the gang-coordinator service."""

from services.gang_coordinator.service import main
from shared.runtime import main_entry

if __name__ == "__main__":
    main_entry("gang-coordinator", main)
