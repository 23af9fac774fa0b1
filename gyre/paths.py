"""Where the installed tree is: the directory that holds `gyre/`, `services/`, `harness/` and `examples/`.

Gyre installs editable (`make setup`), so this is the checkout. Processes Gyre starts put it on their
PYTHONPATH (cell agents, sandboxed harnesses, verifiers), the packaged demo names its warm start and
tasks relative to it, and the tokenizer trainer reads the text it ships from it.

    from gyre.paths import REPO_ROOT
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
