"""Sandboxes for harness executions and verifier runs (see `launcher.py` for what is enforced)."""

from services.runner.sandbox.launcher import (
    LAUNCHERS,
    NetworkPolicy,
    SandboxError,
    SandboxHandle,
    SandboxLauncher,
    SandboxSpec,
    SandboxState,
    make_launcher,
)
from services.runner.sandbox.limits import SandboxLimits
from services.runner.sandbox.outcome import SandboxOutcome, read_outcome
from services.runner.sandbox.uids import check_disjoint, uid_range

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
