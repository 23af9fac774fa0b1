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
    make_launcher,
    read_outcome,
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
    "make_launcher",
    "read_outcome",
]
