"""Copy-out of a container's directory is bounded (issue 38, "the policy is an adversary"): the harness
can fill its workspace with gigabytes or millions of small files, and the runner takes at most
`runner.sandbox.copy_out_max_bytes` bytes and `copy_out_max_files` entries of it. Past either cap the copy
stops before writing past it, removes what it copied and raises `CopyOutLimit` with one line naming the
cap and the counts. No container needed: /proc/<pid>/root of this process is the host root, the same
walk a container's directory gets."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pytest

from gyre.config.runner import RunnerSandboxSection
from gyre.sandbox.containers import processes
from gyre.sandbox.launchers.base import CopyBudget, CopyOutLimit, SandboxError
from gyre.sandbox.workspace import content_hash


def _tree(root: Path) -> Path:
    """3 regular files of 1000 bytes, 1 directory, 1 symlink out of the tree: 5 entries, 3000 + 4 bytes."""
    (root / "sub").mkdir(parents=True)
    (root / "a").write_bytes(b"a" * 1000)
    (root / "b").write_bytes(b"b" * 1000)
    (root / "sub" / "c").write_bytes(b"c" * 1000)
    (root / "etc").symlink_to("/etc")
    return root


def test_under_the_caps_everything_is_copied_and_counted(tmp_path: Path) -> None:
    inside = _tree(tmp_path / "app")
    out = tmp_path / "out"
    budget = CopyBudget(max_bytes=3004, max_files=5)  # exactly what the tree holds
    assert processes.copy_out(os.getpid(), str(inside), out, budget=budget)
    assert content_hash(out) == content_hash(inside)
    assert (out / "etc").is_symlink() and os.readlink(out / "etc") == "/etc"  # a link, never followed
    assert (budget.bytes, budget.files) == (3004, 5)


def test_past_the_byte_cap_the_copy_stops_and_nothing_is_left(tmp_path: Path) -> None:
    inside = _tree(tmp_path / "app")
    out = tmp_path / "out"
    budget = CopyBudget(max_bytes=2500, max_files=100)
    with pytest.raises(CopyOutLimit) as info:
        processes.copy_out(os.getpid(), str(inside), out, budget=budget)
    message = str(info.value)
    assert "\n" not in message
    assert "byte cap" in message and "more than 2500 bytes" in message
    assert "copy_out_max_bytes" in message and re.search(r"stopped after \d+ bytes, \d+ files", message)
    assert budget.bytes <= 2500
    assert not out.exists()


def test_a_file_past_the_byte_cap_is_not_begun(tmp_path: Path) -> None:
    inside = tmp_path / "app"
    inside.mkdir()
    (inside / "big").write_bytes(b"x" * 10_000)
    budget = CopyBudget(max_bytes=4096, max_files=100)
    with pytest.raises(CopyOutLimit, match=r"more than 4096 bytes .*stopped after 0 bytes, 1 files"):
        processes.copy_out(os.getpid(), str(inside), tmp_path / "out", budget=budget)
    assert budget.bytes == 0 and not (tmp_path / "out").exists()


def test_a_file_that_grows_past_its_size_stops_at_the_cap() -> None:
    """The size checked before a file is begun can be stale: each chunk is counted before it is written."""
    budget = CopyBudget(max_bytes=10, max_files=1)
    written = io.BytesIO()
    with pytest.raises(CopyOutLimit, match="byte cap"):
        processes._copy_bytes(io.BytesIO(b"y" * 25), written, budget, chunk=4)
    assert len(written.getvalue()) <= 10 and budget.bytes == len(written.getvalue())


def test_past_the_file_cap_the_copy_stops_and_nothing_is_left(tmp_path: Path) -> None:
    inside = tmp_path / "app"
    inside.mkdir()
    for i in range(50):
        (inside / f"f{i}").touch()
    out = tmp_path / "out"
    budget = CopyBudget(max_bytes=1 << 20, max_files=10)
    with pytest.raises(CopyOutLimit) as info:
        processes.copy_out(os.getpid(), str(inside), out, budget=budget)
    message = str(info.value)
    assert "file cap" in message and "more than 10 files" in message and "copy_out_max_files" in message
    assert "stopped after 10 files, 0 bytes" in message
    assert not out.exists()


def test_symlinks_and_directories_count_as_files(tmp_path: Path) -> None:
    inside = tmp_path / "app"
    (inside / "d1" / "d2").mkdir(parents=True)
    for i in range(3):
        (inside / f"l{i}").symlink_to(f"/nowhere/{i}")
    with pytest.raises(CopyOutLimit, match="more than 4 files"):  # 2 directories + 3 links
        processes.copy_out(os.getpid(), str(inside), tmp_path / "out", budget=CopyBudget(1 << 20, 4))
    assert not (tmp_path / "out").exists()
    assert processes.copy_out(os.getpid(), str(inside), tmp_path / "out", budget=CopyBudget(1 << 20, 5))


def test_one_budget_bounds_every_copy_it_is_passed_to(tmp_path: Path) -> None:
    """The runner's workspace and agent logs share one budget: the second copy fails where the sum passes."""
    inside = _tree(tmp_path / "app")
    budget = CopyBudget(max_bytes=5000, max_files=100)
    assert processes.copy_out(os.getpid(), str(inside), tmp_path / "first", budget=budget)
    with pytest.raises(CopyOutLimit):
        processes.copy_out(os.getpid(), str(inside), tmp_path / "second", budget=budget)
    assert (tmp_path / "first").is_dir() and not (tmp_path / "second").exists()


def test_without_a_budget_the_copy_is_unbounded(tmp_path: Path) -> None:
    inside = _tree(tmp_path / "app")
    assert processes.copy_out(os.getpid(), str(inside), tmp_path / "out")
    assert content_hash(tmp_path / "out") == content_hash(inside)


def test_the_limit_is_a_sandbox_error_and_the_caps_are_positive() -> None:
    assert issubclass(CopyOutLimit, SandboxError)  # the runner's existing handlers see it
    with pytest.raises(ValueError, match="at least 1"):
        CopyBudget(0, 10)
    with pytest.raises(ValueError, match="at least 1"):
        CopyBudget(10, -1)


def test_the_caps_are_runner_sandbox_settings() -> None:
    section = RunnerSandboxSection()
    assert (section.copy_out_max_bytes, section.copy_out_max_files) == (1 << 30, 100_000)
    assert RunnerSandboxSection(copy_out_max_bytes=5, copy_out_max_files=7).copy_out_max_files == 7
    for field in ("copy_out_max_bytes", "copy_out_max_files"):
        with pytest.raises(ValueError, match="at least 1"):
            RunnerSandboxSection.model_validate({field: 0})
