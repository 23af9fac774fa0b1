"""`gyre bench cluster`: the compose deployment for real — every service its own container with its own
address, node-level faults, the run's invariants.

    gyre bench cluster --json                                    # 6 steps, every fault below
    gyre bench cluster --json --steps 2 --faults satellite-kill  # the reduced run `make test` makes
    gyre bench cluster --json --bad-input model-missing          # the model directory absent: who says so

It builds the images with podman (bench/_images.py: deploy/docker/Dockerfile from the local Debian base,
offline), then runs deploy/compose/compose.yaml as written through podman-compose (bench/_compose.py) under
a project name of its own, image names, host ports, the model directory and the Gyre config given by the
file's own variables. The config is deploy/compose/gyre.yaml with the demo's run settings on top
(app/demo/demo.yaml: K = 3 cells, the demo tasks, the demo harness; `--config` overlays more). Once every
container passes its healthcheck, it trains `--steps` steps, injecting the faults one after another, each
once the previous one recovered:

    satellite-kill       SIGKILL of the last satellite's container process (its restart policy restarts it)
    satellite-partition  the last satellite off the network for 10 s, back at the same address
    redis-restart        `podman restart` of the Redis container (its AOF volume kept)
    core-kill            SIGKILL of the core's container while it trains

`recovery_s`: injection → the container passes its healthcheck again (a partition: from reconnection).
Then the scheduler is shut down, the run's events are read from NATS into `runs/<run>/events.jsonl`, and the
invariants of tests/faults (app/demo/ledger.py) are checked: `lost`, `double_trained`, `harness_errors` per
fault window. Evidence that traffic crossed hosts: every container's address, the engines the scheduler
handed the proxy and the addresses they resolve to, and the address each NATS client connected from
(NATS's own /connz). Transport security (`tls`): what the servers say of their clients, which clients
they refuse, and a packet capture of the network's bridge (`tls.capture`, bench/_capture.py): every TCP
connection between containers by its first client bytes, the plaintext ones listed by (client, server,
port) with those bytes, and its verdict `tls.capture_all_tls`. Sandboxes (`sandbox_check`, beside the run,
bench/_sandbox_check.py): a sandbox of the runner and of the evaluator, each in its own container,
tries to read the container's keys and passwords and to reach every server; `ok` when none was read or
reached and the control (the `process` launcher) did read one. Last, the containers are stopped and the run
is audited from its own records (`audit`: bench/_cluster_audit.py gathers the run directory from the
services' volumes; `gyre audit` replays the training from the recorded micro-steps against the weights the
core kept, and accounts for every execution from Redis and the archive, compared with the bench's own
count from the events, `executions`: `audit.accounting.matches_report`). Everything the project created is removed at the end
(`left_running` must be empty); logs of every container stay in `runs/<run>/logs/`.

Last line: {"completed", "steps", "lost", "double_trained", "harness_errors", "executions", "faults": {NAME: {...,
"recovery_s"}}, "hosts", "engines", "nats_clients", "crossed_hosts", "tls": {..., "secure", "capture",
"capture_all_tls"}, "sandbox_check": {"runner", "evaluator", "control_process", "ok"}, "audit": {"ok", "defects", "replay", "ledger", "accounting", "run_dir"}, "build_s",
"wall_s", "left_running", "run_dir"}; with `--bad-input`: {"bad_input", "exited": {service: {"exit_code", "error"}}, "left_running"}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from bench._capture import NetworkCapture
from bench._compose import ComposeProject, ExitWatch
from bench._images import build_images, untag_images
from bench._sandbox_check import in_background, sandboxes_check
from gyre.paths import REPO_ROOT

FAULTS = ("satellite-kill", "satellite-partition", "redis-restart", "core-kill")
GYRE_SERVICES = (
    "scheduler",
    "proxy",
    "runner",
    "evaluator",
    "packer",
    "cell-agent-0",
    "cell-agent-1",
    "cell-agent-2",
)
CONTAINER_GID = 10001
"""The group of the image's user (deploy/docker/Dockerfile) and of Redis's `group_add` in compose.yaml."""
MODEL_USERS = ("proxy", "cell-agent-0", "cell-agent-1", "cell-agent-2")
"""The services that load the model (the proxy's tokenizer, the cells' engines and trainers)."""


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gyre bench cluster", description=__doc__)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help=f"comma-separated, in order: {', '.join(FAULTS)}"
    )
    parser.add_argument("--config", type=Path, default=None, help="YAML overlaid on the demo's run settings")
    parser.add_argument("--bad-input", choices=["model-missing"], default=None)
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"))
    parser.add_argument("--start-timeout-s", type=float, default=420.0)
    parser.add_argument(
        "--cold", action="store_true", help="build without podman's layer cache (what a fresh machine pays)"
    )
    parser.add_argument(
        "--json", action="store_true", help="accepted: the last line is always the JSON object"
    )
    args = parser.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        print(
            f"error: --faults: unknown {', '.join(unknown)}; choose from {', '.join(FAULTS)}", file=sys.stderr
        )
        raise SystemExit(2)
    signal.signal(signal.SIGTERM, _interrupt)
    result = run(args, faults)
    print(json.dumps(result))


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM (a test's timeout, `kill`) ends the run through its cleanup, as Ctrl-C does."""
    raise KeyboardInterrupt


