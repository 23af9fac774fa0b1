"""A run on SGLang servers (tests/e2e/test_sglang_*): its config, and the run seen from outside — the engines'
URLs as the run resolved them, the weight version each server itself reports, and nothing left running once
the run is down.

    config = sglang_demo_config(tmp_path, "e2esglang", uid_base=163000)
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from app.demo.config import demo_config
from gyre.config import GyreConfig, load_config
from gyre.paths import REPO_ROOT
from tests.e2e.test_elastic_run import SHAPE as ELASTIC
from tests.support.eventually import eventually_sync
from tests.support.sglang import sglang_python

OVERLAY = REPO_ROOT / "app" / "demo" / "sglang.yaml"
SHAPE: dict[str, Any] = {
    **ELASTIC,
    # 14 executions over 3 cells: every cell hosts some, the core too when it switches
    "scheduler": {**ELASTIC["scheduler"], "cell_capacity": 4},
    "runner": {"harness_args": ["--tool-latency-s", "1", "--tool-latency-max-s", "8"]},
}
"""tests/e2e/test_elastic_run.py's K = 3 shape with cells small enough that every cell hosts executions, and
shorter tool waits (the demo's warm start, elastic)."""


def sglang_demo_config(tmp_path: Path, run_id: str, *, uid_base: int) -> GyreConfig:
    """The demo on `app/demo/sglang.yaml` in `SHAPE`, with sandbox uids of its own from `uid_base` (the
    runner's; the verifier's +1000): a runner kills every process of the uids it takes, and other stacks
    on this machine (tests, benches) use the default ranges."""
    runner = {**SHAPE["runner"], "sandbox": {"uid_base": uid_base}}
    return demo_config(
        OVERLAY,
        {
            **SHAPE,
            "run": {"id": run_id, "dir": str(tmp_path / "runs")},
            "cell_agent": {"engine": {"sglang_python": str(sglang_python())}},
            "runner": runner,
            "evaluator": {"sandbox": {"uid_base": uid_base + 1000}},
        },
    )


def engine_urls(config: GyreConfig) -> list[str]:
    """The engines' URLs as the run resolved them (its config.yaml names every cell's engine port)."""
    resolved = load_config(config.run.path / "config.yaml")
    host = resolved.cell_agent.engine.host
    return [f"http://{host}:{port}" for port in resolved.cell_agent.engine_ports]


def model_info_version(url: str) -> str | None:
    try:
        with urllib.request.urlopen(f"{url}/get_model_info", timeout=10) as reply:
            version = json.load(reply).get("weight_version")
    except OSError:
        return None
    return None if version is None else str(version)


def wait_served(config: GyreConfig, version: str, timeout_s: float) -> list[str | None]:
    """Every server's weight version once all equal `version` (or as they are after `timeout_s`)."""
    urls = engine_urls(config)
    assert urls, "the run names no engine port"
    versions: list[str | None] = []

    def all_served() -> bool:
        versions[:] = [model_info_version(url) for url in urls]
        return versions == [version] * len(urls)

    with contextlib.suppress(AssertionError):  # timed out: the caller asserts on what they serve
        eventually_sync(
            all_served, timeout_s=timeout_s, interval_s=0.5, what=f"every SGLang to serve {version}"
        )
    return versions


def assert_nothing_left(config: GyreConfig) -> None:
    """The run is down: no SGLang process group its cells started, no engine port listening, no process
    that names the run's directory."""
    spawned = [
        line["pid"]
        for path in (config.run.path / "logs").glob("cell_agent-*.log")
        for line in map(json.loads, path.read_text().splitlines())
        if line.get("event") == "sglang_spawned"
    ]
    assert len(spawned) >= config.scheduler.num_cells, spawned
    for pgid in spawned:
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)
    for url in engine_urls(config):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=5):
            pass
    run_dir = str(config.run.path)
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if any(run_dir in arg for arg in p.info["cmdline"] or ()):
            left.append((p.info["pid"], p.info["cmdline"]))
    assert left == [], left
