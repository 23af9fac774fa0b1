"""Lets PyPI's torchvision import next to the CPU torch wheel (run by deploy/sglang/install.sh).

PyPI's Linux torchvision is a CUDA build: next to the CPU torch its C extension does not load, which
torchvision tolerates everywhere except the fake-kernel registrations that are not
guarded like the others (`torchvision::nms`, `torchvision::qnms`), so `import torchvision` fails ("operator torchvision::nms does not exist") and
SGLang imports torchvision unconditionally. This gives those registrations the guard the others have
(`torchvision.extension._has_ops()`); without the extension torchvision's ops raise when called, as they
do in any torchvision built without ops. Idempotent; a no-op where the extension loads.

    .venv-sglang/bin/python deploy/sglang/patch_torchvision.py
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

UNGUARDED = re.compile(r'^@torch\.library\.register_fake\(("torchvision::\w+")\)$', re.MULTILINE)
GUARDED = (
    r"@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda fn: fn))"
    "  # patched by Gyre (deploy/sglang)"
)


def main() -> int:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        print("torchvision is not installed in this environment", file=sys.stderr)
        return 1
    path = Path(spec.origin).parent / "_meta_registrations.py"
    text = path.read_text()
    patched, count = UNGUARDED.subn(GUARDED, text)
    if count:
        path.write_text(patched)
        print(f"patched {count} registrations in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
