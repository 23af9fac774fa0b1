"""`gyre bench kube`: the Kubernetes manifests for real, without a cluster — the rendered overlay played by
`podman kube play`, trained on, a pod deleted and recreated mid-run, the run audited.

    gyre bench kube --json                         # 6 steps; a satellite cell's pod deleted, then the core's
    gyre bench kube --json --steps 2 --no-core     # the reduced run `make test` makes (one cell pod deleted)
    gyre bench kube --json --images TAG            # the images an earlier build tagged TAG, not rebuilt

No API server can be installed here, so the kubelet's part is played by podman 4.3: `kubectl kustomize`
renders the overlay (`--overlay`, default cpu), the images are those `gyre bench cluster` builds
(bench/_images.py; set as `kustomize edit set image` would), the `gyre-config` ConfigMap holds the overlay's
own gyre.yaml with the demo's run settings on top (app/demo/demo.yaml: K = 3 cells, the demo tasks and
harness; `--config` overlays more), the TLS secrets are `gyre tls init`'s files and the `model` claim is
bound to the demo model's directory. bench/_kube_convert.py then converts the objects for podman, one
documented podman 4.3 gap per conversion (`conversions` in the JSON, deploy/README.md); nothing else is
rewritten. Each pod is played on a podman network of the bench's own; the host reaches the scheduler and
NATS through loopback port-forwards, as `cli`.

Beside the run, once the proxy, runner and evaluator pods are ready, a sandbox of the runner and one of the
evaluator try, from their pods, to read the pod's keys and passwords and to reach every server
(`sandbox_check`, bench/_sandbox_check.py, as the compose bench does). Once every pod is ready and the
scheduler names its cells, the faults are injected one after another,
each once the previous one recovered: `cell-pod-delete` deletes the last satellite's pod (SIGTERM, grace,
gone; its claim kept) and plays it again, as the StatefulSet controller recreates it (with a new address);
`core-pod-delete` (unless `--no-core`) does the same to the core's pod while it trains. `recovery_s`:
deletion → the new pod's readiness probe passes; `next_step_s`: deletion → the run's next step (what its
peers took to find the new pod). After `--steps` steps the scheduler is shut down, the run's events are
read from NATS and the invariants checked (`lost`, `double_trained` per fault window, app/demo/faults.py);
the pods are stopped and the run is audited from their volumes as the compose bench audits its own
(bench/_cluster_audit.py). Everything the bench created is removed (`left_running` must be empty); the
pods' logs stay in `runs/<run>/logs/`.

Last line: {"completed", "steps", "lost", "double_trained", "harness_errors", "executions", "sandbox_check", "pods": {POD:
{"from", "ip", "healthy_s"}}, "faults": {NAME: {..., "recovery_s", "next_step_s"}}, "conversions": {NAME:
{"why", "objects"}}, "not_exercised", "audit", "train_s", "build_s", "phases_s", "wall_s", "left_running",
"run_dir"}.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from app.deploy.access import PERMISSIONS_FILE, nats_permissions
from app.deploy.kustomize import load_manifests
from bench._images import IMAGE_PREFIX, ClusterImages, build_images, untag_images
from bench._kube_convert import CONVERSIONS, convert
from bench._kube_play import KubePlay
from bench._sandbox_check import in_background, sandboxes_check
from gyre.paths import REPO_ROOT

NOT_EXERCISED = [
    "StatefulSet identity and ordering (the bench creates each ordinal's pod itself)",
    "NetworkPolicy enforcement (podman applies none: every pod reaches every other)",
    "PersistentVolumeClaim access modes and storage classes (claims are local named volumes)",
    "probes as the kubelet runs them: no startup or liveness probe runs (podman makes the liveness probe a "
    "healthcheck that nothing runs without systemd) and readiness gates no Service (the bench runs each "
    "pod's readiness probe only to wait for it)",
    "the API server, the scheduler's placement and the controllers (no Kubernetes control plane)",
    "lifecycle hooks: a deleted cell pod's preStop notice (`gyre cell notice`) does not run (podman runs no "
    "hook), so the deleted pods here die as on a node failure",
]
"""What only a cluster shows (README, "A cluster")."""
SATELLITE, CORE = "cell-agent-2.cell-agent", "cell-agent-0.cell-agent"
IDENTITIES = ("scheduler", "proxy", "runner", "evaluator", "packer", "nats", "redis")
"""The identities with one secret each, `gyre-tls-<identity>`; each cell has its own, `gyre-tls-cell-agent-K`."""


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gyre bench kube", description=__doc__)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--overlay", default="cpu", help="a directory of deploy/k8s/overlays")
    parser.add_argument("--no-core", action="store_true", help="delete only a satellite's pod")
    parser.add_argument("--config", type=Path, default=None, help="YAML overlaid on the demo's run settings")
    parser.add_argument(
        "--images",
        default=None,
        metavar="TAG",
        help="use localhost/gyre-bench/{gyre,nats,redis}:TAG as built before instead of building",
    )
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"))
    parser.add_argument("--start-timeout-s", type=float, default=420.0)
    parser.add_argument(
        "--stall-timeout-s",
        type=float,
        default=600.0,
        help="report the run as stalled after this long without a step",
    )
    parser.add_argument(
        "--json", action="store_true", help="accepted: the last line is always the JSON object"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    print(json.dumps(run(args)))


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM (a test's timeout, `kill`) ends the run through its cleanup, as Ctrl-C does."""
    raise KeyboardInterrupt


