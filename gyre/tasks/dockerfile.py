"""What a Harbor task's `environment/Dockerfile` says about its workspace, read without building it.

The `container` launcher builds the Dockerfile with the engine (gyre/sandbox/containers/images.py)
and runs the task in that image. The host launchers (`isolated`, `process`) reproduce the one part of
the image a task's files define: the working directory (the final stage's `WORKDIR`) and the files
`COPY`/`ADD` put under it from the build context (`environment/`). Everything else (`RUN` steps, copies
to other places, `COPY --from`, remote `ADD`) needs the image: `gyre tasks check` reports it as a
warning for runs on the host launchers.

    facts = read_dockerfile(task_dir / "environment" / "Dockerfile", problems)
    facts.workdir          # "/app"
    facts.workspace        # (WorkspaceSource(environment/calc.py, "calc.py"), ...)
"""

from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from gyre.tasks.problems import Problems
from gyre.tasks.task import WorkspaceSource

#: Where the workspace lies when neither a WORKDIR nor anything else says (Harbor's common choice).
DEFAULT_WORKDIR = "/app"
_ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


@dataclass(slots=True)
class DockerfileFacts:
    base_image: str | None = None
    """The final stage's FROM."""
    workdir: str | None = None
    """The final stage's working directory (`DEFAULT_WORKDIR` when it sets none)."""
    workspace: tuple[WorkspaceSource, ...] = ()
    """What COPY/ADD put under `workdir`, in order, workspace-relative."""
    num_run_steps: int = 0
    copies: list[tuple[Path, str, int]] = field(default_factory=list)
    """Every local copy of the final stage: (source on the host, absolute destination, line)."""


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(line, INSTRUCTION, arguments), continuation lines joined, comments and blanks skipped."""
    out: list[tuple[int, str, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((start, word.upper(), rest.strip()))
    if pending.strip():
        word, _, rest = pending.strip().partition(" ")
        out.append((start, word.upper(), rest.strip()))
    return out


def _copy_args(args: str) -> tuple[dict[str, str], list[str]]:
    """(--flags, [sources..., destination]) in either the shell or the JSON form."""
    flags: dict[str, str] = {}
    rest = args.strip()
    while rest.startswith("--"):
        token, _, rest = rest.partition(" ")
        name, _, value = token[2:].partition("=")
        flags[name] = value
        rest = rest.strip()
    if rest.startswith("["):
        try:
            parsed = json.loads(rest)
        except ValueError:
            parsed = None
        if isinstance(parsed, list) and all(isinstance(p, str) for p in parsed):
            return flags, parsed
    try:
        return flags, shlex.split(rest)
    except ValueError:
        return flags, rest.split()


def _sources(context: Path, pattern: str) -> list[Path]:
    rel = pattern.lstrip("/") or "."
    if ".." in Path(rel).parts:
        return []
    if any(c in rel for c in "*?["):
        return sorted(context.glob(rel))
    path = context / rel
    return [path] if path.exists() else []


def read_dockerfile(path: Path, problems: Problems) -> DockerfileFacts:
    """Read `path` (its build context is its directory); defects and what a local sandbox cannot
    reproduce go to `problems`, each naming the file and line."""
    facts = DockerfileFacts()
    try:
        text = path.read_text()
    except OSError as e:
        problems.error(path, f"cannot read: {e}")
        return facts
    workdir = "/"
    for line, word, args in instructions(text):
        where = f"line {line}: {word}"
        if word == "FROM":
            parts = args.split()
            facts.base_image = parts[0] if parts else None
            workdir, facts.workdir, facts.copies, facts.num_run_steps = "/", None, [], 0
        elif word == "WORKDIR":
            if "$" in args:
                problems.warn(path, f"{where} {args}: variables are not expanded here; taken literally")
            workdir = posixpath.normpath(posixpath.join(workdir, args.strip().strip('"')))
            facts.workdir = workdir
        elif word == "RUN":
            facts.num_run_steps += 1
        elif word in ("COPY", "ADD"):
            facts.copies += _copies(path, line, word, args, workdir, problems)
    if facts.num_run_steps:
        problems.warn(
            path,
            f"{facts.num_run_steps} RUN step(s): applied only in the task's image (sandbox.isolation: "
            "container); on the host launchers what they install must be on the host",
        )
    if facts.workdir is None:
        facts.workdir = DEFAULT_WORKDIR
        problems.warn(
            path, f"no WORKDIR: the workspace is taken to be {DEFAULT_WORKDIR} (set WORKDIR to say where)"
        )
    facts.workspace = _workspace(path, facts.copies, facts.workdir, problems)
    return facts


def _copies(
    path: Path, line: int, word: str, args: str, workdir: str, problems: Problems
) -> list[tuple[Path, str, int]]:
    """What one COPY or ADD copies from the build context: (source, absolute target, line) per file or
    directory it names; what the local workspace cannot reproduce goes to `problems`."""
    where = f"line {line}: {word}"
    flags, words = _copy_args(args)
    if "from" in flags:
        problems.warn(
            path,
            f"{where} --from={flags['from']}: copies from another stage or image need the "
            "image build; not reproduced in the local workspace",
        )
        return []
    if len(words) < 2:
        problems.error(path, f"{where}: needs a source and a destination")
        return []
    *patterns, dest = words
    dest_abs = posixpath.normpath(posixpath.join(workdir, dest))
    is_dir_dest = dest.endswith("/") or len(patterns) > 1 or any(c in p for p in patterns for c in "*?[")
    copies = []
    for pattern in patterns:
        if word == "ADD" and ("://" in pattern or pattern.startswith("git@")):
            problems.warn(path, f"{where} {pattern}: remote sources need the image build; not reproduced")
            continue
        found = _sources(path.parent, pattern)
        if not found:
            problems.error(path, f"{where} {pattern}: no such file in the build context {path.parent}")
            continue
        for source in found:
            if word == "ADD" and source.name.endswith(_ARCHIVES):
                problems.warn(
                    path,
                    f"{where} {pattern}: ADD extracts archives in an image build; the local "
                    "workspace gets the archive as it is",
                )
            target = posixpath.join(dest_abs, source.name) if is_dir_dest and source.is_file() else dest_abs
            copies.append((source, target, line))
    return copies


def _workspace(
    path: Path, copies: list[tuple[Path, str, int]], root: str, problems: Problems
) -> tuple[WorkspaceSource, ...]:
    """The copies that land in the working directory `root`, as the workspace's sources; the others are
    named in one warning."""
    workspace: list[WorkspaceSource] = []
    elsewhere: list[str] = []
    for source, target, line in copies:
        if target == root or target.startswith(root + "/"):
            workspace.append(
                WorkspaceSource(source, posixpath.relpath(target, root) if target != root else "")
            )
        else:
            elsewhere.append(f"line {line} → {target}")
    if elsewhere:
        problems.warn(
            path,
            "copies outside the working directory are not reproduced in the local workspace: "
            + ", ".join(elsewhere),
        )
    return tuple(workspace)
