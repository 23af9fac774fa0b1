"""Routing of model calls to rollout engines, and the drain of an engine that leaves rollout.

The scheduler owns the decisions; the router applies them:
- the engine table (`UpdateRoutes.engines`): engines the proxy may call, each with an
  `EngineClient`; an engine listed in a new table serves again even if it was drained before;
- routes: execution → engine. Calls stick to their execution's engine (its prefix cache holds
  the history); an execution without a usable route is assigned once, to the default engine or
  else the first engine in destination order, and keeps it;
- `drain(engine, destinations, migrate_kv)`: the engine takes no new calls; executions routed to
  it move to the first serving destination (the scheduler reserves per-execution capacity with
  `UpdateRoutes` before it drains; this is the fallback); every call in flight on it is marked
  as moving, its KV is pinned, exported and imported on the destination when asked and possible
  (`gyre.engine.migration`), and it is aborted there — re-aborted until its attempt ends, which
  also catches a request still on its way to the engine. The call then continues on the
  destination from the tokens already generated (generation.py).

Destination order when the scheduler names none: the separate pool (cell < 0) first, then
rollout cells in reverse index order (docs/design.md: the one expected to stay longest).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gyre.engine import EngineClient, EngineError, EngineNotFound
from gyre.engine.adapters import adapter_name
from gyre.engine.migration import migrate_request_kv
from gyre.log import get_logger
from services.proxy.errors import EngineUnavailableError

log = get_logger("gyre.proxy.routing")
_REABORT_INTERVAL_S = 0.2


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """An engine of the table: id, base URL of its SGLang-native API, cell (-1 = separate pool)."""

    engine_id: str
    url: str
    cell: int = -1


@dataclass(slots=True, eq=False)
class Engine:
    spec: EngineSpec
    client: EngineClient
    serving: bool = True
    """False once drained (until a new engine table lists it again)."""
    context_len: int | None = None
    context_known: bool = False
    weight_version: str | None = None
    """The weight version the engine reported last (None: ask it before the next call)."""

    @property
    def engine_id(self) -> str:
        return self.spec.engine_id


@dataclass(slots=True)
class DrainResult:
    executions_moved: int = 0
    calls_rerouted: int = 0
    kv_migrated_tokens: int = 0
    destinations: list[str] = field(default_factory=list)


class RoutedCall(Protocol):
    """What the router needs of a model call it routes and drains (`Generation`, generation.py, which
    imports this module): its execution, the engine and request of its attempt in flight, and the moves."""

    execution_id: str
    engine: Engine | None
    """Engine of the attempt in flight; the router sets it when the call acquires one and clears it after."""

    @property
    def rid(self) -> str | None: ...

    @property
    def finish(self) -> object | None: ...

    @property
    def attempt_in_flight(self) -> bool: ...

    def begin_move(self) -> None: ...

    def end_move(self, kv_migrated_tokens: int) -> None: ...

    async def wait_attempt_done(self, timeout_s: float) -> bool: ...


class UnknownEngineError(KeyError):
    """The scheduler named an engine the table does not hold."""


class NoDestinationError(ValueError):
    """A drain has no serving engine to move to."""


class Router:
    def __init__(self, *, engine_timeout_s: float, drain_timeout_s: float, lora: bool = False) -> None:
        self.lora = lora
        self.engine_timeout_s = engine_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.engines: dict[str, Engine] = {}
        self.routes: dict[str, str] = {}
        self.default_engine_id = ""
        self.in_flight: dict[str, set[RoutedCall]] = defaultdict(set)
        self.num_drains_active = 0
        self._retired: list[EngineClient] = []

    # -- the table ---------------------------------------------------------------------------

    def update(self, engines: Iterable[EngineSpec], routes: Mapping[str, str], default_engine_id: str) -> int:
        """Apply an `UpdateRoutes`: replace the table when `engines` is non-empty, set routes and
        the default (empty keeps it). Returns the number of routes held."""
        table = list(engines)
        if table:
            fresh: dict[str, Engine] = {}
            for spec in table:
                old = self.engines.get(spec.engine_id)
                if old is not None and old.spec.url == spec.url:
                    if not old.serving:  # back from training: it may serve other weights now
                        old.weight_version = None
                    old.spec, old.serving = spec, True
                    fresh[spec.engine_id] = old
                else:
                    fresh[spec.engine_id] = Engine(spec, self._client(spec.url))
                    if old is not None:
                        self._retired.append(old.client)
            self._retired += [e.client for k, e in self.engines.items() if k not in fresh]
            self.engines = fresh
        for execution_id, engine_id in routes.items():
            self.routes[execution_id] = engine_id
        if default_engine_id:
            self.default_engine_id = default_engine_id
        return len(self.routes)

    def _client(self, url: str) -> EngineClient:
        # One quick connect retry: a call that cannot reach its engine is retried by the generation
        # loop, on the execution's route at that moment (which a drain may have changed).
        return EngineClient(url, timeout_s=self.engine_timeout_s, max_connect_retries=1, retry_backoff_s=0.05)

    def set_route(self, execution_id: str, engine_id: str) -> None:
        self.routes[execution_id] = engine_id

    def forget(self, execution_id: str) -> None:
        self.routes.pop(execution_id, None)

    def destination_order(self, exclude: str | None = None) -> list[str]:
        """Serving engines: the separate pool first, then cells from the highest index down."""
        serving = [e for e in self.engines.values() if e.serving and e.engine_id != exclude]
        pool = sorted((e for e in serving if e.spec.cell < 0), key=lambda e: e.engine_id)
        cells = sorted((e for e in serving if e.spec.cell >= 0), key=lambda e: (-e.spec.cell, e.engine_id))
        return [e.engine_id for e in (*pool, *cells)]

    # -- calls -------------------------------------------------------------------------------

    def engine_for(self, execution_id: str) -> Engine:
        """The execution's engine; assigned (and kept) when its route is missing or not serving."""
        engine = self.engines.get(self.routes.get(execution_id, ""))
        if engine is not None and engine.serving:
            return engine
        default = self.engines.get(self.default_engine_id)
        if default is None or not default.serving:
            order = self.destination_order()
            default = self.engines[order[0]] if order else None
        if default is None:
            raise EngineUnavailableError("no rollout engine is serving; the scheduler has routed none")
        self.routes[execution_id] = default.engine_id
        return default

    def fail_over(self, execution_id: str, failed_engine_id: str) -> str | None:
        """The execution's engine could not be reached (killed, restarting): route it to another serving
        engine — the default if that is another one, else the first in destination order — and return
        its id; None (route kept) when no other engine serves. The failed engine stays in the table: the
        scheduler owns it, and a restarted one serves again on the same URL."""
        default = self.engines.get(self.default_engine_id)
        if default is not None and default.serving and default.engine_id != failed_engine_id:
            target = default.engine_id
        else:
            order = self.destination_order(exclude=failed_engine_id)
            if not order:
                return None
            target = order[0]
        self.routes[execution_id] = target
        return target

    def acquire(self, generation: RoutedCall) -> Engine:
        engine = self.engine_for(generation.execution_id)
        self.in_flight[engine.engine_id].add(generation)
        generation.engine = engine
        return engine

    def release(self, generation: RoutedCall, engine: Engine) -> None:
        self.in_flight[engine.engine_id].discard(generation)
        generation.engine = None

    async def adapter_for(self, engine: Engine) -> str | None:
        """The LoRA adapter a call to `engine` names (`lora_path`), None for the base weights."""
        if not self.lora:
            return None
        if engine.weight_version is None:
            try:
                engine.weight_version = await engine.client.get_weight_version()
            except EngineError as e:
                log.warning("engine_weight_version_unavailable", engine=engine.engine_id, error=e.message)
                return None
        return adapter_name(engine.weight_version)

    @staticmethod
    def saw_version(engine: Engine, weight_version: object) -> None:
        """An answer of `engine` reported `weight_version`."""
        if weight_version is not None:
            engine.weight_version = str(weight_version)

    async def context_len(self, engine: Engine) -> int | None:
        """The engine's context length (asked once; None when it does not say)."""
        if not engine.context_known:
            info: dict[str, object] = {}
            try:
                info = await engine.client.get_server_info()
            except EngineError as e:
                log.warning("engine_info_unavailable", engine=engine.engine_id, error=e.message)
                return None
            for key in ("context_length", "max_context_length", "max_model_len"):
                value = info.get(key)
                if isinstance(value, int) and value > 0:
                    engine.context_len = value
                    break
            engine.context_known = True
        return engine.context_len

    # -- drain ---------------------------------------------------------------------------------

    async def drain(self, engine_id: str, destinations: Iterable[str], migrate_kv: bool) -> DrainResult:
        source = self.engines.get(engine_id)
        if source is None:
            raise UnknownEngineError(engine_id)
        named = [d for d in destinations if d != engine_id]
        unknown = [d for d in named if d not in self.engines]
        if unknown:
            raise UnknownEngineError(", ".join(unknown))
        order = [d for d in named if self.engines[d].serving] or self.destination_order(exclude=engine_id)
        if not order:
            if self.in_flight.get(engine_id):
                raise NoDestinationError(f"no serving engine to move {engine_id}'s calls to")
            # The last serving engine leaves with nothing in flight (every execution has finished):
            # nothing to move; later calls find no engine until one serves again.
            source.serving = False
            log.info(
                "engine_drained",
                engine=engine_id,
                destinations=[],
                executions_moved=0,
                calls_rerouted=0,
                kv_migrated_tokens=0,
            )
            return DrainResult(destinations=[])
        self.num_drains_active += 1
        try:
            source.serving = False
            result = DrainResult(destinations=order)
            for execution_id, routed in list(self.routes.items()):
                if routed == engine_id:
                    self.routes[execution_id] = order[0]
                    result.executions_moved += 1
            if self.default_engine_id == engine_id:
                self.default_engine_id = order[0]
            calls = list(self.in_flight.get(engine_id, ()))
            moved = await asyncio.gather(*(self._move(call, source, migrate_kv) for call in calls))
            result.calls_rerouted = sum(1 for m in moved if m is not None)
            result.kv_migrated_tokens = sum(m or 0 for m in moved)
            log.info(
                "engine_drained",
                engine=engine_id,
                destinations=order,
                executions_moved=result.executions_moved,
                calls_rerouted=result.calls_rerouted,
                kv_migrated_tokens=result.kv_migrated_tokens,
            )
            return result
        finally:
            self.num_drains_active -= 1

    async def _move(self, call: RoutedCall, source: Engine, migrate_kv: bool) -> int | None:
        """Stop one call's attempt on `source`; the KV tokens migrated, or None if it finished first."""
        rid = call.rid
        if rid is None or call.engine is not source or not call.attempt_in_flight:
            return None
        destination = self.engine_for(call.execution_id)
        call.begin_move()
        migrated = 0
        try:
            if migrate_kv:
                with contextlib.suppress(EngineNotFound):  # not admitted yet, or finished: nothing pinned
                    migrated = (await migrate_request_kv(source.client, destination.client, rid)).num_tokens
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.drain_timeout_s
            while call.attempt_in_flight and call.rid == rid and loop.time() < deadline:
                await source.client.abort(rid)
                await call.wait_attempt_done(_REABORT_INTERVAL_S)
        except EngineError as e:
            log.warning("drain_abort_failed", engine=source.engine_id, rid=rid, error=e.message)
        finally:
            call.end_move(migrated)
        return None if call.finish is not None else migrated

    async def aclose(self) -> None:
        clients = [e.client for e in self.engines.values()] + self._retired
        self.engines, self._retired = {}, []
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)
