"""A running proxy for tests: the real ProxyService (NATS, Redis, gRPC, HTTP) in this event loop,
embedded engines behind it, and helpers to open executions, route, script outputs and read trees.

    async with proxy_stack(nats_server.url, redis_server.url, tmp_path, run_id,
                           engines={"cell-0": scripted_section()}) as stack:
        key = await stack.open("e1", profile="claude_code")
        await stack.script("cell-0", ["Hello.<|im_end|>"])
        ...                                          # a client calls stack.base_url with `key`
        tree = stack.tree("e1")

Engines are `EngineServer`s of the embedded engine: `scripted` (outputs from a queue — the only
double allowed in the harness conformance tests: it stands in for the model, not the harness)
or `model` (a small Llama in the demo model's format; engines with the same seed serve the same
policy). Every engine and the proxy read the same byte tokenizer and chat template.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import httpx

from gyre.config import GyreConfig
from gyre.config.engine import EngineSection
from gyre.store.trees import TreeStore
from gyre.trajectory import TrajectoryTree
from gyre.v1 import common_pb2, proxy_pb2, proxy_pb2_grpc
from services.cell_agent.engine import EngineServer
from services.proxy.service import ProxyService
from tests.support.models import byte_dir

T = TypeVar("T")
SCRIPTED_CONTEXT = 4_000_000
"""Context length of scripted engines: a Claude Code history near compaction is ~1M byte tokens."""


def scripted_model_dir() -> Path:
    """The model directory of scripted engines and of the proxy (its weights never run)."""
    return byte_dir(0, SCRIPTED_CONTEXT, num_hidden_layers=1)


def scripted_ids(text: str) -> list[int]:
    """The ids a scripted engine emits for `text` (special-token strings are their ids)."""
    from gyre.model.tokenizer import Tokenizer

    return Tokenizer.from_dir(scripted_model_dir()).encode(text)


@dataclass(frozen=True)
class EngineSpec:
    section: EngineSection
    model_dir: Path
    cell: int = 0


def scripted_engine(cell: int = 0, **section: Any) -> EngineSpec:
    return EngineSpec(
        EngineSection(output_source="scripted", kv_cache_tokens=8192, **section), scripted_model_dir(), cell
    )


def model_engine(cell: int = 0, seed: int = 0, max_seq_len: int = 2048, **section: Any) -> EngineSpec:
    return EngineSpec(
        EngineSection(output_source="model", **{"kv_cache_tokens": 65536, "max_batch_size": 64, **section}),
        byte_dir(seed, max_seq_len),
        cell,
    )


@dataclass
class ProxyStack:
    service: ProxyService
    stub: proxy_pb2_grpc.ProxyStub
    engines: dict[str, EngineServer]
    http: httpx.AsyncClient

    @property
    def base_url(self) -> str:
        return self.service.core.base_url

    async def open(self, execution_id: str, profile: str = "generic", engine_id: str = "") -> str:
        response = await self.stub.OpenExecution(
            proxy_pb2.OpenExecutionRequest(
                execution=common_pb2.ExecutionRef(execution_id=execution_id, group_id="g"),
                profile=profile,
                engine_id=engine_id,
            )
        )
        assert response.base_url == self.base_url
        return response.api_key

    async def close(self, execution_id: str) -> proxy_pb2.CloseExecutionResponse:
        return await self.stub.CloseExecution(proxy_pb2.CloseExecutionRequest(execution_id=execution_id))

    async def route(self, default_engine_id: str, routes: Mapping[str, str] | None = None) -> None:
        engines = [
            common_pb2.EngineEndpoint(engine_id=name, url=server.url, cell=i)
            for i, (name, server) in enumerate(self.engines.items())
        ]
        await self.stub.UpdateRoutes(
            proxy_pb2.UpdateRoutesRequest(
                engines=engines,
                routes=[proxy_pb2.Route(execution_id=e, engine_id=g) for e, g in (routes or {}).items()],
                default_engine_id=default_engine_id,
            )
        )

    async def script(self, engine_id: str, texts: Sequence[str | Mapping[str, Any]]) -> None:
        entries = [{"text": t} if isinstance(t, str) else dict(t) for t in texts]
        response = await self.http.post(
            f"{self.engines[engine_id].url}/gyre/script", json={"entries": entries}
        )
        response.raise_for_status()

    async def script_status(self, engine_id: str) -> dict[str, Any]:
        response = await self.http.get(f"{self.engines[engine_id].url}/gyre/script")
        return dict(response.json())

    async def stats(self) -> proxy_pb2.ProxyStats:
        return await self.stub.GetStats(proxy_pb2.GetStatsRequest())

    def tree(self, execution_id: str) -> TrajectoryTree:
        """The proxy's live tree of an execution (opened or loaded in this process)."""
        state = self.service.core.executions.in_memory(execution_id)
        assert state is not None, f"{execution_id} is not open in this proxy"
        return state.tree

    async def stored_tree(self, execution_id: str) -> TrajectoryTree:
        """The tree as Redis holds it (what a restarted proxy or the packer reads)."""
        return await TreeStore(self.service.redis, self.service.keys).load(execution_id)


@asynccontextmanager
async def proxy_stack(
    nats_url: str,
    redis_url: str,
    run_dir: Path,
    run_id: str,
    engines: Mapping[str, EngineSpec | EngineServer],
    proxy: Mapping[str, Any] | None = None,
    default_engine: str | None = None,
    send_routes: bool = True,
) -> AsyncIterator[ProxyStack]:
    """Engines given as `EngineServer`s are used as they are (they outlive the stack); `send_routes`
    off leaves routing to what the proxy restores from Redis."""
    config = GyreConfig.model_validate(
        {
            "run": {"id": run_id, "dir": str(run_dir)},
            "nats": {"url": nats_url},
            "redis": {"url": redis_url},
            "proxy": {"default_profile": "generic", **(proxy or {})},
            "model": {"path": str(scripted_model_dir())},
        }
    )
    async with AsyncExitStack() as stack:
        servers: dict[str, EngineServer] = {}
        for name, spec in engines.items():
            if isinstance(spec, EngineServer):
                servers[name] = spec
            else:
                server = EngineServer(spec.section, model_dir=spec.model_dir)
                servers[name] = await stack.enter_async_context(server)
        service = ProxyService(config)
        await service.start()
        stack.push_async_callback(service.stop)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}")
        stack.push_async_callback(channel.close)
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=60))
        result = ProxyStack(service, proxy_pb2_grpc.ProxyStub(channel), servers, http)
        if servers and send_routes:
            await result.route(default_engine or next(iter(servers)))
        yield result


class ThreadedStack:
    """A `proxy_stack` on its own event loop in a background thread, for synchronous tests
    (hypothesis drives plain functions): `run(coro)` executes a coroutine on that loop."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args, self._kwargs = args, kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="proxy-stack", daemon=True)
        self._context: Any = None
        self.stack: ProxyStack

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=120)

    def __enter__(self) -> ThreadedStack:
        self._thread.start()
        self._context = proxy_stack(*self._args, **self._kwargs)
        self.stack = self.run(self._context.__aenter__())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.run(self._context.__aexit__(None, None, None))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
