"""Entry point: `python -m services.scheduler --config runs/<run>/config.yaml`."""

from gyre.service import run_service
from services.scheduler.service import SchedulerService

if __name__ == "__main__":
    run_service(SchedulerService)
