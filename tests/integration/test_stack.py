"""`gyre up --detach` / `gyre status` / `gyre down` as a user runs them: real processes, real ports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from app.demo.config import embedded_model_path
from app.stack.launcher import pid_alive

GYRE = [sys.executable, "-c", "from app.cli import main; main()"]


def _gyre(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GYRE, *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


def _listeners(pids: set[int]) -> list[str]:
    """Local addresses of TCP listeners owned by `pids` (from `ss -ltnp`)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        if any(f"pid={pid}," in line for pid in pids):
            found.append(line.split()[3])
    return found


def test_up_status_down(tmp_path: Path) -> None:
    # No model.path: `gyre up` serves the embedded default's model, as README's `gyre up --detach` does on a
    # fresh clone (the config only keeps the run under tmp_path).
    config = tmp_path / "gyre.yaml"
    config.write_text(f"run:\n  id: stacktest\n  dir: {tmp_path / 'runs'}\nscheduler:\n  num_cells: 3\n")
    up = _gyre("up", "--detach", "--wait", "60", config=config)
    assert up.returncode == 0, up.stderr
    resolved = yaml.safe_load((tmp_path / "runs" / "stacktest" / "config.yaml").read_text())
    assert Path(resolved["model"]["path"]) == embedded_model_path()
    try:
        st = _gyre("status", "--json", config=config)
        rows = json.loads(st.stdout)
        services = {r["name"]: r for r in rows if r["grpc_port"]}
        assert set(services) == {
            "scheduler",
            "proxy",
            "runner",
            "evaluator",
            "packer",
            "cell_agent-0",
            "cell_agent-1",
            "cell_agent-2",
        }
        assert all(r["health"] == "SERVING" for r in services.values())
        assert rows[0]["name"] == "supervisor" and rows[0]["health"] == "SERVING"
        text = _gyre("status", config=config).stdout
        # (The run starts with the stack: executions may have made calls already.)
        proxy_line = (
            r"proxy +requests \d+  recorded calls \d+  side calls \d+  history mismatches \d+ \(\d+\.\d%\)"
        )
        assert re.search(proxy_line, text), text
        assert all(r["restarts"] == 0 and r["last_exit"] == "" for r in rows)
        creds = tmp_path / "runs" / "stacktest" / "credentials"
        assert all(oct(f.stat().st_mode & 0o777) == "0o600" for f in creds.rglob("*.json"))
        pids = {int(r["pid"]) for r in rows}
        listeners = _listeners(pids)
        assert listeners, "expected our processes to listen somewhere"
        bad = [
            a for a in listeners if not (a.startswith("127.0.0.1:") or a.startswith("[::ffff:127.0.0.1]:"))
        ]
        assert bad == [], f"listeners outside loopback: {bad}"
    finally:
        down = _gyre("down", config=config)
    assert down.returncode == 0, down.stderr
    assert not any(pid_alive(p) for p in pids)
    assert _listeners(pids) == []
    assert _gyre("status", config=config).returncode == 1


def test_config_show_names_the_bad_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("scheduler:\n  rho_min: 1.5\n")
    result = subprocess.run(
        [*GYRE, "config", "show", "--file", str(bad)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert result.returncode == 2
    assert "scheduler.rho_min" in result.stderr and "(0, 1]" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    good = subprocess.run(
        [*GYRE, "config", "show"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd(), "GYRE_SCHEDULER__PHI": "1.5"},
    )
    assert good.returncode == 0 and "phi: 1.5" in good.stdout
