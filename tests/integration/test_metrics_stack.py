"""`/metrics` of every process of a running stack (`gyre up` on a tiny config), found through `gyre status`,
and the services' log files: JSON lines only, uvicorn's among them."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gyre.config import ConfigError, load_config
from gyre.service import GyreService
from services.cell_agent.metrics import ROLES
from services.scheduler.service import SchedulerService
from tests.support.eventually import eventually_sync
from tests.support.models import small_dir
from tests.support.offline_sinks import hide_package

GYRE = [sys.executable, "-c", "from app.cli import main; main()"]

NAMED: dict[str, tuple[str, ...]] = {
    "scheduler": (
        "gyre_scheduler_waterlevel_executions",
        "gyre_scheduler_rollout_capacity_executions",
        'gyre_scheduler_cells{role="training"}',
        'gyre_scheduler_cell_role{cell="1",role="rollout"}',
        "gyre_scheduler_dispatched_executions_total",
        "gyre_scheduler_started_executions_total",
        "gyre_scheduler_finished_executions_total",
        "gyre_scheduler_mean_staleness_steps",
        "gyre_scheduler_group_staleness_steps_bucket",
        "gyre_scheduler_transitions_total",
    ),
    "packer": (
        "gyre_packer_groups_packed_total",
        "gyre_packer_microsteps_enqueued_total",
        'gyre_packer_admitted_target_tokens_total{leaf_class="main"}',
        'gyre_packer_admitted_trajectories_total{leaf_class="sub_agent"}',
        "gyre_packer_open_batches",
    ),
    "cell_agent-0": (
        'gyre_cell_agent_step_seconds_bucket{cell="0"',
        'gyre_cell_agent_switch_seconds_count{cell="0",to_role="training"}',
        'gyre_cell_agent_training_tokens_per_second{cell="0"}',
        'gyre_cell_agent_snapshot_pulls_total{cell="0",outcome="pulled"}',
        'gyre_cell_agent_role{cell="0",role="rollout"}',
        "gyre_engine_running_requests",
        "gyre_engine_kv_usage_ratio",
        "gyre_engine_prefix_hit_ratio",
        "gyre_engine_cached_prompt_tokens_total",
    ),
    "cell_agent-1": ('gyre_cell_agent_role{cell="1",role="rollout"}', "gyre_engine_waiting_requests"),
    "runner": (
        'gyre_runner_sandboxes{state="running"}',
        'gyre_runner_sandboxes{state="starting"}',
        "gyre_runner_launch_seconds_bucket",
        'gyre_runner_terminated_executions_total{reason="harness_timeout"}',
        'gyre_runner_slots{use="free"}',
    ),
    "evaluator": (
        "gyre_evaluator_pending_evaluations",
        "gyre_evaluator_queued_evaluations",
        'gyre_evaluator_evaluation_seconds_bucket{le="1.0",status="excluded"}',
        'gyre_evaluator_evaluations_total{status="excluded"}',
        "gyre_evaluator_groups_ready_total",
    ),
    "proxy": (
        "gyre_proxy_open_executions",
        "gyre_proxy_prompt_tokens_total",
        "gyre_proxy_kv_migrated_tokens_total",
    ),
}


def _gyre(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GYRE, *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


def test_every_service_serves_its_named_series_and_logs_json_only(tmp_path: Path) -> None:
    config = tmp_path / "gyre.yaml"
    run_dir = tmp_path / "runs" / "metricstest"
    # One execution dispatched (N = B = 1, phi = 0, mu = 1): the series exist from the start, whatever ran.
    config.write_text(
        f"run:\n  id: metricstest\n  dir: {tmp_path / 'runs'}\nmodel:\n  path: {small_dir()}\nlog:\n  format: json\n"
        "scheduler:\n  num_cells: 2\n  group_size: 1\n  batch_groups: 1\n  phi: 0\n  mu: 1\n"
    )
    up = _gyre("up", "--detach", "--wait", "60", config=config)
    assert up.returncode == 0, up.stderr
    try:
        rows = {r["name"]: r for r in json.loads(_gyre("status", "--json", config=config).stdout)}
        assert set(NAMED) <= set(rows)
        resolved = load_config(run_dir / "config.yaml")
        with httpx.Client(timeout=10) as client:
            for name, wanted in NAMED.items():
                port = rows[name]["metrics_port"]
                assert isinstance(port, int) and port > 0, f"{name}: no metrics port in gyre status"
                text = client.get(f"http://127.0.0.1:{port}/metrics").text
                assert f'gyre_{name.split("-")[0]}_info{{instance="{name}",run="metricstest"}} 1.0' in text
                missing = [w for w in wanted if w not in text]
                assert not missing, f"{name} /metrics lacks {missing}"
                if name.startswith("cell_agent-"):  # the batch may have moved a cell already: any one role
                    current = re.findall(
                        r'^gyre_cell_agent_role\{cell="\d+",role="(\w+)"\} 1\.0$', text, re.M
                    )
                    assert len(current) == 1 and current[0] in ROLES, f"{name}: roles at 1: {current}"
            # the embedded engine serves its own series on its port too (as SGLang does)
            engine = client.get(f"http://127.0.0.1:{resolved.cell_agent.engine_ports[0]}/metrics").text
            assert "gyre_engine_kv_usage_ratio" in engine and "gyre_cell_agent_" not in engine
        text_status = _gyre("status", config=config).stdout
        assert f"metrics {rows['scheduler']['metrics_port']}" in text_status
        # a malformed request to the proxy's harness port: uvicorn logs it, through our JSON logging
        with socket.create_connection(("127.0.0.1", resolved.proxy.http_port), timeout=5) as s:
            s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            s.recv(1024)
        eventually_sync(
            lambda: "uvicorn.error" in (run_dir / "logs" / "proxy.log").read_text(),
            timeout_s=10,
            what="the proxy to log the malformed request",
        )
    finally:
        down = _gyre("down", config=config)
    assert down.returncode == 0, down.stderr
    logs = {p.stem: p.read_text().splitlines() for p in (run_dir / "logs").glob("*.log")}
    # The servers' own logs are theirs; a fork server's file is its raw stderr (a failed preload's traceback,
    # empty otherwise: its events are logged by the runner).
    services = {k: v for k, v in logs.items() if k not in ("nats", "redis") and not k.endswith("-forkserver")}
    assert set(NAMED) | {"supervisor"} <= set(services)
    for name, lines in services.items():
        assert lines, f"{name}.log is empty"
        bad = [line for line in lines if not line.startswith("{")]
        assert not bad, f"{name}.log has non-JSON lines: {bad[:3]}"
        for line in lines:
            assert isinstance(json.loads(line)["event"], str)
    proxy_loggers = {json.loads(line).get("logger") for line in services["proxy"]}
    assert "uvicorn.error" in proxy_loggers, proxy_loggers
    uvicorn = [json.loads(line) for line in services["proxy"] if '"uvicorn.error"' in line]
    assert any(u["run"] == "metricstest" and u["service"] == "proxy" for u in uvicorn)


@pytest.mark.parametrize("sink", ["wandb", "mlflow"])
async def test_a_scheduler_with_a_sink_whose_extra_is_missing_stops_at_start(
    nats_server: object,
    redis_server: object,
    run_id: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sink: str,
) -> None:
    hide_package(monkeypatch, sink)
    config = load_config(
        None,
        environ={},
        overrides={
            "run": {"id": run_id, "dir": str(tmp_path)},
            "nats": {"url": nats_server.url},  # type: ignore[attr-defined]
            "redis": {"url": redis_server.url},
            "metrics": {"sinks": [sink]},  # type: ignore[attr-defined]
        },
    )
    service: GyreService = SchedulerService(config)
    with pytest.raises(
        ConfigError, match=rf"'{sink}' needs the {sink} package.*pip install 'gyre\[{sink}\]'"
    ):
        await service.start()
    await service.stop()
    assert not (tmp_path / run_id / "services" / "scheduler.json").exists()
