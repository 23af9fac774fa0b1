"""The shell every Gyre service shares: config → NATS + Redis + gRPC (with grpc.health.v1) → run.

A service subclasses `GyreService`, registers its servicers and consumers in `setup()`, and is an
async context manager with an idempotent, time-capped `stop()`. Shutdown order: health to
NOT_SERVING → `/metrics` closed → drain NATS → `server.stop(grace)` → `teardown()` → close Redis.
Every service serves Prometheus `/metrics` on `run.host:metrics.port` (gyre/metrics/listener.py) from
`metrics_registry` (its own series, added in `setup()`) plus `metrics_registries()`; the port is in
the endpoint file `runs/<run>/services/<name>.json` (`metrics_port`) that `gyre status` reads. Entry
points are three lines:

    def main() -> None:
        run_service(SchedulerService)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

import grpc
import redis.asyncio as aioredis
from grpc_health.v1 import health, health_pb2
from prometheus_client import CollectorRegistry

from gyre import tls
from gyre.bus import EventBus
from gyre.config import ConfigError, GyreConfig, load_config
from gyre.errors import StartupError
from gyre.lifecycle import TaskSupervisor, hold_grpc_aio, install_signal_handlers
from gyre.log import bind_context, configure_logging, get_logger
from gyre.metrics import CombinedRegistry, MetricsListener, process_registry
from gyre.rpc import INVALID_ARGUMENT, ErrorStatus, add_health, bind, new_server
from gyre.store import Keys, connect_redis
from gyre.tls import tls_files


class GyreService:
    """Base of the six services; subclasses set `name` and override `setup`/`teardown`."""

    name: ClassVar[str] = "service"
    error_statuses: ClassVar[tuple[ErrorStatus, ...]] = (INVALID_ARGUMENT,)
    """The gRPC status of each domain error the service's handlers raise (`gyre.rpc`), first match wins."""

    def __init__(self, config: GyreConfig, instance: int | None = None) -> None:
        self.config = config
        self.instance = instance
        self.instance_name = self.name if instance is None else f"{self.name}-{instance}"
        self.log = get_logger(f"gyre.{self.name}")
        self.keys = Keys(config.run.id)
        self.redis: aioredis.Redis
        self.bus: EventBus
        self.server: grpc.aio.Server
        self.health: health.aio.HealthServicer
        self.grpc_port = 0
        self.metrics_registry = process_registry(self.name, self.instance_name, config.run.id)
        """This process's Prometheus series; a service adds its own in `setup()`."""
        self.metrics_listener: MetricsListener | None = None
        self._stopped = False
        self._started = False

    # -- hooks -------------------------------------------------------------------------------------
    def configured_port(self) -> int:
        """The gRPC port from this service's config section (0 = pick a free one)."""
        section = getattr(self.config, self.name)
        return int(section.port)

    async def setup(self) -> None:
        """Register servicers on `self.server`, start consumers under `self.supervisor`."""

    async def teardown(self) -> None:
        """Release what `setup` acquired (called after the gRPC server stopped)."""

    def endpoint_info(self) -> dict[str, Any]:
        """Extra fields written to the service's endpoint file (e.g. an HTTP port)."""
        return {}

    def metrics_registries(self) -> list[CollectorRegistry]:
        """Registries `/metrics` serves besides `metrics_registry` (one a component keeps on its own)."""
        return []

    # -- lifecycle ---------------------------------------------------------------------------------
    async def __aenter__(self) -> GyreService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        bind_context(run=self.config.run.id, service=self.instance_name)
        if not self.config.nats.url or not self.config.redis.url:
            raise ConfigError("nats.url and redis.url must be set for a service (gyre up sets them)")
        try:
            nats_login, redis_login = (
                self.config.nats.login_for(self.name),
                self.config.redis.login_for(self.name),
            )
            # every server and client from here on; a cell agent's certificate must be its own cell's
            cell = (self.instance or 0) if self.name == tls.CELL_AGENT else None
            tls.configure(tls_files(self.config.tls, self.name, cell))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.supervisor = TaskSupervisor(self.instance_name)
        self.redis = await connect_redis(self.config.redis.url, redis_login)
        self.bus = await EventBus.connect(
            self.config.nats.url, self.config.run.id, self.instance_name, login=nats_login
        )
        self.server = new_server(self.error_statuses)
        self.health = add_health(self.server)
        await self.health.set(health.OVERALL_HEALTH, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.setup()
        self.grpc_port = bind(self.server, f"{self.config.run.host}:{self.configured_port()}")
        await self.server.start()
        self._started = True
        if self.config.metrics.serve:
            self.metrics_listener = MetricsListener(
                CombinedRegistry([self.metrics_registry, *self.metrics_registries()]),
                host=self.config.run.host,
                port=self.config.metrics.port,
            )
            await self.metrics_listener.start()
        await self.health.set(health.OVERALL_HEALTH, health_pb2.HealthCheckResponse.SERVING)
        self._write_endpoint()
        self.log.info(
            "service_serving",
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
            **self.endpoint_info(),
        )

    @property
    def metrics_port(self) -> int:
        """Port of this process's `/metrics` (0 before it listens, or with `metrics.serve: false`)."""
        return self.metrics_listener.port if self.metrics_listener is not None else 0

    async def serve(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set or a supervised task crashes (the crash is re-raised)."""
        stop_wait = asyncio.create_task(stop.wait())
        crash_wait = asyncio.create_task(self.supervisor.wait())
        done, pending = await asyncio.wait({stop_wait, crash_wait}, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        if crash_wait in done:
            crash_wait.result()

    async def stop(self, grace_s: float = 5.0) -> None:
        """Health NOT_SERVING → drain NATS → stop gRPC → teardown → close Redis. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._started:
            await self.health.enter_graceful_shutdown()
        if self.metrics_listener is not None:
            await self.metrics_listener.stop()
        if hasattr(self, "supervisor"):
            await self.supervisor.stop(timeout_s=grace_s)
        if hasattr(self, "bus"):
            await self.bus.close()
        if self._started:
            await self.server.stop(grace_s)
        await asyncio.wait_for(self.teardown(), timeout=grace_s * 2)
        if hasattr(self, "redis"):
            await self.redis.aclose()
        self._endpoint_file().unlink(missing_ok=True)
        self.log.info("service_stopped")

    # -- endpoint file (read by `gyre status`) -------------------------------------------------------
    def _endpoint_file(self) -> Path:
        return self.config.run.path / "services" / f"{self.instance_name}.json"

    def _write_endpoint(self) -> None:
        path = self._endpoint_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        info = {
            "name": self.instance_name,
            "pid": os.getpid(),
            "grpc_port": self.grpc_port,
            "metrics_port": self.metrics_port,
            **self.endpoint_info(),
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(path)


def run_service(cls: type[GyreService], argv: list[str] | None = None) -> None:
    """Parse `--config F [--instance K]`, configure logging, serve until SIGTERM/SIGINT.

    Shutdown is bounded: `run.supervisor.service_stop_timeout_s` after the stop began (a signal or a
    crash), the process exits at once, whatever its `stop()` still waits for (a compute thread mid-step,
    a sandbox that ignores SIGTERM). The stack's supervisor SIGKILLs later still; this bound holds too
    when no supervisor is left (it was killed: the kernel sends SIGTERM, see gyre/procs.py)."""
    parser = argparse.ArgumentParser(prog=f"python -m services.{cls.name}", description=cls.__doc__)
    parser.add_argument("--config", type=Path, default=None, help="resolved YAML config (gyre up writes one)")
    parser.add_argument("--instance", type=int, default=None, help="instance index (cell agents: the cell)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    configure_logging(config.log.format, config.log.level)

    stop_timeout_s = config.run.supervisor.service_stop_timeout_s

    async def main() -> None:
        hold_grpc_aio()
        stop = asyncio.Event()
        install_signal_handlers(stop)
        service = cls(config, args.instance)
        try:
            await service.start()
            # What starting built (modules: transformers, torch, jinja; the model's tokenizer and template;
            # the config) lives as long as the process: out of the collector's generations, a full
            # collection no longer walks it (the proxy's start-up heap alone: ~110,000 objects, 116 ms here).
            gc.freeze()
            await service.serve(stop)
        finally:
            exit_after(stop_timeout_s, service.log)
            await service.stop()

    try:
        asyncio.run(main())
    except StartupError as e:  # found while starting (config, model, tasks, template): one line, exit 2
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception:  # a crash: logged once, here, as a JSON line with its traceback (not a bare traceback)
        get_logger(f"gyre.{cls.name}").exception("service_failed")
        raise SystemExit(1) from None


def exit_after(timeout_s: float, log: Any) -> threading.Timer:
    """Exit the process (status 1) `timeout_s` from now unless it has exited by then: a stop's hard cap."""

    def hard_exit() -> None:
        log.error("service_stop_timed_out", timeout_s=timeout_s)
        os._exit(1)

    timer = threading.Timer(timeout_s, hard_exit)
    timer.daemon = True
    timer.start()
    return timer
