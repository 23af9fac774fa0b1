"""EventBus: publish events idempotently and consume them through durable pull consumers.

    bus = await EventBus.connect(url, run_id="r1", source="evaluator", login=config.nats.login_for("evaluator"))
    await bus.publish(events_pb2.EvaluationDone(...), event_id=f"eval:{execution_id}:{hash}")
    consumer = await bus.consume("evaluator", [events_pb2.ExecutionTerminated], handle)
    ...
    await bus.close()

Delivery is at-least-once: a handler that raises, or a consumer that dies before acknowledging,
gets the message again after `ack_wait_s`. Handlers must therefore be idempotent. After
`max_deliver` failed attempts a message is terminated and logged as an error (never dropped
silently).

A restart of nats-server (the stack's supervisor restarts it on its JetStream files) is waited out: the
client reconnects by itself, a consume loop keeps fetching through the gap, and `publish` repeats a
message the server did not acknowledge for up to `PUBLISH_RETRY_S` (idempotent: same `Nats-Msg-Id`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import quote

import nats
import nats.errors
import nats.js.errors
from google.protobuf.message import Message
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig

from gyre import tls
from gyre.bus.codec import TYPE_HEADER, decode_event, encode_event, event_type_name
from gyre.bus.permissions import inbox_prefix
from gyre.bus.subjects import StreamSpec, command_stream, event_stream, stream_of, subject_for
from gyre.config.infra import ClientLogin
from gyre.log import get_logger
from gyre.v1 import events_pb2 as ev

log = get_logger("gyre.bus")

PUBLISH_RETRY_S = 90.0
"""How long `publish` repeats a message while the server is unreachable or JetStream is not answering."""
_TRANSIENT: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.FlushTimeoutError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
    TimeoutError,
)
"""Errors of a server that is restarting or recovering its streams: the operation is repeated."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """Delivery metadata handed to a handler next to the decoded event."""

    subject: str
    num_delivered: int
    stream_seq: int


Handler = Callable[[Message, Delivery], Awaitable[None]]


class EventConsumer:
    """A running durable pull consumer; `stop()` ends its loop, unacked messages are redelivered."""

    def __init__(
        self, task: asyncio.Task[None], name: str, psub: JetStreamContext.PullSubscription | None = None
    ) -> None:
        self.task = task
        self.name = name
        self._psub = psub

    async def stop(self) -> None:
        # Python 3.11's asyncio.wait_for (inside nats-py and redis-py) can swallow a cancellation
        # that races with a completing operation; cancel until the loop has really ended.
        while not self.task.done():
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=1.0)
        await asyncio.gather(self.task, return_exceptions=True)
        if self._psub is not None:
            # Leftover pull replies (e.g. expired-request statuses) would stall a later drain.
            with contextlib.suppress(nats.errors.Error):
                await self._psub.unsubscribe()
            self._psub = None


def nats_auth(login: ClientLogin | None) -> dict[str, object]:
    """`nats.connect` keyword arguments for `login` (user, password and the user's own inbox prefix) and
    for this process's TLS identity (`gyre.tls`: the client's certificate, the deployment's CA). Without a
    login, a TLS identity is the NATS user (the deploy shape's `verify_and_map`): its inbox prefix, then."""
    identity = tls.current()
    secure: dict[str, object] = {"tls": identity.client_context()} if identity is not None else {}
    if login is None:
        if identity is not None:
            secure["inbox_prefix"] = inbox_prefix(identity.identity)
        return secure
    return {
        **secure,
        "user": login.user,
        "password": login.password,
        "inbox_prefix": inbox_prefix(login.user),
    }


def login_url(url: str, login: ClientLogin | None) -> str:
    """`url` with `login` in it (`nats://user:password@host:port`), for clients that take only a URL."""
    if login is None:
        return url
    scheme, _, rest = url.partition("://")
    return (
        f"{scheme}://{quote(login.user, safe='')}:{quote(login.password, safe='')}@{rest.rpartition('@')[2]}"
    )


class EventBus:
    """A run's view of NATS JetStream."""

    def __init__(self, nc: NatsClient, run_id: str, source: str) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.run_id = run_id
        self.source = source
        self._consumers: list[EventConsumer] = []

    @classmethod
    async def connect(
        cls, url: str, run_id: str, source: str, ensure_streams: bool = True, login: ClientLogin | None = None
    ) -> EventBus:
        """Connect (as `login`'s user, replies on its own inbox prefix) and declare the streams."""
        nc = await nats.connect(
            url,
            name=f"gyre-{source}",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            **nats_auth(login),  # type: ignore[arg-type]
        )
        bus = cls(nc, run_id, source)
        if ensure_streams:
            await bus.ensure_streams()
        return bus

    async def ensure_streams(self) -> None:
        """Declare the run's streams (idempotent)."""
        for spec in (event_stream(self.run_id), command_stream(self.run_id)):
            await self._ensure(spec)

    async def _ensure(self, spec: StreamSpec) -> None:
        config = StreamConfig(
            name=spec.name,
            subjects=list(spec.subjects),
            retention=RetentionPolicy.WORK_QUEUE if spec.work_queue else RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=spec.max_age_s,
            duplicate_window=120.0,
        )
        try:
            await self.js.stream_info(spec.name)
            await self.js.update_stream(config)
        except nats.js.errors.NotFoundError:
            await self.js.add_stream(config)

    def meta(self, event_id: str | None = None) -> ev.EventMeta:
        """An event header; pass a deterministic `event_id` wherever a retry could publish twice."""
        return ev.EventMeta(
            run_id=self.run_id,
            event_id=event_id or uuid.uuid4().hex,
            emitted_at_ms=int(time.time() * 1000),
            source=self.source,
        )

    async def publish(self, event: Message, event_id: str | None = None) -> bool:
        """Publish an event or command; returns False when JetStream kept an earlier copy (duplicate).

        The event's `meta` is filled in when unset; `event_id` (or `meta.event_id`) is the
        `Nats-Msg-Id` that makes re-publishing the same event idempotent.
        """
        meta = getattr(event, "meta", None)
        if meta is None:
            raise ValueError(f"{type(event).__name__} has no meta field; it is not a Gyre event")
        if not meta.event_id or event_id:
            meta.CopyFrom(self.meta(event_id or meta.event_id or None))
        headers = {TYPE_HEADER: event_type_name(event), "Nats-Msg-Id": meta.event_id}
        subject, data = subject_for(self.run_id, type(event)), encode_event(event)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PUBLISH_RETRY_S
        delay = 0.1
        while True:
            try:
                ack = await self.js.publish(subject, data, headers=headers)
                return not ack.duplicate
            except _TRANSIENT as e:
                if loop.time() + delay > deadline:
                    raise
                log.warning("publish_retried", subject=subject, error=type(e).__name__, retry_in_s=delay)
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)

    async def consume(
        self,
        durable: str,
        event_types: Sequence[type[Message]],
        handler: Handler,
        *,
        max_ack_pending: int = 256,
        ack_wait_s: float = 30.0,
        max_deliver: int = 20,
        batch: int = 16,
        confirm_ack: bool = False,
        deliver_new: bool = False,
        start_seq: int | None = None,
    ) -> EventConsumer:
        """Start a durable pull consumer over `event_types` (all from one stream).

        The handler runs once per message, in stream order; the message is acknowledged after it
        returns (`ack_sync` when `confirm_ack`), negatively acknowledged if it raises. With `start_seq`
        the durable consumer is re-created to deliver from that stream sequence on, at once and in order
        (a consumer that keeps its own position elsewhere, e.g. the scheduler's persisted state, resumes
        exactly there instead of waiting `ack_wait_s` for the messages its previous incarnation held).
        """
        if not event_types:
            raise ValueError("consume needs at least one event type")
        streams = {stream_of(self.run_id, t).name for t in event_types}
        if len(streams) != 1:
            raise ValueError(f"one consumer reads one stream; {durable!r} spans {sorted(streams)}")
        stream = streams.pop()
        subjects = [subject_for(self.run_id, t) for t in event_types]
        if start_seq is not None:
            if start_seq < 1:
                raise ValueError(f"start_seq must be >= 1; got {start_seq}")
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await self.js.delete_consumer(stream, durable)
            policy = DeliverPolicy.BY_START_SEQUENCE
        else:
            policy = DeliverPolicy.NEW if deliver_new else DeliverPolicy.ALL
        config = ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ack_wait_s,
            max_ack_pending=max_ack_pending,
            max_deliver=max_deliver,
            deliver_policy=policy,
            opt_start_seq=start_seq,
            filter_subjects=subjects if len(subjects) > 1 else None,
            filter_subject=subjects[0] if len(subjects) == 1 else None,
        )
        psub = await self.js.pull_subscribe(subjects[0], durable=durable, stream=stream, config=config)
        task = asyncio.create_task(
            self._consume_loop(psub, handler, durable, batch, confirm_ack, max_deliver),
            name=f"consumer/{durable}",
        )
        consumer = EventConsumer(task, durable, psub)
        self._consumers.append(consumer)
        return consumer

    async def _consume_loop(
        self,
        psub: JetStreamContext.PullSubscription,
        handler: Handler,
        durable: str,
        batch: int,
        confirm_ack: bool,
        max_deliver: int,
    ) -> None:
        while True:
            try:
                msgs = await psub.fetch(batch=batch, timeout=1.0)
            except TimeoutError:  # nats' own TimeoutError, or a bare asyncio one from nats-py's fetch
                continue
            except (nats.errors.Error, nats.js.errors.Error) as e:  # the server restarts: fetch again
                log.warning("consumer_fetch_failed", consumer=durable, error=repr(e)[:200])
                await asyncio.sleep(0.5)
                continue
            for msg in msgs:
                await self._handle(msg, handler, durable, confirm_ack, max_deliver)

    async def _handle(
        self, msg: Msg, handler: Handler, durable: str, confirm_ack: bool, max_deliver: int
    ) -> None:
        md = msg.metadata
        type_name = (msg.headers or {}).get(TYPE_HEADER, "")
        try:
            event = decode_event(type_name, msg.data)
        except ValueError as e:
            log.error("event_undecodable", consumer=durable, subject=msg.subject, error=str(e))
            await msg.term()
            return
        delivery = Delivery(
            subject=msg.subject, num_delivered=md.num_delivered, stream_seq=md.sequence.stream
        )
        try:
            await handler(event, delivery)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if md.num_delivered >= max_deliver:
                log.error(
                    "event_dead_lettered",
                    consumer=durable,
                    subject=msg.subject,
                    attempts=md.num_delivered,
                    error=repr(e),
                )
                await msg.term()
            else:
                log.warning(
                    "event_handler_failed",
                    consumer=durable,
                    subject=msg.subject,
                    attempt=md.num_delivered,
                    error=repr(e),
                )
                with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, TimeoutError):
                    await msg.nak(delay=min(0.2 * 2**md.num_delivered, 10.0))
            return
        try:
            if confirm_ack:
                await msg.ack_sync()
            else:
                await msg.ack()
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as e:  # redelivered after ack_wait
            log.warning("event_ack_failed", consumer=durable, subject=msg.subject, error=repr(e)[:200])

    async def close(self) -> None:
        """Stop consumers, then drain the connection (flushes pending publishes). Idempotent."""
        for consumer in self._consumers:
            await consumer.stop()
        self._consumers.clear()
        if not self.nc.is_closed:
            try:
                await asyncio.wait_for(self.nc.drain(), timeout=5.0)
            except (TimeoutError, nats.errors.ConnectionClosedError):
                await self.nc.close()


async def watch_consumer(consumer: EventConsumer) -> None:
    """Turn a consume loop that died into a supervised crash instead of a silent stop."""
    await asyncio.shield(consumer.task)
    raise RuntimeError(f"consumer {consumer.name!r} stopped on its own")
