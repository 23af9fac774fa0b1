"""The deployment benches' check that sandboxes keep the policy's code away from the deployment: `python -m
app.stack.sandbox_check` run with `podman exec` in the runner's and the evaluator's containers (compose) or
pods (kube), while the stack is up and the proxy answers; and once more in the runner's container with the
`process` launcher, the control that shows the check can fail (a harness there reads the container's
keys). `sandboxes_check(...)` → {"runner": {...}, "evaluator": {...}, "control_process": {...}, "ok"}.

    checking = in_background(lambda: sandboxes_check(...))   # beside the run: it must not delay the faults
    ...
    result["sandbox_check"] = checking()                       # joined; its error as {"ok": False, ...}
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable
from typing import Any

CONFIG = "/etc/gyre/gyre.yaml"


def _exec(container: str, env: dict[str, str], *args: str, timeout_s: float = 180.0) -> dict[str, Any]:
    argv = ["podman", "exec", container, "python", "-m", "app.stack.sandbox_check", "--config", CONFIG, *args]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"no answer within {timeout_s:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"ok": False, "error": f"exit {done.returncode}: {(done.stderr or done.stdout)[-600:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def sandboxes_check(containers: dict[str, str], env: dict[str, str]) -> dict[str, Any]:
    """`containers`: the runner's and the evaluator's container names. `ok`: neither service's sandbox read
    a credential or reached a server but the proxy, and the control did read one."""
    runner = _exec(containers["runner"], env, "--service", "runner")
    evaluator = _exec(containers["evaluator"], env, "--service", "evaluator")
    control = _exec(containers["runner"], env, "--service", "runner", "--isolation", "process")
    control_caught = bool(control.get("credentials_read"))
    return {
        "runner": runner,
        "evaluator": evaluator,
        "control_process": {**control, "caught": control_caught},
        "ok": bool(runner.get("ok")) and bool(evaluator.get("ok")) and control_caught,
    }


def in_background(check: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """Run `check` in a thread from now on (a run's faults are timed by its steps, which a check run
    first would let pass); the returned function waits for it and gives its result, or what it raised."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = check()
        except Exception as e:  # the bench reports it; the run goes on
            box["result"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}

    thread = threading.Thread(target=target, name="sandbox-check", daemon=True)
    thread.start()

    def result(timeout_s: float = 600.0) -> dict[str, Any]:
        thread.join(timeout_s)
        return dict(box.get("result", {"ok": False, "error": f"no result within {timeout_s:.0f} s"}))

    return result
