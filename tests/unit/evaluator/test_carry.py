"""What the fresh verifier container gets of a preserved workspace when the task declares `agent_paths`:
those paths only, symlinks as symlinks, nothing read through a link (services/evaluator/in_container.py)."""

from __future__ import annotations

import os
from pathlib import Path

from services.evaluator.in_container import carry


def test_only_the_declared_paths_are_carried_and_no_link_is_followed(tmp_path: Path) -> None:
    ws, out, outside = tmp_path / "ws", tmp_path / "out", tmp_path / "outside"
    (ws / "src").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.py").write_text("KEY = 1\n")
    (ws / "calc.py").write_text("def add(a, b): return a + b\n")
    (ws / "src" / "m.py").write_text("x = 1\n")
    (ws / "conftest.py").write_text("import os; os._exit(0)\n")  # not the agent's declared work
    os.symlink(outside, ws / "lib")  # a directory link: lib/secret.py must not be read through it
    os.symlink("/etc/passwd", ws / "link.py")  # a declared path that is a link: carried as the link
    carry(ws, ("calc.py", "src", "lib/secret.py", "link.py", "gone.py"), out)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "calc.py",
        "link.py",
        "src",
        "src/m.py",
    ]
    assert (out / "link.py").is_symlink() and os.readlink(out / "link.py") == "/etc/passwd"
    assert (out / "calc.py").read_text() == "def add(a, b): return a + b\n"
