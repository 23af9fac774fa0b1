"""Sandboxes for harness executions and verifier runs (see `launchers/` for the launchers and what each
enforces)."""

from gyre.sandbox.launchers import (
    LAUNCHERS,
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
    launcher_class,
    make_launcher,
)
from gyre.sandbox.limits import SandboxLimits
from gyre.sandbox.outcome import SandboxOutcome, read_outcome
from gyre.sandbox.uids import check_disjoint, uid_range

__all__ = [
    "LAUNCHERS",
    "EnvironmentUnavailableError",
    "ExecResult",
    "LauncherSpec",
    "NetworkPolicy",
    "SandboxError",
    "SandboxHandle",
    "SandboxImage",
    "SandboxLauncher",
    "SandboxLimits",
    "SandboxOutcome",
    "SandboxSpec",
    "SandboxState",
    "check_disjoint",
    "launcher_class",
    "make_launcher",
    "read_outcome",
    "uid_range",
]