def _log(message: str) -> None:
    print(f"[kube] {message}", file=sys.stderr, flush=True)


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def prepare(manifests: list[dict[str, Any]], run_id: str, steps: int, overlay: Path | None) -> dict[str, Any]:
    """The `gyre-config` ConfigMap's gyre.yaml ← the demo's run settings ← `overlay`, validated as Gyre
    would, written back into the ConfigMap (the bench's input, as compose's GYRE_CONFIG is the compose
    bench's), and the `nats-config` ConfigMap's permissions.conf for `run_id`; returns the config."""
    from gyre.config import load_config

    configmap = next(
        m for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"].startswith("gyre-config")
    )
    demo = yaml.safe_load((REPO_ROOT / "app" / "demo" / "demo.yaml").read_text())
    demo.pop("model", None)  # the pods mount the model claim at /models/policy
    demo["tasks"].pop("held_out", None)
    merged = _merge(yaml.safe_load(configmap["data"]["gyre.yaml"]), demo)
    if overlay is not None:
        merged = _merge(merged, yaml.safe_load(overlay.read_text()) or {})
    merged = _merge(merged, {"run": {"id": run_id}, "scheduler": {"max_steps": steps}})
    load_config(None, environ={}, overrides=_merge(merged, {"model": {"path": None}}))
    configmap["data"]["gyre.yaml"] = yaml.safe_dump(merged, sort_keys=False)
    # nats-server's users for this run id (deploy/nats/permissions.conf is for the base's run id), as an
    # operator who changes run.id regenerates it (`gyre deploy nats-permissions`).
    nats_config = next(
        m for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"].startswith("nats-config")
    )
    nats_config["data"][PERMISSIONS_FILE] = nats_permissions(run_id)
    return merged


def set_images(manifests: list[dict[str, Any]], gyre: str, nats: str, redis: str) -> None:
    """`kustomize edit set image` for the images the bench built (the base names gyre:dev and the upstream
    nats and redis images)."""
    for m in manifests:
        template = (m.get("spec") or {}).get("template") or {}
        for container in (template.get("spec") or {}).get("containers") or []:
            image = str(container["image"])
            container["image"] = (
                nats if image.startswith("nats:") else redis if image.startswith("redis:") else gyre
            )


def check_sandboxes(play: KubePlay, timeout_s: float) -> dict[str, Any]:
    """Once the proxy's, the runner's and the evaluator's pods are ready: what a sandbox of each of the two
    reaches from its pod (bench/_sandbox_check.py)."""
    play.wait_healthy(["proxy", "runner", "evaluator"], timeout_s)
    return sandboxes_check({pod: play.containers(pod)[0] for pod in ("runner", "evaluator")}, play.env)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.cluster import issue_certificates

    t0 = time.monotonic()
    run_id = time.strftime("kube-%Y%m%d-%H%M%S")
    run_dir = (args.runs_dir / run_id).resolve()
    (run_dir / "logs").mkdir(parents=True)
    manifests = load_manifests(REPO_ROOT / "deploy" / "k8s" / "overlays" / args.overlay)
    config = prepare(manifests, run_id, args.steps, args.config)
    (run_dir / "gyre.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    tls_dir = issue_certificates(run_dir)
    prefix = f"gyre-kube-{uuid.uuid4().hex[:8]}"
    if args.images:
        images = ClusterImages(*(f"{IMAGE_PREFIX}/{n}:{args.images}" for n in ("gyre", "nats", "redis")), {})
    else:
        _log(f"building images (run dir {run_dir})")
        images = build_images(run_dir / "build", prefix.removeprefix("gyre-"), run_dir / "logs")
        _log(f"images built in {images.build_s}")
    set_images(manifests, images.gyre, images.nats, images.redis)
    model_dir = REPO_ROOT / "harness" / "demo_model" / "checkpoints" / "warmstart"
    cells = sorted(p.name for p in tls_dir.glob("cell_agent-*"))  # gyre tls init: one per cell
    secrets = {f"gyre-tls-{i.replace('_', '-')}": tls_dir / i for i in (*IDENTITIES, *cells)}
    playable = convert(manifests, run_dir / "kube", prefix, secrets, {"model": model_dir})
    play = KubePlay(prefix, run_dir / "kube", run_dir / "logs")
    phases: dict[str, float] = {}
    result: dict[str, Any] = {"completed": False}
    try:
        t1 = time.monotonic()
        play.create(playable)
        phases["play_s"] = round(time.monotonic() - t1, 1)
        from bench._kube_run import KubeRun

        faults = ["cell-pod-delete"] + ([] if args.no_core else ["core-pod-delete"])
        kube_run = KubeRun(play, run_dir, config, args.steps, faults, tls_dir, stall_s=args.stall_timeout_s)
        try:
            checking = in_background(lambda: check_sandboxes(play, args.start_timeout_s))
            result = kube_run.execute(args.start_timeout_s)
            result["sandbox_check"] = checking()
        except TimeoutError as e:
            _log(f"stopped: {e}")
            result = kube_run.stalled(e)
        phases["run_s"] = round(time.monotonic() - t1 - phases["play_s"], 1)
        if result["completed"]:
            from bench._kube_run import audit_kube_run

            t2 = time.monotonic()
            result["audit"] = audit_kube_run(play, run_dir, config, model_dir, tls_dir, images.redis)
            phases["audit_s"] = round(time.monotonic() - t2, 1)
    finally:
        t3 = time.monotonic()
        play.remove_all()
        if not args.images:
            untag_images(images)
        left = play.left_running()
        phases["down_s"] = round(time.monotonic() - t3, 1)
    return {
        **result,
        "conversions": {
            name: {"why": CONVERSIONS[name], "objects": objs} for name, objs in playable.applied.items()
        },
        "not_exercised": NOT_EXERCISED,
        "build_s": images.build_s,
        "phases_s": phases,
        "wall_s": round(time.monotonic() - t0, 1),
        "left_running": left,
        "run_dir": str(run_dir),
    }


if __name__ == "__main__":
    main(sys.argv[1:])
