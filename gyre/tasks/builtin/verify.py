"""The verifier of the built-in arithmetic suites: scores answer files in the current directory (a copy
of a preserved workspace) and prints `{"score": x, "parts": {...}}` as its last line. Standard library
only: the suites run it as a script (`python -I -S .../verify.py`), without importing the library.

    python -m gyre.tasks.builtin.verify answer.txt=8                 # add/3+5
    python -m gyre.tasks.builtin.verify a.txt=8 b.txt=4              # parts/3+5,2+2

Per part: 1.0 when the file holds the expected answer (surrounding whitespace ignored), 0.2 when
the file exists with anything else (the write_file call was well formed, the answer wrong), 0.0
when it is missing. The score is the mean over parts, so partial work before a timeout counts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RIGHT, WRITTEN, MISSING = 1.0, 0.2, 0.0


def score_text(text: str | None, expected: str) -> float:
    """One part: the content written (None = no file) against the expected answer."""
    if text is None:
        return MISSING
    return RIGHT if text.strip() == expected else WRITTEN


def score_part(path: Path, expected: str) -> float:
    try:
        text = path.read_text(errors="replace") if path.is_file() else None
    except OSError:
        text = None
    return score_text(text, expected)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m gyre.tasks.builtin.verify FILE=EXPECTED [FILE=EXPECTED ...]", file=sys.stderr)
        return 2
    parts: dict[str, float] = {}
    for arg in argv:
        rel, sep, expected = arg.partition("=")
        if not sep or not rel:
            print(f"error: expected FILE=EXPECTED; got {arg!r}", file=sys.stderr)
            return 2
        parts[rel] = score_part(Path(rel), expected)
    print(json.dumps({"score": sum(parts.values()) / len(parts), "parts": parts}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
