"""Streaming training across real cell agent processes (K = 3, gloo and Mooncake on loopback, real
Redis and NATS): a satellite joining mid-batch, and a satellite SIGKILLed mid-batch, both end in the
parameters of a single-process reference step on the same batch."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest
import redis.asyncio as aioredis
import torch
from google.protobuf.message import Message

from app.stack.servers import ServerProcess
from gyre.bus import Delivery, EventBus
from gyre.config import GyreConfig
from gyre.model.files import check_model_dir
from gyre.model.model_dir import ModelDir
from gyre.model.weights import load_state_dict
from gyre.rl.loss import ObjectiveParams
from gyre.rl.microstep import MicroStep
from gyre.store import Keys
from gyre.trainer.backends import TorchTrainer, TrainerSpec, create_trainer
from gyre.trainer.backends.base import TrainerBackend
from gyre.trainer.synthetic import synthetic_microsteps
from gyre.v1 import events_pb2 as ev
from services.cell_agent.step_record import StepRecord
from services.cell_agent.trainer_state import TrainerState
from tests.support.cells import TRAINING, CellStack, enqueue
from tests.support.eventually import eventually
from tests.support.torch_threads import one_torch_thread  # noqa: F401  (autouse: the references run here)

#: The embedded default pulls snapshots over torch.distributed; clusters select Mooncake, tested here.
MOONCAKE = {"cell_agent": {"trainer": {"weight_transport": "mooncake"}}}

pytestmark = pytest.mark.slow


TOLERANCE = 1e-6


def _reference(config: GyreConfig) -> TrainerBackend:
    spec = TrainerSpec(
        config.cell_agent.trainer,
        ModelDir.open(config.model).path,
        ObjectiveParams(**config.objective.model_dump()),
        with_optimizer=True,
    )
    return create_trainer(config.cell_agent.trainer.backend, spec)


def _batch(reference: TrainerBackend) -> list[MicroStep]:
    assert isinstance(reference, TorchTrainer)
    steps = synthetic_microsteps(
        reference.model,
        batch_id="b0",
        step=0,
        num_groups=6,
        group_size=4,
        token_budget=256,
        max_row_tokens=120,
        seed=11,
    )
    assert len(steps) >= 8
    return steps


def _reference_step(reference: TrainerBackend, steps: list[MicroStep]) -> dict[str, torch.Tensor]:
    for s in steps:
        reference.accumulate(s)
    reference.optimizer_step()
    return {n: w.clone() for n, w in reference.named_weights().items()}


def _max_diff(published: str, expected: dict[str, torch.Tensor]) -> float:
    info = check_model_dir(Path(published))
    tensors = load_state_dict(info)
    assert info.policy_version == 1
    assert set(tensors) == set(expected)
    return max(float((tensors[n] - w).abs().max()) for n, w in expected.items())


async def _until(predicate: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 60) -> None:
    await eventually(predicate, timeout_s=timeout_s, interval_s=0.02, what=what)


async def _collect(bus: EventBus, name: str, kinds: list[type[Message]]) -> list[Message]:
    seen: list[Message] = []

    async def handle(event: Message, _: Delivery) -> None:
        seen.append(event)

    await bus.consume(name, kinds, handle)
    return seen


async def test_satellite_joining_mid_batch_matches_the_single_process_step(
    tmp_path: Path,
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    redis: aioredis.Redis,
    keys: Keys,
    bus: EventBus,
    run_id: str,
) -> None:
    events = await _collect(bus, "test-steps", [ev.StepCompleted, ev.WeightsPublished, ev.MicroStepDone])
    with CellStack(
        tmp_path,
        nats_url=nats_server.url,
        redis_url=redis_server.url,
        run_id=run_id,
        num_cells=3,
        overrides=MOONCAKE,
    ) as cells:
        reference = _reference(cells.config)
        initial_digest = reference.digest()
        steps = _batch(reference)
        record = StepRecord(redis, keys, "b0", heartbeat_timeout_s=cells.config.redis.heartbeat_timeout_s)
        for cell in (0, 1):
            await cells.switch(cell, TRAINING)
        await enqueue(record.queue, steps[:4], close=False)
        joins = [asyncio.create_task(cells.join(cell, "b0", 0, True)) for cell in (0, 1)]
        await _until(lambda: _done_at_least(record, 2), "the first micro-steps")
        assert (await cells.status(0)).weights_digest == initial_digest, "weights are frozen mid-step"
        await cells.switch(2, TRAINING)
        joins.append(asyncio.create_task(cells.join(2, "b0", 0, True)))
        await _until(lambda: _registered(redis, record, 2), "the late satellite to register")
        late = await cells.status(2)
        assert late.weights_digest == initial_digest, (
            "the snapshot pulled mid-step is the core's, bit for bit"
        )
        await enqueue(record.queue, steps[4:], close=True)
        results = await asyncio.gather(*joins)
        expected = _reference_step(reference, steps)
        published = await TrainerState(redis, keys).published()
        core_status = await cells.status(0)
        await cells.close_channels()
    assert [r.participated for r in results] == [True, True, True]
    assert [list(r.cells) for r in results] == [[0, 1, 2]] * 3
    assert sum(r.microsteps for r in results) == len(steps), "each micro-step processed exactly once"
    assert results[0].policy_version == 1 and core_status.policy_version == 1, (
        "version advanced by exactly one"
    )
    assert await TrainerState(redis, keys).version() == 1
    assert published is not None and published.version == 1
    assert _max_diff(published.path, expected) <= TOLERANCE
    await _until(lambda: _has(events, ev.WeightsPublished), "WeightsPublished", 10)
    completed = [e for e in events if isinstance(e, ev.StepCompleted)]
    assert len(completed) == 1 and list(completed[0].cells) == [0, 1, 2]
    assert completed[0].num_microsteps == len(steps) and completed[0].policy_version == 1
    done_by = [e.cell for e in events if isinstance(e, ev.MicroStepDone)]
    assert sorted(done_by) == sorted(
        c for r, c in zip(results, (0, 1, 2), strict=True) for _ in range(r.microsteps)
    )


async def test_satellite_killed_mid_batch_is_reclaimed_and_the_step_matches(
    tmp_path: Path,
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    redis: aioredis.Redis,
    keys: Keys,
    run_id: str,
) -> None:
    with CellStack(
        tmp_path,
        nats_url=nats_server.url,
        redis_url=redis_server.url,
        run_id=run_id,
        num_cells=3,
        overrides=MOONCAKE,
    ) as cells:
        reference = _reference(cells.config)
        steps = _batch(reference)
        record = StepRecord(redis, keys, "b0", heartbeat_timeout_s=cells.config.redis.heartbeat_timeout_s)
        for cell in (0, 1, 2):
            await cells.switch(cell, TRAINING)
        joins = [asyncio.create_task(cells.join(cell, "b0", 0, True)) for cell in (0, 1, 2)]
        for cell in (0, 1, 2):
            await _until(lambda c=cell: _registered(redis, record, c), f"cell {cell} to register")
        fed = 0

        async def fed_until_cell_2_worked() -> bool:  # one micro-step at a time, while the queue is empty
            nonlocal fed
            if await _done_at_least(record, 1, cells=(2,)):
                return True
            if await record.queue.pending() == 0:
                assert fed < len(steps) - 1, "cell 2 never got a micro-step"
                await enqueue(record.queue, steps[fed : fed + 1], close=False)
                fed += 1
            return False

        await eventually(fed_until_cell_2_worked, what="cell 2 to finish a micro-step")
        lost = await redis.lrange(record.processing_key(2), 0, -1)
        cells.kill(2)
        await enqueue(record.queue, steps[fed:], close=True)
        results = await asyncio.gather(*joins, return_exceptions=True)
        expected = _reference_step(reference, steps)
        published = await TrainerState(redis, keys).published()
        await cells.close_channels()
    assert lost, "cell 2 held micro-steps when it was killed"
    assert isinstance(results[2], grpc.aio.AioRpcError)
    core, sat = results[0], results[1]
    assert not isinstance(core, BaseException) and not isinstance(sat, BaseException)
    assert list(core.cells) == [0, 1] and core.policy_version == 1
    assert core.microsteps + sat.microsteps == len(steps), "the dead cell's micro-steps were redone"
    assert published is not None and _max_diff(published.path, expected) <= TOLERANCE
    assert await redis.llen(record.processing_key(2)) == 0
    assert await record.queue.drained()


async def _done_at_least(record: StepRecord, n: int, cells: tuple[int, ...] = (0, 1)) -> bool:
    return await record.num_done(cells) >= n


async def _registered(redis: aioredis.Redis, record: StepRecord, cell: int) -> bool:
    return bool(await redis.sismember(record.participants_key, str(cell)))


async def _has(events: list[Message], kind: type[Message]) -> bool:
    return any(isinstance(e, kind) for e in events)


async def test_two_step_burst_broadcasts_after_the_first_step_torch_transport(
    tmp_path: Path,
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    redis: aioredis.Redis,
    keys: Keys,
    run_id: str,
) -> None:
    with CellStack(
        tmp_path,
        nats_url=nats_server.url,
        redis_url=redis_server.url,
        run_id=run_id,
        num_cells=2,
        overrides={"cell_agent": {"trainer": {"weight_transport": "torch"}}},
    ) as cells:
        reference = _reference(cells.config)
        assert isinstance(reference, TorchTrainer)
        for cell in (0, 1):
            await cells.switch(cell, TRAINING)
        batches = [
            synthetic_microsteps(
                reference.model,
                batch_id=f"b{s}",
                step=s,
                num_groups=3,
                group_size=4,
                token_budget=256,
                max_row_tokens=120,
                seed=20 + s,
            )
            for s in (0, 1)
        ]
        for step, steps in enumerate(batches):
            await enqueue(
                StepRecord(redis, keys, f"b{step}", heartbeat_timeout_s=2.0).queue, steps, close=True
            )
            results = await asyncio.gather(*(cells.join(c, f"b{step}", step, step == 1) for c in (0, 1)))
            assert [list(r.cells) for r in results] == [[0, 1], [0, 1]]
            if step == 0:
                core, satellite = await cells.status(0), await cells.status(1)
                assert satellite.policy_version == core.policy_version == 1
                assert satellite.weights_digest == core.weights_digest, (
                    "new weights broadcast to the satellite"
                )
            _reference_step(reference, steps)
        published = await TrainerState(redis, keys).published()
        satellite_after = await cells.status(1)
        late = await cells.join(1, "b1", 1, True)
        await cells.close_channels()
    assert satellite_after.policy_version == 1, (
        "no broadcast after the final step (engines get the publication)"
    )
    assert not late.participated and late.policy_version == 2, (
        "joining a finished step is answered, not trained"
    )
    assert published is not None and published.version == 2
    tensors = load_state_dict(check_model_dir(Path(published.path)))
    diff = max(float((tensors[n] - w).abs().max()) for n, w in reference.named_weights().items())
    assert diff <= TOLERANCE
