"""Entry point: `python -m services.cell_agent --config runs/<run>/config.yaml`."""

from gyre.service import run_service
from services.cell_agent.service import CellAgentService

if __name__ == "__main__":
    run_service(CellAgentService)
