"""The writer of per-step training metrics: the run's events in, one row per optimizer step out, to every sink.

    writer = StepMetricsWriter(bus, config.metrics, run_dir=config.run.path, run_id=config.run.id)
    writer.open()                 # sinks opened: a missing package fails here, naming its extra
    await writer.run()            # forever (supervise it); rows land as steps complete
    writer.close()

It reads the batch and training events of the run's stream from its beginning through ordered (ephemeral)
consumers, so after a restart it rebuilds what it needs from the stream itself and holds no state of its
own: steps already in `metrics.jsonl` are skipped, the others are written once their row is complete
(gyre/metrics/steps.py). The scheduler hosts it (it owns the run); the NATS user that runs it needs
`reads_history` (gyre/bus/permissions.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nats.js.api import ConsumerConfig, DeliverPolicy

from gyre.bus import EventBus
from gyre.bus.codec import TYPE_HEADER, decode_event
from gyre.bus.subjects import event_stream
from gyre.config.metrics import MetricsSection
from gyre.log import get_logger
from gyre.metrics.sinks import JsonlSink, MetricsSink, close_sinks, open_sinks
from gyre.metrics.steps import StepRows, scalars

log = get_logger("gyre.metrics.writer")

AREAS = ("batch", "train")
"""Subject areas holding GroupPacked, MicroStepEnqueued, StreamClosed (`batch`) and StepCompleted (`train`)."""


class StepMetricsWriter:
    def __init__(self, bus: EventBus, section: MetricsSection, *, run_dir: Path, run_id: str) -> None:
        self.bus = bus
        self.section = section
        self.run_dir = run_dir
        self.run_id = run_id
        self.sinks: list[MetricsSink] = []
        self.rows = StepRows()
        self.num_written = 0

    def open(self) -> None:
        self.sinks = open_sinks(self.section, self.run_dir, self.run_id)
        jsonl = self.sinks[0]
        assert isinstance(jsonl, JsonlSink)
        self.rows = StepRows(done=jsonl.written)
        log.info(
            "step_metrics_opened",
            path=str(jsonl.path),
            sinks=[s.name for s in self.sinks],
            steps_already_written=len(jsonl.written),
        )

    async def run(self) -> None:
        """Replay and follow the run's batch and training events; never returns (cancel it to stop)."""
        stream = event_stream(self.run_id).name
        subs = [
            await self.bus.js.subscribe(
                f"gyre.{self.run_id}.{area}.>",
                stream=stream,
                ordered_consumer=True,
                config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
            )
            for area in AREAS
        ]
        try:
            await asyncio.gather(*(self._follow(sub) for sub in subs))
        finally:
            for sub in subs:
                await sub.unsubscribe()

    async def _follow(self, sub: Any) -> None:
        while True:
            msg = await sub.next_msg(timeout=None)
            event = decode_event((msg.headers or {}).get(TYPE_HEADER, ""), msg.data)
            for row in self.rows.add(event):
                self.write(row)

    def write(self, row: dict[str, Any]) -> None:
        numbers = scalars(row)
        for sink in self.sinks:
            sink.write(row, numbers)
        self.num_written += 1
        log.info("step_metrics_written", step=row["step"], loss=row["loss"], reward_mean=row["reward_mean"])

    def close(self) -> None:
        close_sinks(self.sinks)
        self.sinks = []
