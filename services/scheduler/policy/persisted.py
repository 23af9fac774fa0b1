"""The policy's whole state as plain JSON-able data, and back: what a restarted scheduler resumes from.

    data = state_to_dict(policy.state)               # after every applied event (the shell stores it)
    policy = Policy(params, state_from_dict(params, data))

Everything the policy decides with is kept — counters, roles (transitions in flight included), the
placement with its unbound reservations and forwards, the open batch (packed, claimed, unclaimed
groups, stream closed), pending publications, staleness records, micro-steps in flight and the supply
timer, and the pool (members, joining and gone cells, orphaned executions, the core's durable version
and a pending restore) — so the restored policy makes exactly the decisions the lost one would have
made. A state of format 2 (a fixed pool, the separate pool's slot last) is read too. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from services.scheduler.policy.params import PolicyParams
from services.scheduler.policy.placement import Placement
from services.scheduler.policy.roles import MEMBER_ROLES, Role
from services.scheduler.policy.staleness import StalenessRecord
from services.scheduler.policy.state import PendingGroup, PolicyState
from services.scheduler.policy.supply import SupplyTimer

FORMAT = 3
"""Version of the layout below; a state of another version (but 2) is refused (the run cannot resume)."""


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
        "members": list(s.members),
        "microsteps_by_cell": {str(c): n for c, n in s.microsteps_by_cell.items()},
        "batch_cells": {
            str(c): {g: [r.dispatch_version, r.ready, r.packed_step] for g, r in claimed.items()}
            for c, claimed in s.batch_cells.items()
        },
        "leaving_core": s.leaving_core,
        "durable_version": s.durable_version,
        "restore_from": s.restore_from,
        "restore_cell": s.restore_cell,
        "steps_lost": s.steps_lost,
        "cells_joined": s.cells_joined,
        "cells_left": s.cells_left,
        "cells_lost": s.cells_lost,
    }


def _group(record: list[Any]) -> PendingGroup:
    v, ready, packed = record
    return PendingGroup(
        dispatch_version=int(v), ready=bool(ready), packed_step=None if packed is None else int(packed)
    )


def _placement_of_format_2(data: dict[str, Any]) -> dict[str, Any]:
    """Format 2 kept the separate pool's slot after the cells' (slot K); format 3 keeps it first."""
    pool = len(data["serving"]) - 1
    out = {k: data[k][-1:] + data[k][:-1] for k in ("serving", "load", "unbound", "members")}
    out["forward"] = [
        [0 if x == pool else x + 1 for x in f] for f in data["forward"][-1:] + data["forward"][:-1]
    ]
    return out


def state_from_dict(params: PolicyParams, data: dict[str, Any]) -> PolicyState:
    """The state `state_to_dict` wrote; a ValueError names what does not fit `params`."""
    stored_format = data.get("format")
    if stored_format not in (2, FORMAT):
        raise ValueError(
            f"scheduler state has format {stored_format!r}; this scheduler reads {FORMAT} (and 2)"
        )
    roles = [Role(r) for r in data["roles"]]
    # A pool that changed keeps a role for every cell id it used; it never has fewer than configured.
    too_few = len(roles) < params.num_cells
    if too_few or (stored_format == 2 and len(roles) != params.num_cells):
        raise ValueError(
            f"the stored state has {len(roles)} cells; scheduler.num_cells is {params.num_cells}"
        )
    stored_placement = data["placement"]
    if stored_format == 2:
        stored_placement = _placement_of_format_2(stored_placement)
    placement = Placement.from_dict(
        stored_placement,
        cell_capacity=params.cell_capacity,
        separate_pool_capacity=params.separate_pool_capacity,
    )
    if placement.num_cells != len(roles):
        raise ValueError(f"stored placement has {placement.num_cells} cells; the roles name {len(roles)}")
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
        groups={g: _group(record) for g, record in data["groups"].items()},
        staleness=[StalenessRecord(g, int(vd), int(vt)) for g, vd, vt in data["staleness"]],
        supply=SupplyTimer(None if data["supply_since_s"] is None else float(data["supply_since_s"])),
        microsteps_in_flight=int(data["microsteps_in_flight"]),
        transitions_completed=int(data["transitions_completed"]),
        tick_at_s=None if data["tick_at_s"] is None else float(data["tick_at_s"]),
        now_s=float(data["now_s"]),
        members=[int(c) for c in data.get("members", range(len(roles)))],
        microsteps_by_cell={int(c): int(n) for c, n in data.get("microsteps_by_cell", {}).items()},
        batch_cells={
            int(c): {g: _group(record) for g, record in claimed.items()}
            for c, claimed in data.get("batch_cells", {}).items()
        },
        leaving_core=_int_or_none(data.get("leaving_core")),
        durable_version=int(data.get("durable_version", data["published_version"])),
        restore_from=_int_or_none(data.get("restore_from")),
        restore_cell=_int_or_none(data.get("restore_cell")),
        steps_lost=int(data.get("steps_lost", 0)),
        cells_joined=int(data.get("cells_joined", 0)),
        cells_left=int(data.get("cells_left", 0)),
        cells_lost=int(data.get("cells_lost", 0)),
    )
    if sorted(state.members) != [c for c, r in enumerate(roles) if r in MEMBER_ROLES]:
        raise ValueError(f"stored members {state.members} do not match the stored roles {data['roles']}")
    if not state.dispatched >= state.started >= state.finished >= 0:
        raise ValueError(
            f"counters must satisfy d >= p >= f >= 0; got d={state.dispatched} p={state.started} f={state.finished}"
        )
    if placement.running != state.started - state.finished:
        raise ValueError(
            f"placement holds {placement.running} executions; p - f is {state.started - state.finished}"
        )
    return state


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)
