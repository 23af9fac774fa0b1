"""Sandboxes for harness executions and verifier runs (see `launcher.py` for what is enforced)."""

from services.runner.sandbox.launcher import (
    LAUNCHERS,
    NetworkPolicy,
    SandboxError,
    SandboxHandle,
    SandboxLauncher,
    SandboxOutcome,
    SandboxSpec,
    SandboxState,
    check_disjoint,
    make_launcher,
    read_outcome,
    uid_range,
)
from services.runner.sandbox.limits import SandboxLimits

__all__ = [
    "LAUNCHERS",
    "NetworkPolicy",
    "SandboxError",
    "SandboxHandle",
    "SandboxLauncher",
    "SandboxLimits",
    "SandboxOutcome",
    "SandboxSpec",
    "SandboxState",
    "check_disjoint",
    "make_launcher",
    "read_outcome",
    "uid_range",
]
