"""Reading a verifier's result: the score line on stdout (`score_line`) or Harbor's reward files.

    parse_score('... \\n{"score": 0.5}')               # (0.5, '{"score": 0.5}')
    read_reward(attempt_root / "logs" / "verifier")   # (1.0, 'reward.txt: 1') or (None, why not)

Harbor: `reward.txt` (one number) is read first, then `reward.json` (an object of named numbers: its
`reward`, or its only number). Gyre rewards are in [0, 1]; anything else, a missing or empty file,
or a file that is a symlink (the verifier runs unprivileged; the evaluator reads as root) is a failed
attempt (pending, then excluded), never a zero.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

from gyre.tasks.harbor import REWARD_JSON, REWARD_TXT

_MAX_BYTES = 64 << 10


def parse_score(stdout: str) -> tuple[float | None, str]:
    """The score from the verifier's last non-empty stdout line, or (None, why not)."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        return None, "verifier printed nothing"
    try:
        data = json.loads(lines[-1])
    except ValueError:
        return None, f"last line is not JSON: {lines[-1][:100]!r}"
    score = data.get("score") if isinstance(data, dict) else None
    if isinstance(score, bool) or not isinstance(score, int | float) or not 0.0 <= float(score) <= 1.0:
        return None, f"no score in [0, 1] in {lines[-1][:100]!r}"
    return float(score), lines[-1][:300]


def _read_plain(path: Path) -> str:
    """A regular file's text, never following a symlink; OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path.name} is not a regular file")
        return os.read(fd, _MAX_BYTES).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def _in_range(name: str, value: float) -> tuple[float | None, str]:
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return None, f"{name} holds {value}: Gyre rewards are numbers in [0, 1]"
    return value, f"{name}: {value:g}"


def read_reward(logs_dir: Path) -> tuple[float | None, str]:
    """The reward Harbor's convention names in `logs_dir` (the host side of /logs/verifier)."""
    txt, js = logs_dir / REWARD_TXT, logs_dir / REWARD_JSON
    if os.path.lexists(txt):
        try:
            text = _read_plain(txt).strip()
        except OSError as e:
            return None, f"{REWARD_TXT} is unreadable: {e}"
        if not text:
            return None, f"{REWARD_TXT} is empty"
        try:
            return _in_range(REWARD_TXT, float(text))
        except ValueError:
            return None, f"{REWARD_TXT} is not a number: {text[:80]!r}"
    if os.path.lexists(js):
        try:
            data = json.loads(_read_plain(js))
        except (OSError, ValueError) as e:
            return None, f"{REWARD_JSON} is not a JSON object: {e}"
        if not isinstance(data, dict):
            return None, f"{REWARD_JSON} must be an object of named numbers; got {type(data).__name__}"
        numbers = {k: v for k, v in data.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        if "reward" in numbers:
            return _in_range(f"{REWARD_JSON} reward", float(numbers["reward"]))
        if len(numbers) == 1:
            ((name, value),) = numbers.items()
            return _in_range(f"{REWARD_JSON} {name}", float(value))
        return None, (
            f"{REWARD_JSON} has no `reward` among {sorted(numbers)}: Gyre trains on one number "
            "(name it `reward`)"
        )
    return None, f"the verifier wrote no reward (neither /logs/verifier/{REWARD_TXT} nor {REWARD_JSON})"
