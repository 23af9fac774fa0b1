"""EventBus against a real nats-server: late subscribers, redelivery after a consumer dies,
idempotent publishing."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

from google.protobuf.message import Message

from app.stack.servers import ServerProcess
from gyre.bus import Delivery, EventBus
from gyre.v1 import common_pb2 as common
from gyre.v1 import events_pb2 as ev
from tests.support.eventually import eventually


def _terminated(execution_id: str) -> ev.ExecutionTerminated:
    return ev.ExecutionTerminated(
        execution=common.ExecutionRef(execution_id=execution_id, group_id="g1"),
        reason=common.TERMINATION_REASON_COMPLETED,
    )


async def _collect(bus: EventBus, durable: str, n: int, **kw: object) -> list[tuple[Message, Delivery]]:
    got: list[tuple[Message, Delivery]] = []
    done = asyncio.Event()

    async def handle(event: Message, delivery: Delivery) -> None:
        got.append((event, delivery))
        if len(got) >= n:
            done.set()

    consumer = await bus.consume(durable, [ev.ExecutionTerminated], handle, **kw)  # type: ignore[arg-type]
    await asyncio.wait_for(done.wait(), timeout=15)
    await consumer.stop()
    return got


async def test_event_published_before_consumer_exists_is_delivered(bus: EventBus) -> None:
    await bus.publish(_terminated("e-early"))
    got = await _collect(bus, "late", 1)
    event, delivery = got[0]
    assert isinstance(event, ev.ExecutionTerminated)
    assert event.execution.execution_id == "e-early"
    assert event.meta.run_id == bus.run_id and event.meta.source == "test"
    assert delivery.subject == f"gyre.{bus.run_id}.exec.terminated"


async def test_duplicate_publish_with_same_id_is_stored_once(bus: EventBus) -> None:
    first = await bus.publish(_terminated("e-dup"), event_id="terminated:e-dup")
    second = await bus.publish(_terminated("e-dup"), event_id="terminated:e-dup")
    assert (first, second) == (True, False)
    info = await bus.js.stream_info(f"GYRE_{bus.run_id}_EVENTS")
    assert info.state.messages == 1


async def test_handler_failure_is_redelivered(bus: EventBus) -> None:
    attempts: list[int] = []
    done = asyncio.Event()

    async def handle(event: Message, delivery: Delivery) -> None:
        attempts.append(delivery.num_delivered)
        if delivery.num_delivered < 2:
            raise RuntimeError("transient")
        done.set()

    await bus.publish(_terminated("e-retry"))
    consumer = await bus.consume("retry", [ev.ExecutionTerminated], handle)
    await asyncio.wait_for(done.wait(), timeout=15)
    await consumer.stop()
    assert attempts == [1, 2]


_DYING_CONSUMER = textwrap.dedent(
    """
    import asyncio, sys
    from gyre.bus import EventBus
    from gyre.v1 import events_pb2 as ev

    async def main():
        bus = await EventBus.connect(sys.argv[1], run_id=sys.argv[2], source="dying")
        async def handle(event, delivery):
            print("got", event.execution.execution_id, flush=True)
            await asyncio.sleep(3600)  # scenario: never returns, so never acks
        await bus.consume("shared", [ev.ExecutionTerminated], handle, ack_wait_s=1.0)
        await asyncio.sleep(3600)  # scenario: it consumes until it is killed

    asyncio.run(main())
    """
)


async def test_unacked_event_is_redelivered_after_consumer_dies(
    bus: EventBus, nats_server: ServerProcess, run_id: str
) -> None:
    await bus.publish(_terminated("e-orphan"))
    proc = subprocess.Popen(
        [sys.executable, "-c", _DYING_CONSUMER, nats_server.url, run_id],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=30)  # type: ignore[union-attr]
        assert line.decode().split() == ["got", "e-orphan"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    got = await _collect(bus, "shared", 1, ack_wait_s=1.0)
    event, delivery = got[0]
    assert event.execution.execution_id == "e-orphan"  # type: ignore[attr-defined]
    assert delivery.num_delivered >= 2


async def test_command_work_queue_delivers_each_command_to_one_consumer(bus: EventBus) -> None:
    for i in range(6):
        await bus.publish(ev.ExecutionStartRequested(execution=common.ExecutionRef(execution_id=f"e{i}")))
    seen: list[str] = []
    done = asyncio.Event()

    async def handle(event: Message, delivery: Delivery) -> None:
        seen.append(event.execution.execution_id)  # type: ignore[attr-defined]
        if len(seen) == 6:
            done.set()

    a = await bus.consume("runners", [ev.ExecutionStartRequested], handle)
    b = await bus.consume("runners", [ev.ExecutionStartRequested], handle)
    await asyncio.wait_for(done.wait(), timeout=15)

    async def acknowledged() -> bool:  # work-queue retention: acknowledged commands are removed
        return (await bus.js.stream_info(f"GYRE_{bus.run_id}_COMMANDS")).state.messages == 0

    await eventually(acknowledged, what="every command to be acknowledged")
    await a.stop()
    await b.stop()
    assert sorted(seen) == [f"e{i}" for i in range(6)]
