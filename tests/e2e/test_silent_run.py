"""No silent runs: a `gyre demo` whose every model call is refused says so and exits non-zero.

The model is a random byte-tokenizer Llama with a 64-token context, so the demo harness's first prompt
(system prompt + task, hundreds of bytes) is refused by the proxy with `prompt is too long` on every
call. The run still completes its one step (every member valid but empty), and then: summary.json counts
the refusals by reason and the executions without a target token, the end of the run prints a warning
on stderr, and the exit status is 3 (TRAINED_NOTHING_EXIT).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli.demo import TRAINED_NOTHING_EXIT
from tests.support.models import byte_dir

pytestmark = pytest.mark.slow

GYRE = [sys.executable, "-c", "from app.cli import main; main()"]
REFUSED = """
model: {{path: "{model}"}}
scheduler: {{num_cells: 2, group_size: 2, batch_groups: 1, phi: 0, mu: 1, rho_min: 1.0, tau_s: 0.2,
            cell_capacity: 4, max_steps: 1}}
tasks: {{queries: ["add/3+3"], held_out: ["add/2+2"], held_out_samples: 1}}
"""


def test_a_run_whose_model_calls_are_all_refused_reports_them_and_exits_non_zero(tmp_path: Path) -> None:
    config = tmp_path / "refused.yaml"
    config.write_text(REFUSED.format(model=byte_dir(seed=0, context=64)))
    out = subprocess.run(
        [*GYRE, "demo", "--config", str(config), "--run-id", "refused", "--steps", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": os.getcwd(), "GYRE_RUN__DIR": str(tmp_path / "runs")},
    )
    assert out.returncode == TRAINED_NOTHING_EXIT, out.stdout[-2000:] + out.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "refused" / "summary.json").read_text())
    assert json.loads(out.stdout) == summary  # the whole stdout: progress goes to stderr under --json
    assert summary["steps"] == 1 and summary["target_tokens_by_step"] == [0]
    assert summary["refused_calls"].get("prompt_too_long", 0) >= 2, summary["refused_calls"]
    assert set(summary["refused_calls"]) == {"prompt_too_long"}
    assert "prompt is too long" in summary["refusal_messages"]["prompt_too_long"]
    assert summary["executions_consumed"] == 2
    assert summary["executions_without_targets"] == summary["executions_consumed"]
    # the held-out pool is scored at steps 0 and 1; a 64-token context cannot hold its prompt either
    assert [e["step"] for e in summary["eval_by_step"]] == [0, 1] and summary["held_out"] == ["add/2+2"]
    assert "WARNING" in out.stderr and "no optimizer step trained a token" in out.stderr
    assert "prompt_too_long" in out.stderr and "2 of 2 consumed executions (100%)" in out.stderr
