"""Entry point: `python -m services.proxy --config runs/<run>/config.yaml`."""

from gyre.service import run_service
from services.proxy.service import ProxyService

if __name__ == "__main__":
    run_service(ProxyService)
