"""The compose deployment runs for real (`gyre bench cluster` at its reduced size): the images built with
podman from this checkout, deploy/compose/compose.yaml run by podman-compose, every service its own
container with its own address, K = 3 cells, 2 steps with one satellite's container SIGKILLed (its restart
policy brings it back); then the run's invariants, that every NATS client connected over TLS (NATS's own
/connz) while clients without the deployment's certificate were refused (NATS, Redis, gRPC, the proxy's
and an engine's HTTP), and that the packet capture on the network's bridge saw the run's connections
between containers and that every one was TLS, the cells' own star among them; and that a sandbox of the runner and of the
evaluator reads none of their containers' keys and reaches no server but the proxy. And bad input: the model
directory missing from the mount, the services
that load it (started alone, without the rest of the stack) exit with the one-line model error, and the
bench names them.

Both leave nothing of theirs in podman. Needs root (rootful podman, `make setup`); outside CI a machine
without it skips with the reason, under CI=true it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gyre.paths import REPO_ROOT
from tests.support.sandboxes import assert_sandboxes_checked, unavailable

pytestmark = pytest.mark.slow

TINY = """
scheduler: {num_cells: 3, group_size: 2, batch_groups: 2, phi: 0.5, mu: 2, rho_min: 0.5, tau_s: 0.2, cell_capacity: 2}
tasks: {queries: ["add/1+5"]}
runner: {harness_args: ["--tool-latency-s", "0.2", "--tool-latency-max-s", "0.5"]}
"""
MODEL_USERS = ["cell-agent-0", "cell-agent-1", "cell-agent-2", "proxy"]
_PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
"""This environment's scripts first (podman-compose comes with the dev extras), as the bench looks."""


def _podman_or_skip() -> None:
    missing = [tool for tool in ("podman", "podman-compose") if shutil.which(tool, path=_PATH) is None]
    if os.geteuid() != 0:
        missing.append("root (rootful podman)")
    if missing:
        unavailable(f"the compose run needs {', '.join(missing)} (make setup as root)")


