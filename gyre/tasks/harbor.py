"""Harbor task directories (the format of Terminal-Bench 2 and of the SkyRL / miles / TRL
integrations), read as Harbor publishes it:

    <task>/instruction.md         the prompt
    <task>/task.toml              [agent] timeout_sec, [verifier] timeout_sec and env (and Gyre's
                                  same_container, agent_paths: services/evaluator/in_container.py), [environment]
                                  build_timeout_sec, docker_image, cpus, memory_mb, storage_mb, gpus,
                                  allow_internet; free [metadata] (and [task]); unknown keys are ignored,
                                  as Harbor ignores them, and `gyre tasks check` warns about them
    <task>/environment/           Dockerfile + build context: its WORKDIR is the working directory,
                                  what it COPYs there is the workspace (gyre/tasks/dockerfile.py); the
                                  Dockerfile is recorded as the image a cluster's container sandbox builds
    <task>/tests/test.sh          the verifier, run after any termination on the preserved workspace
    <task>/solution/              the reference solution: ignored for training

Inside the environment Harbor's paths are absolute: tests are at `/tests`, the script runs from the
working directory (e.g. `/app`) and writes its reward to `/logs/verifier/reward.txt` (a number) or
`/logs/verifier/reward.json` (named numbers; Gyre takes `reward`, or the only one); `reward.txt` is
read first; agents may log to `/logs/agent/`. How the local sandbox gives those paths (bind mounts
in a mount namespace, else the paths rewritten) is in gyre/sandbox/task_paths.py.

Timeouts: the harness gets [agent] timeout_sec (Harbor's default 600 s), one verifier attempt
[verifier] timeout_sec (600 s); the overall budget is the harness timeout plus two verifier timeouts,
so a crashed verifier is retried at least once before the execution is excluded.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gyre.tasks.dockerfile import DEFAULT_WORKDIR, read_dockerfile
from gyre.tasks.problems import Problems
from gyre.tasks.task import Task, TaskEnvironment, TaskError, Verifier, WorkspaceSource, check_relative

INSTRUCTION = "instruction.md"
TASK_TOML = "task.toml"
TEST_SCRIPT = Path("tests") / "test.sh"

#: Harbor's absolute paths inside an environment.
TESTS_DIR = "/tests"
VERIFIER_LOGS_DIR = "/logs/verifier"
AGENT_LOGS_DIR = "/logs/agent"
REWARD_TXT = "reward.txt"
REWARD_JSON = "reward.json"

DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
VERIFIER_ATTEMPTS_IN_BUDGET = 2

#: The keys of task.toml Gyre reads, per table: (type check, what it must be).
_POSITIVE = "a positive number of seconds"
_KNOWN: dict[str, dict[str, str]] = {
    "agent": {"timeout_sec": _POSITIVE},
    "verifier": {
        "timeout_sec": _POSITIVE,
        "env": "a table of strings",
        "same_container": "true or false",
        "agent_paths": "a non-empty list of relative paths",
    },
    "environment": {
        "build_timeout_sec": _POSITIVE,
        "docker_image": "a string",
        "cpus": "a positive integer",
        "memory_mb": "a positive integer",
        "storage_mb": "a positive integer",
        "gpus": "a non-negative integer",
        "allow_internet": "true or false",
    },
}
#: Keys Harbor defines that Gyre passes over without a warning.
_HARBOR_ONLY: dict[str, set[str]] = {
    "agent": {"user", "network_mode", "allowed_hosts"},
    "verifier": {"user", "network_mode", "allowed_hosts"},
    "environment": {
        "gpu_types",
        "network_mode",
        "allowed_hosts",
        "mcp_servers",
        "env",
        "skills_dir",
        "healthcheck",
        "memory",
        "storage",
    },
}
_TOP_LEVEL = {"version", "schema_version", "task", "metadata", "source", "solution", *_KNOWN}


def is_harbor_dir(path: Path) -> bool:
    return (path / TASK_TOML).is_file() or (path / INSTRUCTION).is_file()


def _valid(kind: str, value: Any) -> bool:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == _POSITIVE:
        return number and math.isfinite(value) and value > 0
    if kind == "a string":
        return isinstance(value, str) and bool(value)
    if kind == "a positive integer":
        return isinstance(value, int) and not isinstance(value, bool) and value > 0
    if kind == "a non-negative integer":
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if kind == "true or false":
        return isinstance(value, bool)
    if kind == "a non-empty list of relative paths":
        return (
            isinstance(value, list)
            and bool(value)
            and all(isinstance(v, str) and _relative(v) for v in value)
        )
    if kind == "a table of strings":
        return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
    raise AssertionError(kind)


def _relative(path: str) -> bool:
    try:
        return bool(path) and check_relative(path).as_posix() not in ("", ".")
    except ValueError:
        return False


def read_task_toml(path: Path, problems: Problems) -> dict[str, Any] | None:
    """The tables of `task.toml`, each key Gyre reads checked; None when it is not valid TOML."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        problems.error(path, f"cannot read: {e}")
        return None
    except tomllib.TOMLDecodeError as e:
        problems.error(path, f"not valid TOML: {e}")
        return None
    for key in sorted(set(data) - _TOP_LEVEL):
        problems.warn(path, f"{key}: not a key of Harbor's task.toml; ignored")
    for table in ("task", "metadata", "solution", *_KNOWN):
        if table in data and not isinstance(data[table], dict):
            problems.error(path, f"[{table}]: must be a table; got {data[table]!r}")
            data[table] = {}
    for table, keys in _KNOWN.items():
        values = data.get(table, {})
        for key, kind in keys.items():
            if key in values and not _valid(kind, values[key]):
                problems.error(path, f"[{table}] {key}: must be {kind}; got {values[key]!r}")
                del values[key]
        for key in sorted(set(values) - set(keys) - _HARBOR_ONLY[table]):
            problems.warn(path, f"[{table}] {key}: not a key Harbor or Gyre reads; ignored (a typo?)")
    return data


