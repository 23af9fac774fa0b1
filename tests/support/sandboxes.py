"""Launchers for tests: any registered launcher by name, over a uid range of the test's own."""

from __future__ import annotations

import os
import uuid

import pytest

from gyre.sandbox import LauncherSpec, SandboxError, SandboxLauncher, launcher_class
from gyre.sandbox.launchers.base import LABEL_RUN


def unavailable(reason: str) -> None:
    """A dependency of the test is missing: a failure under CI (`CI` set), a skip with the reason elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def launcher_for_test(
    name: str, uid_base: int, num_slots: int = 2, labels: dict[str, str] | None = None
) -> SandboxLauncher:
    """The launcher `name` with `num_slots` slots (uids from `uid_base` when it uses uids; `labels` on
    what it keeps, by default those of a fresh run)."""
    cls = launcher_class(name)
    uids = range(uid_base, uid_base + num_slots) if cls.uses_uids else None
    labels = labels or {LABEL_RUN: f"t{uuid.uuid4().hex[:12]}"}
    try:
        launcher = cls.create(LauncherSpec(num_slots=num_slots, uids=uids, labels=labels))
        if launcher.own_filesystem:
            from tests.support.containers import engine_client

            engine_client()
        return launcher
    except SandboxError as e:
        unavailable(f"the {name} launcher cannot run here: {e}")
        raise
