"""gyre/durable.py: a file written once stays as it was; a replaced file holds the new bytes; a directory is
replaced whole or not at all; none leaves a temporary file behind, even when the write fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre.durable import replace_durable, replacing_dir, write_durable


def test_a_file_written_once_is_not_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "a" / "tree.bin"
    assert write_durable(path, b"first") is True
    assert write_durable(path, b"second") is False
    assert path.read_bytes() == b"first" and [p.name for p in path.parent.iterdir()] == ["tree.bin"]


def test_a_replaced_file_holds_the_new_bytes(tmp_path: Path) -> None:
    path = tmp_path / "step.json.gz"
    replace_durable(path, b"old")
    replace_durable(path, b"new")
    assert path.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["step.json.gz"]


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        replace_durable(tmp_path / "x", "not bytes")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_directory_is_replaced_whole_or_not_at_all(tmp_path: Path) -> None:
    out = tmp_path / "published"
    with replacing_dir(out) as tmp:
        (tmp / "weights").write_bytes(b"v1")
        (tmp / "weights").chmod(0o600)
    with pytest.raises(RuntimeError), replacing_dir(out) as tmp:
        (tmp / "weights").write_bytes(b"v2, half written")
        raise RuntimeError("the writer failed")
    assert (out / "weights").read_bytes() == b"v1" and (out / "weights").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["published"]
