"""The NATS permission table matches what the services do: their durables, and every event has a publisher."""

from __future__ import annotations

import pytest

from gyre.bus.permissions import BUS_USERS, inbox_prefix, permissions
from gyre.bus.subjects import ROUTES, subject_for
from gyre.v1 import events_pb2 as ev
from services.evaluator.service import TERMINATED_CONSUMER
from services.packer.service import ARCHIVE_CONSUMER
from services.runner.service import START_CONSUMER
from services.scheduler.translate import CONSUMED


def test_every_service_has_a_user_and_the_durables_are_the_services_own() -> None:
    assert {"scheduler", "proxy", "runner", "evaluator", "packer", "cell_agent"} <= set(BUS_USERS)
    durables = {user: [d for d, _ in use.consumes] for user, use in BUS_USERS.items() if use.consumes}
    assert durables == {
        "scheduler": ["scheduler"],
        "runner": [START_CONSUMER],
        "evaluator": [TERMINATED_CONSUMER],
        "packer": [ARCHIVE_CONSUMER],
    }


def test_every_event_and_command_has_exactly_one_publishing_user() -> None:
    publishers: dict[type, list[str]] = {}
    for user, use in BUS_USERS.items():
        for t in use.publishes:
            publishers.setdefault(t, []).append(user)
    assert set(publishers) == set(ROUTES)
    assert all(len(users) == 1 for users in publishers.values()), publishers


def test_a_user_publishes_only_its_events_and_reads_only_its_inbox() -> None:
    p = permissions("r1", "runner")
    assert subject_for("r1", ev.ExecutionStarted) in p["publish"]["allow"]
    assert subject_for("r1", ev.StepCompleted) not in p["publish"]["allow"]
    assert p["subscribe"]["allow"] == [f"{inbox_prefix('runner')}.>"]
    assert "$JS.API.CONSUMER.MSG.NEXT.GYRE_r1_COMMANDS.runner" in p["publish"]["allow"]
    assert not any(s.endswith(">") and s.startswith("gyre.") for s in p["publish"]["allow"])
    cli = permissions("r1", "cli")
    assert not any(s.startswith("gyre.") for s in cli["publish"]["allow"])
    assert "gyre.r1.>" in cli["subscribe"]["allow"]


def test_the_scheduler_consumes_from_the_event_stream() -> None:
    ((_, event_type),) = BUS_USERS["scheduler"].consumes
    assert event_type in CONSUMED


def test_unknown_users_are_refused() -> None:
    with pytest.raises(ValueError, match="BUS_USERS"):
        permissions("r1", "intruder")