def _gyre(tmp_path: Path, *args: str, timeout_s: float) -> dict[str, Any]:
    """`gyre ARGS` in `tmp_path` (with the tiny run settings there); its last stdout line, parsed."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    env = {**os.environ, "PATH": _PATH}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from app.cli import main; main()", *args],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the bench removes what it created on SIGTERM
        stdout, stderr = proc.communicate(timeout=120)
        pytest.fail(f"gyre {' '.join(args)} ran over {timeout_s:.0f} s:\n{stderr[-4000:]}")
    assert proc.returncode == 0, stderr[-4000:]
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result


@pytest.mark.timeout(1800)
def test_reduced_compose_run_trains_through_a_satellite_container_kill(tmp_path: Path) -> None:
    _podman_or_skip()
    result = _gyre(
        tmp_path,
        *(
            "bench",
            "cluster",
            "--json",
            "--steps",
            "2",
            "--faults",
            "satellite-kill",
            "--config",
            "tiny.yaml",
        ),
        timeout_s=1650,
    )
    assert result["left_running"] == [], "everything the project created is gone"
    assert result["completed"] and result["steps"] >= 2, result
    assert result["lost"] == 0 and result["double_trained"] == 0, result["faults"]
    # every execution ran its harness to an end the harness chose (a sandbox that broke the harness, a
    # fault a reroute did not hide, would show here and nowhere else: the run still completes)
    assert result["harness_errors"] == 0, result["faults"]
    kill = result["faults"]["satellite-kill"]
    assert kill["injected"] and result["recovery_s"]["satellite-kill"] is not None, kill
    hosts = result["hosts"]
    assert len(set(hosts.values())) == len(hosts), f"every container has its own address: {hosts}"
    assert result["crossed_hosts"], {k: result[k] for k in ("hosts", "engines", "nats_clients")}
    assert all(url.startswith("https://") for url in result["engines"]), result["engines"]
    secured = result["tls"]
    assert secured["all_nats_clients_tls"] and len(secured["nats_tls_versions"]) >= 8, secured
    assert secured["redis"]["tls_only"], secured["redis"]  # Redis's CONFIG GET: port 0, client certs
    assert {"scheduler", "packer", "evaluator"} <= set(secured["redis"]["clients"]), secured["redis"]
    assert all(secured["refused"].values()), f"a client without a certificate got through: {secured}"
    assert all(secured["accepted"].values()), (
        f"a client with the deployment's certificate was refused: {secured}"
    )
    _check_capture(secured)
    assert_sandboxes_checked(result["sandbox_check"])
    run_dir = Path(result["run_dir"])
    assert (run_dir / "events.jsonl").stat().st_size > 0
    assert (run_dir / "logs" / "cell-agent-0.log").exists()
    # The run audited from its own records, gathered from the services' volumes: the training replayed from
    # the recorded micro-steps equals the core's weights after every step, every execution accounted for.
    audit = result["audit"]
    assert audit["ok"] and audit["defects"] == [], audit["defects"]
    replay = audit["replay"]
    assert replay["skipped"] in ("", None) and replay["steps"] == result["steps"], replay
    assert all(row["compared"] for row in replay["by_step"]), replay["by_step"]
    accounting = audit["accounting"]  # read from the run's own Redis (its AOF, served by its Redis image)
    assert accounting["dispatched"] == accounting["counters"]["d"] > 0 and accounting["lost"] == 0, accounting
    # ... and the bench's own report of the executions (from the events) agrees with that accounting.
    assert (
        accounting["matches_report"] is True
        and result["executions"]["dispatched"] == accounting["dispatched"]
    )


def _check_capture(secured: dict[str, Any]) -> None:
    """The packet capture on the network's bridge saw the run's connections between containers, every one
    of them TLS: the services', NATS's, Redis's, the engines' and the proxy's, and the cells' collectives
    and snapshot pulls over the TLS star (`dist_backend: tls`) to the core's star port."""
    wire = secured["capture"]
    assert not wire.get("error") and not wire["errors"], wire
    assert wire["interface"] and wire["flows"] > 0 and wire["tls"] > 0, wire
    kinds = ("tls", "plaintext_flows", "no_payload", "unknown_start_flows")
    assert sum(wire[k] for k in kinds) == wire["flows"], wire
    assert wire["plaintext_flows"] == 0 and wire["plaintext"] == [], (
        f"plaintext between containers: {wire['plaintext']}"
    )
    assert wire["unknown_start_flows"] == 0, wire
    assert secured["capture_all_tls"] is True, wire
    seen = {(c["client"], c["server"], c["port"]) for c in wire["tls_channels"]}
    expected = {("scheduler", "nats", 4222), ("scheduler", "redis", 6379), ("runner", "proxy", 8080)}
    expected |= {("scheduler", f"cell-agent-{k}", 50060) for k in range(3)}
    assert expected <= seen, sorted(seen)
    assert any(c[0] == "proxy" and c[1].startswith("cell-agent-") and c[2] == 30000 for c in seen), seen
    service_ports = {4222, 6379, 8080, 9400, 30000, 50051, 50052, 50053, 50054, 50055, 50060}
    star = {
        c[0]
        for c in seen
        if c[1] == "cell-agent-0" and c[0].startswith("cell-agent-") and c[2] not in service_ports
    }
    assert star == {"cell-agent-1", "cell-agent-2"}, (
        f"the satellites' star connections to the core: {sorted(seen)}"
    )


@pytest.mark.timeout(1200)
def test_compose_run_without_the_model_names_the_services_that_need_it(tmp_path: Path) -> None:
    _podman_or_skip()
    result = _gyre(
        tmp_path,
        *("bench", "cluster", "--json", "--bad-input", "model-missing", "--config", "tiny.yaml"),
        timeout_s=1050,
    )
    assert result["left_running"] == []
    assert result["named"] == MODEL_USERS, result
    for service, row in result["exited"].items():
        assert row["exit_code"] == 2, (service, row)
        assert "model" in row["error"] and "/models/policy" in row["error"], (service, row)
        assert "\n" not in row["error"]
