"""Router rules without engines: destination order, sticky assignment, table updates, drain
bookkeeping and its refusals (calls in flight are moved in tests/integration/test_proxy_reroute.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from services.proxy.errors import EngineUnavailableError, PromptTooLongError
from services.proxy.generation import Generation
from services.proxy.metrics import OverheadClock
from services.proxy.routing import EngineSpec, NoDestinationError, Router, UnknownEngineError


def router(*specs: EngineSpec, default: str = "") -> Router:
    r = Router(engine_timeout_s=5, drain_timeout_s=1)
    r.update(specs, {}, default)
    return r


CELLS = (EngineSpec("cell-0", "http://127.0.0.1:1", 0), EngineSpec("cell-1", "http://127.0.0.1:2", 1))
POOL = EngineSpec("pool-0", "http://127.0.0.1:3", -1)


def call_on(
    r: Router, prompt_ids: list[int], *, max_attempts: int, unreachable_wait_s: float = 0.0
) -> Generation:
    """A non-streamed call of execution e1 on `r`, with no backoff between attempts."""
    return Generation(
        r,
        execution_id="e1",
        call_id="c1",
        prompt_ids=np.asarray(prompt_ids, dtype=np.int32),
        sampling={},
        max_new_tokens=4,
        stop_token_ids=frozenset(),
        stream=False,
        clock=OverheadClock(),
        max_attempts=max_attempts,
        backoff_s=0.0,
        unreachable_wait_s=unreachable_wait_s,
    )


async def run_to_end(call: Generation) -> None:
    async for _ in call.run():
        pass


async def test_destination_order_is_pool_first_then_cells_from_the_highest_index() -> None:
    r = router(*CELLS, EngineSpec("cell-2", "http://127.0.0.1:4", 2), POOL)
    assert r.destination_order() == ["pool-0", "cell-2", "cell-1", "cell-0"]
    assert r.destination_order(exclude="cell-2") == ["pool-0", "cell-1", "cell-0"]
    await r.aclose()


async def test_an_unrouted_execution_sticks_to_the_engine_it_was_given() -> None:
    r = router(*CELLS, default="cell-0")
    assert r.engine_for("e1").engine_id == "cell-0"
    r.update([], {}, "cell-1")  # a new default does not move e1 (its prefix cache is on cell-0)
    assert r.engine_for("e1").engine_id == "cell-0"
    assert r.engine_for("e2").engine_id == "cell-1"
    r.update([], {"e1": "cell-1"}, "")  # an explicit route does
    assert r.engine_for("e1").engine_id == "cell-1"
    await r.aclose()


async def test_without_a_default_the_first_destination_serves_and_without_engines_nothing_does() -> None:
    r = router(*CELLS, POOL)
    assert r.engine_for("e1").engine_id == "pool-0"
    await r.aclose()
    with pytest.raises(EngineUnavailableError):
        Router(engine_timeout_s=5, drain_timeout_s=1).engine_for("e1")


async def test_drain_moves_routes_and_default_and_a_new_table_serves_the_engine_again() -> None:
    r = router(*CELLS, POOL, default="cell-0")
    r.engine_for("e1")
    r.update([], {"e2": "cell-0", "e3": "cell-1"}, "")
    result = await r.drain("cell-0", ["cell-1"], migrate_kv=True)
    assert (result.executions_moved, result.calls_rerouted, result.destinations) == (2, 0, ["cell-1"])
    assert r.routes == {"e1": "cell-1", "e2": "cell-1", "e3": "cell-1"} and r.default_engine_id == "cell-1"
    assert not r.engines["cell-0"].serving
    r.update([], {"e4": "cell-0"}, "")  # a route to a drained engine is not used
    assert r.engine_for("e4").engine_id == "cell-1"
    r.update([*CELLS, POOL], {}, "")  # the cell is back in the table: it serves again
    assert r.engines["cell-0"].serving
    await r.aclose()


async def test_drain_without_named_destinations_uses_the_destination_order() -> None:
    r = router(*CELLS, POOL, default="cell-1")
    assert (await r.drain("cell-1", [], migrate_kv=False)).destinations == ["pool-0", "cell-0"]
    assert r.default_engine_id == "pool-0"
    await r.aclose()


async def test_drain_refuses_unknown_engines_and_a_drain_with_nowhere_to_go() -> None:
    r = router(*CELLS)
    with pytest.raises(UnknownEngineError):
        await r.drain("cell-9", [], migrate_kv=False)
    with pytest.raises(UnknownEngineError):
        await r.drain("cell-0", ["cell-9"], migrate_kv=False)
    await r.drain("cell-1", [], migrate_kv=False)
    r.in_flight["cell-0"].add(object())  # type: ignore[arg-type]
    with pytest.raises(NoDestinationError):
        await r.drain("cell-0", [], migrate_kv=False)
    assert r.engines["cell-0"].serving
    r.in_flight["cell-0"].clear()
    # The last serving engine may leave once nothing is in flight: there is nothing to move.
    assert (await r.drain("cell-0", [], migrate_kv=False)).destinations == []
    assert not r.engines["cell-0"].serving
    await r.aclose()


async def test_a_table_update_reuses_clients_of_unchanged_engines() -> None:
    r = router(*CELLS)
    client = r.engines["cell-0"].client
    r.update([CELLS[0], EngineSpec("cell-1", "http://127.0.0.1:9", 1)], {}, "")
    assert r.engines["cell-0"].client is client
    assert r.engines["cell-1"].spec.url == "http://127.0.0.1:9"
    await r.aclose()


async def test_a_call_refused_before_its_first_attempt_leaves_nothing_in_flight() -> None:
    """A prompt longer than the engine's context is refused after the engine was acquired; the engine must
    not keep the call as in flight, or the drain of the last serving engine is refused forever (seen as a
    scheduler crash-loop in a run whose every call was refused)."""
    r = router(*CELLS, default="cell-0")
    r.engines["cell-0"].context_len, r.engines["cell-0"].context_known = 8, True
    call = call_on(r, list(range(20)), max_attempts=1)
    with pytest.raises(PromptTooLongError):
        await run_to_end(call)
    assert not r.in_flight.get("cell-0")
    await r.drain("cell-1", [], migrate_kv=False)
    assert (await r.drain("cell-0", [], migrate_kv=False)).destinations == []  # the last one leaves
    await r.aclose()


async def test_fail_over_prefers_the_default_then_the_destination_order_and_needs_another_engine() -> None:
    r = router(*CELLS, POOL, default="cell-0")
    r.set_route("e1", "cell-1")
    assert r.fail_over("e1", "cell-1") == "cell-0" and r.routes["e1"] == "cell-0"
    assert r.fail_over("e1", "cell-0") == "pool-0"  # the default failed: the destination order
    assert "cell-0" in r.engines and r.engines["cell-0"].serving  # the table is the scheduler's
    alone = router(CELLS[0], default="cell-0")
    alone.set_route("e1", "cell-0")
    assert alone.fail_over("e1", "cell-0") is None and alone.routes["e1"] == "cell-0"
    await r.aclose()
    await alone.aclose()


async def test_a_call_whose_engine_cannot_be_reached_tries_another_engine_next() -> None:
    """Nothing listens on either engine's port: each failed attempt moves the execution to the other one."""
    r = router(*CELLS, default="cell-0")
    r.set_route("e1", "cell-1")
    call = call_on(r, [1, 2, 3], max_attempts=3)
    for engine in r.engines.values():
        engine.context_len, engine.context_known = 64, True
    with pytest.raises(EngineUnavailableError, match="after 3 attempts"):
        await run_to_end(call)
    assert call.engine_ids == ["cell-1", "cell-0", "cell-1"]
    assert not any(r.in_flight.values())
    await r.aclose()


async def test_with_no_other_engine_a_call_waits_for_its_engine_before_counting_attempts() -> None:
    r = router(CELLS[0], default="cell-0")  # nothing listens on its port; no engine to fail over to
    r.engines["cell-0"].context_len, r.engines["cell-0"].context_known = 64, True
    call = call_on(r, [1, 2, 3], max_attempts=2, unreachable_wait_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(EngineUnavailableError, match="after 2 attempts"):
        await run_to_end(call)
    assert time.monotonic() - t0 >= 1.0 and len(call.engine_ids) > 2  # it kept trying for the whole wait
    await r.aclose()