def _log(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)


def run_config(run_id: str, steps: int, overlay: Path | None) -> dict[str, Any]:
    """deploy/compose/gyre.yaml ← the demo's run settings ← `overlay`, validated as Gyre would."""
    from gyre.config import load_config

    compose = yaml.safe_load((REPO_ROOT / "deploy" / "compose" / "gyre.yaml").read_text())
    demo = yaml.safe_load((REPO_ROOT / "app" / "demo" / "demo.yaml").read_text())
    demo.pop("model", None)  # the compose file mounts the model at /models/policy
    demo["tasks"].pop("held_out", None)  # the held-out evaluation is the demo's report, not this bench's
    merged = _merge(compose, demo)
    if overlay is not None:
        merged = _merge(merged, yaml.safe_load(overlay.read_text()) or {})
    merged = _merge(merged, {"run": {"id": run_id}, "scheduler": {"max_steps": steps}})
    load_config(None, environ={}, overrides=_merge(merged, {"model": {"path": None}}))
    return merged


def issue_certificates(run_dir: Path) -> Path:
    """The run's CA and certificates, by the command README gives (`gyre tls init`), keys readable by the
    containers' group."""
    out = run_dir / "tls"
    argv = [sys.executable, "-c", "from app.cli import main; main()", "tls", "init"]
    argv += ["--config", str(run_dir / "gyre.yaml"), "--out", str(out), "--group", str(CONTAINER_GID)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"gyre tls init failed: {done.stderr.strip()[-2000:]}")
    return out


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def run(args: argparse.Namespace, faults: list[str]) -> dict[str, Any]:
    from app.stack.servers import free_port

    t0 = time.monotonic()
    run_id = time.strftime("cluster-%Y%m%d-%H%M%S")
    run_dir = (args.runs_dir / run_id).resolve()
    (run_dir / "logs").mkdir(parents=True)
    config = run_config(run_id, args.steps, args.config)
    (run_dir / "gyre.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    name = f"gyre-bench-{uuid.uuid4().hex[:8]}"
    _log(f"building images (run dir {run_dir})")
    images = build_images(run_dir / "build", name, run_dir / "logs", cold=args.cold)
    _log(f"images built in {images.build_s}")
    tls_dir = issue_certificates(run_dir)
    model_dir = REPO_ROOT / "harness" / "demo_model" / "checkpoints" / "warmstart"
    if args.bad_input == "model-missing":
        model_dir = run_dir / "no-model"
        model_dir.mkdir()
    ports = {
        name: free_port()
        for name in (
            "GYRE_NATS_PORT",
            "GYRE_NATS_MONITOR_PORT",
            "GYRE_REDIS_PORT",
            "GYRE_SCHEDULER_PORT",
            "GYRE_PROXY_HTTP_PORT",
        )
    }
    env = {
        "GYRE_IMAGE": images.gyre,
        "GYRE_NATS_IMAGE": images.nats,
        "GYRE_REDIS_IMAGE": images.redis,
        "GYRE_CONFIG": str(run_dir / "gyre.yaml"),
        "GYRE_MODEL_DIR": str(model_dir),
        "GYRE_TLS_DIR": str(tls_dir),
        **{k: str(v) for k, v in ports.items()},
    }
    project = ComposeProject(name, env, run_dir / "logs")
    (run_dir / "compose.json").write_text(json.dumps({"project": project.name, "env": env}, indent=1))
    phases: dict[str, float] = {}
    capture: NetworkCapture | None = None
    try:
        t1 = time.monotonic()
        if args.bad_input is not None:
            # Only the services that load the model, without their dependencies: each exits at start,
            # before it would dial NATS or Redis, so nothing else needs to run to show the error.
            watch = project.watch_exits()
            try:
                project.up(*MODEL_USERS, no_deps=True)
                phases["up_s"] = round(time.monotonic() - t1, 1)
                result: dict[str, Any] = {"bad_input": args.bad_input, **_bad_input(project, watch)}
            finally:
                watch.close()
        else:
            from bench._cluster_run import ClusterRun

            capture = NetworkCapture(project.network_info).start()  # binds once `up` makes the bridge
            project.up()
            phases["up_s"] = round(time.monotonic() - t1, 1)
            checking = in_background(lambda: check_sandboxes(project, args.start_timeout_s))
            result = ClusterRun(
                project, run_dir, config, ports, args.steps, faults, tls_dir, capture
            ).execute(args.start_timeout_s)
            result["sandbox_check"] = checking()
        phases["run_s"] = round(time.monotonic() - t1 - phases["up_s"], 1)
        if args.bad_input is None and result["completed"]:
            from bench._cluster_audit import audit_compose_run

            t_audit = time.monotonic()
            result["audit"] = audit_compose_run(project, run_dir, config, model_dir, tls_dir, images.redis)
            phases["audit_s"] = round(time.monotonic() - t_audit, 1)
    finally:
        t2 = time.monotonic()
        if capture is not None:
            capture.stop()
        project.save_logs()
        left = project.down()
        untag_images(images)
        shutil.rmtree(run_dir / "build", ignore_errors=True)
        phases["down_s"] = round(time.monotonic() - t2, 1)
    return {
        **result,
        "build_s": images.build_s,
        "phases_s": phases,
        "wall_s": round(time.monotonic() - t0, 1),
        "left_running": left,
        "project": project.name,
        "run_dir": str(run_dir),
    }


def check_sandboxes(project: ComposeProject, timeout_s: float) -> dict[str, Any]:
    """Once the proxy, the runner and the evaluator are healthy: what a sandbox of each reaches
    (bench/_sandbox_check.py)."""
    project.wait_healthy(["proxy", "runner", "evaluator"], timeout_s)
    found = project.containers()
    return sandboxes_check({s: found[s].name for s in ("runner", "evaluator")}, project.env)


def _bad_input(project: ComposeProject, watch: ExitWatch, timeout_s: float = 180.0) -> dict[str, Any]:
    """Wait until every service that needs the model has exited with its one-line error; name them."""
    deadline = time.monotonic() + timeout_s
    exited: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline and len(exited) < len(MODEL_USERS):
        for service, codes in watch.exits().items():
            if service not in MODEL_USERS or service in exited:
                continue
            errors = [line for line in project.logs(service).splitlines() if line.startswith("error: ")]
            if errors:
                exited[service] = {"exit_code": codes[0], "error": errors[0], "exits": len(codes)}
        time.sleep(0.5)
    return {"exited": exited, "named": sorted(exited)}


if __name__ == "__main__":
    main(sys.argv[1:])
