"""Entry point: `python -m services.proxy --config runs/<run>/config.yaml`.

Runs on uvloop when it is installed (a faster event loop for the harness-facing HTTP path).

Garbage collection is tuned for the proxy's allocation pattern: every call parses a harness body of tens
of KB and holds prompts as lists of tens of thousands of ids, so CPython's default young-generation
threshold (700 net container allocations) ran a collection every other call, each traversing those lists,
and a full collection (~100 ms over the imported modules' objects) every few seconds. Measured under
saturated `gyre bench load` (64 concurrent, 2,048 calls): 2.9 s of collections, 1.4 ms per call, with
defaults; 0.7 s with the objects of start-up frozen out of collection (`gc.freeze`) and a threshold of
20,000 (then ~30 ms per young collection, one every ~2 s; older generations rarely).
"""

import contextlib
import gc

from gyre.service import run_service
from services.proxy.service import ProxyService

GC_THRESHOLDS = (20_000, 20, 20)

if __name__ == "__main__":
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    run_service(ProxyService)
