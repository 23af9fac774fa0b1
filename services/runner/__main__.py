"""Entry point: `python -m services.runner --config runs/<run>/config.yaml`."""

from gyre.service import run_service
from services.runner.service import RunnerService

if __name__ == "__main__":
    run_service(RunnerService)
