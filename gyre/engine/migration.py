"""Moving the KV of a live request from one engine to another (the reroute of a role transition).

    moved = await migrate_request_kv(source, destination, rid)
    # then re-send the request (prompt + the output the source produced) to `destination`;
    # it reuses `moved.num_tokens` tokens of KV instead of recomputing them.

Order, as docs/design.md prescribes: pin on the source (the blocks survive the abort) → abort the request
on the source (its original call returns finish_reason abort with the output so far) → export →
import on the destination → release the pin once the destination has confirmed. Commands on one
engine apply in order, so the export sees the request already stopped. Any failure after the pin
still releases it; a destination that cannot take the KV (another weight version, a real SGLang)
yields `num_tokens == 0` and the caller simply recomputes.
"""

from __future__ import annotations

from dataclasses import dataclass

from gyre.engine.client import EngineClient
from gyre.engine.errors import EngineConflict, EngineNotFound, EngineUnavailable


@dataclass(frozen=True, slots=True)
class MigrationResult:
    rid: str
    pinned_tokens: int
    num_tokens: int
    payload_bytes: int
    reason: str | None = None


async def migrate_request_kv(source: EngineClient, destination: EngineClient, rid: str) -> MigrationResult:
    """Pin, abort, export, import, release. Raises `EngineNotFound` if the source has no such request
    in flight (it finished first: nothing to migrate)."""
    pin = await source.pin_kv(rid)
    try:
        await source.abort(rid)
        if pin.num_tokens == 0:
            return MigrationResult(rid, 0, 0, 0, reason="no reusable KV on the source")
        payload = await source.export_kv(pin.handle)
        try:
            imported = await destination.import_kv(payload)
        except (EngineConflict, EngineNotFound, EngineUnavailable) as e:
            return MigrationResult(rid, pin.num_tokens, 0, len(payload), reason=e.message)
        return MigrationResult(rid, pin.num_tokens, imported, len(payload))
    finally:
        await source.release_kv(pin.handle)
