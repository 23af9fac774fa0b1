"""The demo harness's tools, executed in its workspace (the current directory).

    bash        run a shell command (stdout+stderr, exit status; output truncated)
    write_file  write a text file (parents created); paths stay inside the workspace
    read_file   read a text file
    delegate    hand a sub-task to a sub-agent with its own system prompt and context (the agent
                loop implements it; `harness.agent.Agent`)

Schemas are short for the same reason as the prompts (harness/prompts.py). A tool failure is
returned to the model as an error result, never raised.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_OUTPUT_BYTES = 2000
BASH_TIMEOUT_S = 60.0


class ToolError(Exception):
    """A tool could not do what was asked; the message goes back to the model as an error result."""


@dataclass(frozen=True, slots=True)
class ToolResult:
    content: str
    is_error: bool = False


def _schema(**props: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {k: {"type": v} for k, v in props.items()},
        "required": list(props),
    }


#: Tool definitions as sent to the model (Anthropic `tools` format), in request order.
TOOL_SPECS: dict[str, dict[str, Any]] = {
    "bash": {
        "name": "bash",
        "description": "Run a shell command.",
        "input_schema": _schema(command="string"),
    },
    "write_file": {
        "name": "write_file",
        "description": "Write a file.",
        "input_schema": _schema(path="string", content="string"),
    },
    "read_file": {"name": "read_file", "description": "Read a file.", "input_schema": _schema(path="string")},
    "delegate": {
        "name": "delegate",
        "description": "Give a sub-task to a sub-agent.",
        "input_schema": _schema(task="string"),
    },
}

#: Tools the main agent gets by default; sub-agents get the same minus `delegate`.
DEFAULT_TOOLS: tuple[str, ...] = ("write_file", "read_file", "bash", "delegate")


def tool_specs(names: Sequence[str]) -> list[dict[str, Any]]:
    unknown = [n for n in names if n not in TOOL_SPECS]
    if unknown:
        raise ValueError(f"unknown tools {unknown}; choose from {sorted(TOOL_SPECS)}")
    return [TOOL_SPECS[n] for n in names]


def _truncate(text: str) -> str:
    data = text.encode("utf-8", errors="replace")
    if len(data) <= MAX_OUTPUT_BYTES:
        return text
    return data[:MAX_OUTPUT_BYTES].decode("utf-8", errors="ignore") + "\n[truncated]"


def _inside(workspace: Path, raw: object) -> Path:
    if not isinstance(raw, str) or not raw:
        raise ToolError("path must be a non-empty string")
    path = (workspace / raw).resolve()
    if path != workspace and workspace not in path.parents:
        raise ToolError(f"path {raw!r} is outside the workspace")
    return path


def _string(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise ToolError(f"argument {key!r} must be a string")
    return value


def run_bash(workspace: Path, args: dict[str, Any]) -> ToolResult:
    command = _string(args, "command")
    try:
        done = subprocess.run(
            ["bash", "-c", command], cwd=workspace, capture_output=True, timeout=BASH_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return ToolResult(f"timed out after {BASH_TIMEOUT_S:.0f} s", is_error=True)
    output = (done.stdout + done.stderr).decode("utf-8", errors="replace")
    return ToolResult(_truncate(f"exit {done.returncode}\n{output}"), is_error=done.returncode != 0)


def write_file(workspace: Path, args: dict[str, Any]) -> ToolResult:
    path = _inside(workspace, args.get("path"))
    content = _string(args, "content")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    return ToolResult("ok")


def read_file(workspace: Path, args: dict[str, Any]) -> ToolResult:
    path = _inside(workspace, args.get("path"))
    if not path.is_file():
        raise ToolError(f"no file {args.get('path')!r}")
    return ToolResult(_truncate(path.read_text(errors="replace")))


#: Executors of the workspace tools (`delegate` is handled by the agent loop).
EXECUTORS: dict[str, Callable[[Path, dict[str, Any]], ToolResult]] = {
    "bash": run_bash,
    "write_file": write_file,
    "read_file": read_file,
}


def execute(workspace: Path, name: str, args: object) -> ToolResult:
    """Run a workspace tool; every failure becomes an error result for the model."""
    executor = EXECUTORS.get(name)
    if executor is None:
        return ToolResult(f"unknown tool {name!r}", is_error=True)
    if not isinstance(args, dict):
        return ToolResult("tool input must be an object", is_error=True)
    try:
        return executor(workspace, args)
    except ToolError as e:
        return ToolResult(str(e), is_error=True)
    except OSError as e:
        return ToolResult(f"{type(e).__name__}: {e}", is_error=True)
