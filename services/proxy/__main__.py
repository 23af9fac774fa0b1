"""Entry point: `python -m services.proxy --config runs/<run>/config.yaml`.

Runs on uvloop when it is installed (a faster event loop for the harness-facing HTTP path).
"""

import contextlib

from gyre.service import run_service
from services.proxy.service import ProxyService

if __name__ == "__main__":
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    run_service(ProxyService)
