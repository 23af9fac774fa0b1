"""Helpers for runner and evaluator integration tests: a config for a hermetic run, a recorder of
every event of the run, and a stand-in for the scheduler's dispatch (records, counter d, start
requests)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from google.protobuf.message import Message
from nats.aio.msg import Msg

from gyre.bus import EventBus, decode_event
from gyre.bus.codec import TYPE_HEADER
from gyre.config import GyreConfig, load_config
from gyre.store import Counters, ExecutionRecord, GroupRecord, Keys, Records
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev


def run_config(
    run_id: str, run_dir: Path, nats_url: str, redis_url: str, proxy_port: int = 0, **sections: dict[str, Any]
) -> GyreConfig:
    """A config for one test run; `sections` override whole-section keys (e.g. runner={...})."""
    overrides: dict[str, Any] = {
        "run": {"id": run_id, "dir": str(run_dir)},
        "nats": {"url": nats_url},
        "redis": {"url": redis_url},
        "proxy": {"port": proxy_port},
        "log": {"format": "console", "level": "warning"},
    }
    for name, values in sections.items():
        overrides[name] = {**overrides.get(name, {}), **values}
    return load_config(None, environ={}, overrides=overrides)


class EventLog:
    """Every event published in a run, decoded, in arrival order."""

    def __init__(self) -> None:
        self.events: list[Message] = []
        self._changed = asyncio.Event()

    @classmethod
    async def attach(cls, bus: EventBus) -> EventLog:
        log = cls()

        async def on_msg(msg: Msg) -> None:
            log.events.append(decode_event((msg.headers or {}).get(TYPE_HEADER, ""), msg.data))
            log._changed.set()

        await bus.nc.subscribe(f"gyre.{bus.run_id}.>", cb=on_msg)
        return log

    def of(self, kind: type[Message], where: Callable[[Any], bool] = lambda e: True) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind) and where(e)]

    async def wait_for(
        self,
        kind: type[Message],
        count: int = 1,
        where: Callable[[Any], bool] = lambda e: True,
        timeout_s: float = 30.0,
    ) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        while len(found := self.of(kind, where)) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"{len(found)}/{count} {kind.__name__} events after {timeout_s} s: {found}"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(left, 0.5))
        return found


async def dispatch_group(
    bus: EventBus,
    redis: Any,
    keys: Keys,
    group_id: str,
    task_id: str,
    size: int,
    harness_timeout_s: float = 0.0,
    overall_budget_s: float = 0.0,
    policy_version: int = 0,
    publish: bool = True,
) -> list[str]:
    """What the scheduler does at dispatch: records, counter d, one start request per execution."""
    eids = [f"{group_id}-e{i}" for i in range(size)]
    group = GroupRecord(group_id, task_id, task_id, tuple(eids), policy_version, 0, int(time.time() * 1000))
    execs = [
        ExecutionRecord(e, group_id, i, task_id, task_id, harness_timeout_s, overall_budget_s)
        for i, e in enumerate(eids)
    ]
    await Records(redis, keys).put_group(group, execs)
    await Counters(redis, keys).add("dispatched", size, token=f"dispatch:{group_id}")
    if publish:
        for i, eid in enumerate(eids):
            await bus.publish(
                ev.ExecutionStartRequested(
                    execution=cm.ExecutionRef(
                        execution_id=eid, group_id=group_id, index_in_group=i, query_id=task_id
                    ),
                    task_id=task_id,
                    engine_id="cell-0",
                    harness_timeout_s=harness_timeout_s,
                    overall_budget_s=overall_budget_s,
                    profile="generic",
                ),
                event_id=f"exec.start:{eid}",
            )
    return eids


def write_task(
    root: Path,
    name: str,
    prompt: str,
    verifier: list[str],
    harness_timeout_s: float = 30.0,
    overall_budget_s: float = 60.0,
    files: dict[str, str] | None = None,
) -> str:
    """An on-disk task under `root` (a task directory); returns its id `<root name>/<name>`."""
    task_dir = root / name
    task_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "prompt": prompt,
        "verifier": verifier,
        "harness_timeout_s": harness_timeout_s,
        "overall_budget_s": overall_budget_s,
        "files": files or {},
    }
    (task_dir / "task.yaml").write_text(yaml.safe_dump(spec))
    return f"{root.name}/{name}"


async def stream_events(bus: EventBus, kind: type[Message]) -> list[Any]:
    """Every event of `kind` stored in the run's stream (duplicates JetStream dropped are absent)."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    from gyre.bus import event_stream, subject_for

    subject = subject_for(bus.run_id, kind)
    psub = await bus.js.pull_subscribe(
        subject,
        stream=event_stream(bus.run_id).name,
        config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
    )
    found: list[Any] = []
    try:
        while True:
            try:
                msgs = await psub.fetch(batch=100, timeout=0.5)
            except Exception:  # nats TimeoutError: the stream holds no more
                break
            found += [decode_event((m.headers or {}).get(TYPE_HEADER, ""), m.data) for m in msgs]
    finally:
        await psub.unsubscribe()
    return found


REPO = Path(__file__).resolve().parents[2]


class RunnerProcess:
    """`python -m services.runner` as a separate process (so it can be SIGKILLed)."""

    def __init__(self, config: GyreConfig, run_dir: Path) -> None:
        self.config_path = run_dir / "runner.yaml"
        self.config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
        self.log = run_dir / "runner.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.runner", "--config", str(self.config_path)],
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
