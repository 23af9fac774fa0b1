"""The policy's whole state as plain JSON-able data, and back: what a restarted scheduler resumes from.

    data = state_to_dict(policy.state)               # after every applied event (the shell stores it)
    policy = Policy(params, state_from_dict(params, data))

Everything the policy decides with is kept — counters, roles (transitions in flight included), the
placement with its unbound reservations and forwards, the open batch (packed, claimed, unclaimed
groups, stream closed), pending publications, staleness records, micro-steps in flight and the supply
timer — so the restored policy makes exactly the decisions the lost one would have made. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from services.scheduler.policy.params import PolicyParams
from services.scheduler.policy.placement import Placement
from services.scheduler.policy.roles import Role
from services.scheduler.policy.staleness import StalenessRecord
from services.scheduler.policy.state import PendingGroup, PolicyState
from services.scheduler.policy.supply import SupplyTimer

FORMAT = 2
"""Version of the layout below; a state of another version is refused (the run cannot resume)."""


def state_to_dict(s: PolicyState) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "roles": [str(r) for r in s.roles],
        "placement": s.placement.to_dict(),
        "dispatched": s.dispatched,
        "started": s.started,
        "finished": s.finished,
        "version": s.version,
        "published_version": s.published_version,
        "burst_start_version": s.burst_start_version,
        "burst": s.burst,
        "run_started": s.run_started,
        "pending_publications": list(s.pending_publications),
        "batch_step": s.batch_step,
        "batch_packed": s.batch_packed,
        "batch_claimed": s.batch_claimed,
        "batch_stream_closed": s.batch_stream_closed,
        "batch_unclaimed": list(s.batch_unclaimed),
        "ready_unclaimed": s.ready_unclaimed,
        "groups": {g: [r.dispatch_version, r.ready, r.packed_step] for g, r in s.groups.items()},
        "staleness": [[r.group_id, r.dispatch_version, r.train_version] for r in s.staleness],
        "supply_since_s": s.supply.since_s,
        "microsteps_in_flight": s.microsteps_in_flight,
        "transitions_completed": s.transitions_completed,
        "tick_at_s": s.tick_at_s,
        "now_s": s.now_s,
    }


def state_from_dict(params: PolicyParams, data: dict[str, Any]) -> PolicyState:
    """The state `state_to_dict` wrote; a ValueError names what does not fit `params`."""
    if data.get("format") != FORMAT:
        raise ValueError(f"scheduler state has format {data.get('format')!r}; this scheduler reads {FORMAT}")
    roles = [Role(r) for r in data["roles"]]
    if len(roles) != params.num_cells:
        raise ValueError(
            f"the stored state has {len(roles)} cells; scheduler.num_cells is {params.num_cells}"
        )
    placement = Placement.from_dict(
        data["placement"],
        num_cells=params.num_cells,
        cell_capacity=params.cell_capacity,
        separate_pool_capacity=params.separate_pool_capacity,
    )
    state = PolicyState(
        roles=roles,
        placement=placement,
        dispatched=int(data["dispatched"]),
        started=int(data["started"]),
        finished=int(data["finished"]),
        version=int(data["version"]),
        published_version=int(data["published_version"]),
        burst_start_version=int(data["burst_start_version"]),
        burst=int(data["burst"]),
        run_started=bool(data["run_started"]),
        pending_publications=[int(v) for v in data["pending_publications"]],
        batch_step=None if data["batch_step"] is None else int(data["batch_step"]),
        batch_packed=int(data["batch_packed"]),
        batch_claimed=int(data["batch_claimed"]),
        batch_stream_closed=bool(data["batch_stream_closed"]),
        batch_unclaimed=dict.fromkeys(data["batch_unclaimed"]),
        ready_unclaimed=int(data["ready_unclaimed"]),
        groups={
            g: PendingGroup(
                dispatch_version=int(v), ready=bool(ready), packed_step=None if p is None else int(p)
            )
            for g, (v, ready, p) in data["groups"].items()
        },
        staleness=[StalenessRecord(g, int(vd), int(vt)) for g, vd, vt in data["staleness"]],
        supply=SupplyTimer(None if data["supply_since_s"] is None else float(data["supply_since_s"])),
        microsteps_in_flight=int(data["microsteps_in_flight"]),
        transitions_completed=int(data["transitions_completed"]),
        tick_at_s=None if data["tick_at_s"] is None else float(data["tick_at_s"]),
        now_s=float(data["now_s"]),
    )
    if not state.dispatched >= state.started >= state.finished >= 0:
        raise ValueError(
            f"counters must satisfy d >= p >= f >= 0; got d={state.dispatched} p={state.started} f={state.finished}"
        )
    if placement.running != state.started - state.finished:
        raise ValueError(
            f"placement holds {placement.running} executions; p - f is {state.started - state.finished}"
        )
    return state
