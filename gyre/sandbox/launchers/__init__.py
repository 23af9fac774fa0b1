"""Sandbox launchers, by name (the config field `<service>.sandbox.isolation`).

    launcher = make_launcher("isolated", LauncherSpec(num_slots=32, uids=range(120000, 120032)))
    launcher_class("auto")        # IsolatedLauncher as root, ProcessLauncher otherwise

The registry maps a name to a loader of its class, so a launcher's own dependencies load only when a
service builds that launcher. Its names are `LAUNCHER_NAMES` of gyre/config/runner.py, which the config
checks `isolation` against without importing the sandbox (the launchers import that config). See `base.py`
for the interface and how to add a launcher; tests/unit/sandbox/test_sandbox_contract.py runs the contract
for every name here and keeps the two lists equal.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from gyre.config.runner import AUTO_LAUNCHER
from gyre.sandbox.launchers.base import (
    EnvironmentUnavailableError,
    ExecResult,
    LauncherSpec,
    NetworkPolicy,
    SandboxError,
    SandboxHandle,
    SandboxImage,
    SandboxLauncher,
    SandboxSpec,
    SandboxState,
)


def _process() -> type[SandboxLauncher]:
    from gyre.sandbox.launchers.process import ProcessLauncher

    return ProcessLauncher


def _isolated() -> type[SandboxLauncher]:
    from gyre.sandbox.launchers.isolated import IsolatedLauncher

    return IsolatedLauncher


def _container() -> type[SandboxLauncher]:
    from gyre.sandbox.launchers.container import ContainerLauncher

    return ContainerLauncher


LAUNCHERS: dict[str, Callable[[], type[SandboxLauncher]]] = {
    "process": _process,
    "isolated": _isolated,
    "container": _container,
}
"""name → a function returning the launcher class (importing its module on first use); the names are
`LAUNCHER_NAMES` (gyre/config/runner.py)."""


def launcher_names() -> list[str]:
    """What `sandbox.isolation` accepts: `auto` and every registered launcher."""
    return [AUTO_LAUNCHER, *LAUNCHERS]


def launcher_class(name: str) -> type[SandboxLauncher]:
    """The launcher class registered as `name` (`auto` resolved for this process)."""
    if name == AUTO_LAUNCHER:
        name = "isolated" if os.geteuid() == 0 else "process"
    try:
        load = LAUNCHERS[name]
    except KeyError:
        raise ValueError(
            f"unknown sandbox isolation {name!r}; choose {', '.join(launcher_names())}"
        ) from None
    return load()


def make_launcher(name: str, spec: LauncherSpec | None = None) -> SandboxLauncher:
    """The launcher `name` built from `spec` (defaults: one slot, no uids)."""
    return launcher_class(name).create(spec or LauncherSpec())


__all__ = [
    "AUTO_LAUNCHER",
    "LAUNCHERS",
    "EnvironmentUnavailableError",
    "ExecResult",
    "LauncherSpec",
    "NetworkPolicy",
    "SandboxError",
    "SandboxHandle",
    "SandboxImage",
    "SandboxLauncher",
    "SandboxSpec",
    "SandboxState",
    "launcher_class",
    "launcher_names",
    "make_launcher",
]
