"""`gyre bench gpu` on a machine without CUDA prints `{"cuda": false, ...}` as its last line and exits 0
(the GPU check itself needs a GPU: README "Installing on a GPU cluster"); its run on a GPU is
documented, not faked, here. CUDA is hidden from the subprocess so the test means the same anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from typer.testing import CliRunner

from app.cli import app


def test_without_cuda_it_prints_cuda_false_and_exits_0() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "from app.cli import main; main()", "bench", "gpu", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["cuda"] is False and "nothing ran" in report["reason"]
    assert report["torch"]
    assert "gpu" in CliRunner().invoke(app, ["bench", "--list"]).output.split()
