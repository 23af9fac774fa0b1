"""The deployment benches' check that sandboxes keep the policy's code away from the deployment: `python -m
app.stack.sandbox_check` run with `podman exec` in the runner's and the evaluator's containers (compose) or
pods (kube), while the stack is up and the proxy answers; and once more in the runner's container with the
`process` launcher, the control that shows the check can fail (a harness there reads the container's
keys). `sandboxes_check(...)` → {"runner": {...}, "evaluator": {...}, "control_process": {...}, "ok"}.
"""

from __future__ import annotations

import json
import subprocess
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
