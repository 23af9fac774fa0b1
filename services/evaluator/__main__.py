"""Entry point: `python -m services.evaluator --config runs/<run>/config.yaml`."""

from gyre.service import run_service
from services.evaluator.service import EvaluatorService

if __name__ == "__main__":
    run_service(EvaluatorService)
