"""The red-team suite's reduced set, run as a user runs it (`gyre bench redteam --combined --json`,
bench/redteam.py): every attack class once per boundary launcher (`isolated`, `container`), hostile harnesses
against examples/tasks/fix-sum through the real runner and evaluator, NATS and Redis. Every hostile execution
scores its real work (0), the honest members score as the all-honest group does, the canary secret is in no
file the run kept, no service port answers from a sandbox, and nothing of the run is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.redteam import ATTACKS

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("container_session")]
REPO = Path(__file__).resolve().parents[2]


def test_every_attack_class_fails_in_each_boundary_launcher(tmp_path: Path) -> None:
    assert os.geteuid() == 0, "the isolated and container launchers need root (make test runs as root)"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from app.cli import main; main()",
            "bench",
            "redteam",
            "--json",
            "--combined",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for launcher in ("isolated", "container"):
        phase = out[launcher]
        assert set(phase["attacks"]) == set(ATTACKS), phase
        failed = {name: a["detail"] for name, a in phase["attacks"].items() if not a["blocked"]}
        assert not failed, (launcher, failed)
        assert phase["honest_unchanged"], phase
        # the evidence-keeping execution was scored (its workspace kept), not left without a reward
        assert phase["attacks"]["grader"]["reward"] == 0.0, phase["attacks"]["grader"]
    assert out["container"]["honest_baseline_reward"] == 1.0  # fix-sum's checker exists in its image only
    assert (out["hostile_reward_max"], out["credentials_read"], out["forbidden_connections_accepted"]) == (
        0,
        0,
        0,
    )
    assert out["left_running"] == 0 and out["ok"] is True, out
