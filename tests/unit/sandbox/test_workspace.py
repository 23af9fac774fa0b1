"""Workspaces: template materialization and the content hash that binds evaluations."""

from __future__ import annotations

import os
from pathlib import Path

from gyre.sandbox.workspace import content_hash, copy_workspace, create_workspace, preserve
from gyre.tasks import Task, WorkspaceSource


def test_workspace_holds_sources_in_order_then_files(tmp_path: Path) -> None:
    template = tmp_path / "template"
    (template / "src").mkdir(parents=True)
    (template / "src" / "a.py").write_text("A")
    (template / "src" / "keep.py").write_text("K")
    single = tmp_path / "calc.py"
    single.write_text("calc")
    task = Task(
        "s/t",
        "p",
        files={"src/a.py": "override", "b/c.txt": "C"},
        workspace=(
            WorkspaceSource(template),
            WorkspaceSource(single, "src"),
            WorkspaceSource(single, "lib/renamed.py"),
        ),
    )
    ws = create_workspace(task, tmp_path / "ws")
    assert (ws / "src" / "a.py").read_text() == "override" and (ws / "b" / "c.txt").read_text() == "C"
    assert (ws / "src" / "keep.py").read_text() == "K"
    assert (ws / "src" / "calc.py").read_text() == "calc"  # a file copied onto a directory goes into it
    assert (ws / "lib" / "renamed.py").read_text() == "calc"
    again = create_workspace(Task("s/t", "p"), tmp_path / "ws")
    assert list(again.iterdir()) == []


def test_content_hash_covers_paths_contents_and_links_not_dirs_or_modes(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "f").write_text("x")
    base = content_hash(ws)
    (ws / "empty_dir").mkdir()
    os.chmod(ws / "d" / "f", 0o600)
    assert content_hash(ws) == base
    (ws / "d" / "f").write_text("y")
    changed = content_hash(ws)
    assert changed != base
    (ws / "d" / "f").write_text("x")
    assert content_hash(ws) == base
    (ws / "d" / "f").rename(ws / "d" / "g")
    assert content_hash(ws) != base
    (ws / "d" / "g").rename(ws / "d" / "f")
    (ws / "link").symlink_to("/etc/passwd")
    with_link = content_hash(ws)
    assert with_link != base
    (ws / "link").unlink()
    (ws / "link").symlink_to("/etc/hosts")
    assert content_hash(ws) not in (base, with_link)


def test_copies_and_preservation_keep_the_hash(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_text("x")
    (ws / "l").symlink_to("f")
    copy_workspace(ws, tmp_path / "copy")
    assert content_hash(tmp_path / "copy") == content_hash(ws)
    preserve(ws)
    assert os.stat(ws / "f").st_uid == 0 and content_hash(ws) == content_hash(tmp_path / "copy")
