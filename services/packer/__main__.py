"""Entry point: `python -m services.packer --config runs/<run>/config.yaml`."""

from gyre.service import run_service
from services.packer.service import PackerService

if __name__ == "__main__":
    run_service(PackerService)