def load_harbor_task(task_dir: Path, task_id: str, problems: Problems) -> Task | None:
    """The task of a Harbor directory, or None with every defect appended to `problems`."""
    before = len(problems.errors)
    instruction = task_dir / INSTRUCTION
    prompt = ""
    if not instruction.is_file():
        problems.error(instruction, "missing: a Harbor task needs instruction.md (the prompt)")
    else:
        prompt = instruction.read_text(errors="replace")
        if not prompt.strip():
            problems.error(instruction, "empty: the prompt is the whole of instruction.md")
    test_script = task_dir / TEST_SCRIPT
    if not test_script.is_file():
        problems.error(test_script, "missing: a Harbor task needs tests/test.sh (the verifier)")
    config: dict[str, Any] | None = {}
    toml_path = task_dir / TASK_TOML
    if not toml_path.is_file():
        problems.error(toml_path, "missing: a Harbor task needs task.toml (timeouts, metadata)")
    else:
        config = read_task_toml(toml_path, problems)
    environment, workspace = _environment(task_dir, config or {}, problems)
    if len(problems.errors) > before or config is None:
        return None
    agent_s = float(config.get("agent", {}).get("timeout_sec", DEFAULT_AGENT_TIMEOUT_S))
    verifier_cfg = config.get("verifier", {})
    verifier_s = float(verifier_cfg.get("timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S))
    metadata = dict(config.get("metadata", {}))
    if "task" in config:
        metadata["task"] = config["task"]
    try:
        return Task(
            task_id=task_id,
            prompt=prompt,
            workspace=workspace,
            verifier=Verifier(
                argv=("bash", f"{TESTS_DIR}/test.sh"),
                timeout_s=verifier_s,
                env=MappingProxyType(dict(verifier_cfg.get("env", {}))),
                protocol="harbor",
                tests_dir=task_dir / "tests",
                same_container=bool(verifier_cfg.get("same_container", False)),
                agent_paths=tuple(verifier_cfg["agent_paths"]) if "agent_paths" in verifier_cfg else None,
            ),
            harness_timeout_s=agent_s,
            overall_budget_s=agent_s + VERIFIER_ATTEMPTS_IN_BUDGET * verifier_s,
            task_dir=task_dir,
            environment=environment,
            metadata=MappingProxyType(metadata),
            source="harbor",
        )
    except TaskError as e:
        problems.error(task_dir, str(e))
        return None


def _environment(
    task_dir: Path, config: dict[str, Any], problems: Problems
) -> tuple[TaskEnvironment, tuple[WorkspaceSource, ...]]:
    """The environment record and the workspace sources from `environment/` and [environment]."""
    table = config.get("environment", {})
    env_dir = task_dir / "environment"
    dockerfile = env_dir / "Dockerfile"
    workdir: str = DEFAULT_WORKDIR
    workspace: tuple[WorkspaceSource, ...] = ()
    if dockerfile.is_file():
        facts = read_dockerfile(dockerfile, problems)
        workdir = facts.workdir or DEFAULT_WORKDIR
        workspace = facts.workspace
        if workdir == "/":
            problems.error(
                dockerfile,
                "WORKDIR /: the workspace cannot be the root directory; set WORKDIR to a "
                "directory such as /app",
            )
    elif (env_dir / "docker-compose.yaml").is_file() or (env_dir / "docker-compose.yml").is_file():
        problems.warn(
            env_dir,
            "a docker-compose environment: its services are not started by the local sandbox; "
            f"the workspace is taken to be {DEFAULT_WORKDIR}",
        )
    elif "docker_image" in table:
        problems.warn(
            task_dir / TASK_TOML,
            f"[environment] docker_image without a Dockerfile: the workspace is taken "
            f"to be {DEFAULT_WORKDIR} and starts empty",
        )
    else:
        problems.warn(
            env_dir,
            "no environment/Dockerfile and no [environment] docker_image: a container sandbox has "
            f"no image; the local workspace at {DEFAULT_WORKDIR} starts empty",
        )
    record = TaskEnvironment(
        workdir=workdir if workdir != "/" else DEFAULT_WORKDIR,
        dockerfile=dockerfile if dockerfile.is_file() else None,
        docker_image=table.get("docker_image"),
        build_timeout_s=float(table["build_timeout_sec"]) if "build_timeout_sec" in table else None,
        cpus=table.get("cpus"),
        memory_mb=table.get("memory_mb"),
        storage_mb=table.get("storage_mb"),
        gpus=table.get("gpus"),
        allow_internet=table.get("allow_internet"),
    )
    return record, workspace
