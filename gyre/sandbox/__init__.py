"""Sandboxes for harness executions and verifier runs (see `launcher.py` for what is enforced)."""

from gyre.sandbox.launcher import (
    LAUNCHERS,
    NetworkPolicy,
    SandboxError,
    SandboxHandle,
    SandboxLauncher,
    SandboxSpec,
    SandboxState,
    make_launcher,
)
from gyre.sandbox.limits import SandboxLimits
from gyre.sandbox.outcome import SandboxOutcome, read_outcome
from gyre.sandbox.uids import check_disjoint, uid_range

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
