"""Workspace tools and the tool-latency knob."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from harness.latency import ToolLatency
from harness.tools import DEFAULT_TOOLS, execute, tool_specs


def test_tools_act_inside_the_workspace_only(tmp_path: Path) -> None:
    assert execute(tmp_path, "write_file", {"path": "d/x.txt", "content": "hi"}).content == "ok"
    assert execute(tmp_path, "read_file", {"path": "d/x.txt"}).content == "hi"
    for path in ("../escape.txt", "/etc/passwd"):
        result = execute(tmp_path, "write_file", {"path": path, "content": "x"})
        assert result.is_error and "outside the workspace" in result.content
    assert not (tmp_path.parent / "escape.txt").exists()
    bash = execute(tmp_path, "bash", {"command": "cat d/x.txt; exit 3"})
    assert bash.is_error and bash.content.startswith("exit 3") and "hi" in bash.content
    assert execute(tmp_path, "read_file", {"path": "missing"}).is_error
    assert execute(tmp_path, "write_file", {"path": "y", "content": 5}).is_error
    assert execute(tmp_path, "nope", {}).is_error


def test_tool_specs_are_short_and_known() -> None:
    specs = tool_specs(DEFAULT_TOOLS)
    assert [s["name"] for s in specs] == list(DEFAULT_TOOLS)
    with pytest.raises(ValueError, match="unknown tools"):
        tool_specs(["write_file", "browse"])


def test_tool_latency_is_seeded_heavy_tailed_and_capped() -> None:
    slept: list[float] = []
    a = ToolLatency(median_s=1.0, alpha=1.2, max_s=50.0, seed=3, sleep=slept.append)
    draws = [a.sleep() for _ in range(2000)]
    b = ToolLatency(median_s=1.0, alpha=1.2, max_s=50.0, seed=3)
    assert draws == [b.draw() for _ in range(2000)] == slept
    assert 0.8 < statistics.median(draws) < 1.25
    assert max(draws) == 50.0 and statistics.mean(draws) > statistics.median(draws)
    assert ToolLatency().sleep() == 0.0
