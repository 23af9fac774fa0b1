"""Hidden tests of fix-add: `add` returns the sum for several pairs.

The agent's calc.py is the policy's code, so it is never imported here: each case runs it in a child
process (as nobody when the verifier runs as root, under a time limit) that prints `add`'s result, and the
comparison is made in this process. Nothing calc.py does at import or exit (`os._exit(0)`, patching
unittest, writing the reward file) can pass a case it does not compute. test.sh runs this file with
`python3 -I`, so a calc-side `unittest.py` or `os.py` in the working directory is not imported either."""

import os
import stat
import subprocess
import sys
import unittest

CASES = [(2, 3), (0, 0), (-4, 9), (10, 15), (7, -7)]
CALL = "import sys, calc; print(repr(calc.add(int(sys.argv[1]), int(sys.argv[2]))))"


def agent_add(a: int, b: int) -> str:
    """What the agent's `add(a, b)` prints, run as an unprivileged child in the working directory."""
    drop = {"user": 65534, "group": 65534, "extra_groups": []} if _nobody_may_run_here() else {}
    run = [sys.executable, "-c", CALL, str(a), str(b)]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        try:
            done = subprocess.run(run, capture_output=True, text=True, timeout=10, env=env, **drop)
        except PermissionError:  # root without CAP_SETUID (a container that may not change users)
            done = subprocess.run(run, capture_output=True, text=True, timeout=10, env=env)
    except subprocess.TimeoutExpired:
        return "timed out"
    return done.stdout.strip() if done.returncode == 0 else f"exit {done.returncode}: {done.stderr[-300:]}"


def _nobody_may_run_here() -> bool:
    """Root, and every directory down to the working directory open to others (a verifier container's /app;
    not a host sandbox's private copy, where the agent's code then runs as the verifier's own user)."""
    if os.geteuid() != 0:
        return False
    path = os.getcwd()
    while True:
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return False
        if path == "/":
            return bool(os.stat(os.getcwd()).st_mode & stat.S_IROTH)
        path = os.path.dirname(path)


class HiddenAddTest(unittest.TestCase):
    def test_sums(self) -> None:
        for a, b in CASES:
            self.assertEqual(agent_add(a, b), repr(a + b), f"add({a}, {b})")


if __name__ == "__main__":
    unittest.main()
