"""The scheduler's whole state in Redis, written after every applied event, so a restarted scheduler
resumes the run where the killed one stopped.

One JSON document (`Keys.scheduler_state()`), written with one SET after each event the driver applied
and before the event's NATS message is acknowledged:

    policy        the policy's complete state (services/scheduler/policy/persisted.py): counters, roles
                  (transitions in flight included), placement, the open batch, pending publications,
                  staleness records, the supply timer
    shell         what the shell keeps beside it: starts commanded and not yet confirmed, the groups of
                  each enqueued micro-step, each open batch's mean reward, whether the run is stopping,
                  the cells given notice whose engine's drain has not ended
    applied_seq   stream sequence of the last bus event applied: a restarted scheduler re-reads the event
                  stream from the next one (services/scheduler/service.py), so every event is applied
                  exactly once and in order

Events that are not on the bus (RPC completions, ticks) are re-made by re-driving the actions the
restored state has in flight (services/scheduler/recovery.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from services.scheduler.policy import Policy, PolicyParams, PolicyState, state_from_dict, state_to_dict


@dataclass(slots=True)
class ShellState:
    """The scheduler shell's own facts (the executor and the event translator share this object)."""

    commanded: dict[str, int] = field(default_factory=dict)
    """Execution id → engine, for starts commanded and not yet confirmed started."""
    microstep_groups: dict[str, list[str]] = field(default_factory=dict)
    """Micro-step id → the groups of its rows (from MicroStepEnqueued), until it is done."""
    batch_reward: dict[int, float] = field(default_factory=dict)
    """Step → mean reward of its batch (from the packer's StreamClosed) until the step completes."""
    last_step_reward: float = float("nan")
    """Mean reward of the groups the last completed step trained on."""
    stopping: bool = False
    """The run is ending (Shutdown, max_steps reached, or a gate): no more dispatch, starts or batches."""
    stop_reason: str = ""
    """Why the run stopped itself before `max_steps` (the mismatch gate); "" otherwise."""
    packed_executions: int = 0
    """Executions of the groups packed so far (N per GroupPacked)."""
    executions_without_targets: int = 0
    """Of those, the ones that contributed no target token (`gyre status` shows the share)."""
    departing: list[int] = field(default_factory=list)
    """Cells given notice (gone for the policy) whose engine's drain has not ended: a restarted scheduler
    drains them again, and `GetState` shows them DRAINING until it ends (services/scheduler/departure.py)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "commanded": self.commanded,
            "microstep_groups": self.microstep_groups,
            "batch_reward": {str(k): v for k, v in self.batch_reward.items()},
            "last_step_reward": None
            if self.last_step_reward != self.last_step_reward
            else self.last_step_reward,
            "stopping": self.stopping,
            "stop_reason": self.stop_reason,
            "packed_executions": self.packed_executions,
            "executions_without_targets": self.executions_without_targets,
            "departing": self.departing,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShellState:
        last = data.get("last_step_reward")
        return cls(
            commanded={e: int(engine) for e, engine in data["commanded"].items()},
            microstep_groups={m: list(g) for m, g in data["microstep_groups"].items()},
            batch_reward={int(k): float(v) for k, v in data["batch_reward"].items()},
            last_step_reward=float("nan") if last is None else float(last),
            stopping=bool(data["stopping"]),
            stop_reason=str(data.get("stop_reason", "")),
            packed_executions=int(data.get("packed_executions", 0)),
            executions_without_targets=int(data.get("executions_without_targets", 0)),
            departing=[int(c) for c in data.get("departing", [])],
        )


@dataclass(slots=True)
class Restored:
    state: PolicyState
    shell: ShellState
    applied_seq: int


async def save(redis: aioredis.Redis, key: str, policy: Policy, shell: ShellState, applied_seq: int) -> None:
    doc = {"policy": state_to_dict(policy.state), "shell": shell.to_dict(), "applied_seq": applied_seq}
    await redis.set(key, json.dumps(doc, allow_nan=False))


async def restore(redis: aioredis.Redis, key: str, params: PolicyParams) -> Restored | None:
    """The stored state, or None when this run has none yet (a fresh start)."""
    raw = await redis.get(key)
    if raw is None:
        return None
    doc = json.loads(raw)
    return Restored(
        state=state_from_dict(params, doc["policy"]),
        shell=ShellState.from_dict(doc["shell"]),
        applied_seq=int(doc["applied_seq"]),
    )
