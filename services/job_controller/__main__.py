"""``python -m services.job_controller``: run the Volcano Job controller."""

from services.job_controller.service import JobController
from shared.runtime import main_entry

if __name__ == "__main__":
    main_entry(JobController)
