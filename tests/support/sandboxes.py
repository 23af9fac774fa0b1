"""Launchers for tests: any registered launcher by name, over a uid range of the test's own; and what the
deployment benches' sandbox check must show."""

from __future__ import annotations

import os
import uuid
from typing import Any

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


def assert_sandboxes_checked(checked: dict[str, Any]) -> None:
    """A deployment bench's `sandbox_check` (bench/_sandbox_check.py): a sandbox of the runner and one of
    the evaluator, each in its own container or pod, read none of the
    container's keys, passwords or processes' environments and reached no server (the runner's reached the
    proxy through its relay); the same attempt under the `process` launcher, in the runner's container,
    read the runner's key: the check can fail."""
    for service in ("runner", "evaluator"):
        seen = checked[service]
        assert seen["launcher"] == "isolated" and seen["sandbox_uid"] != 0, seen
        assert seen["files_tried"] > 3 and seen["connections_tried"] >= 10, seen
        assert seen["credentials_read"] == [] and seen["connections_accepted"] == [], seen
    assert checked["runner"]["proxy_reached"] is True, checked["runner"]
    control = checked["control_process"]
    assert "/etc/gyre/tls/runner/tls.key" in control["credentials_read"], control
    assert control["connections_accepted"], control
    assert checked["ok"] is True, checked
