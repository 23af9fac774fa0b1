"""The embedded engine (`services.cell_agent.engine.EngineServer`) hosted in the cell agent's process and
driven in-process: exact in-flight counts, weight updates without serialization. Its HTTP API (SGLang's
native API) serves the proxy."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import torch
from prometheus_client import CollectorRegistry

from gyre.config.engine import EngineSection
from gyre.engine.adapters import adapter_name, stale_adapters
from gyre.model.lora import LoraAdapter, read_adapter_dir
from gyre.model.lora_spec import CONFIG_FILE as ADAPTER_CONFIG
from services.cell_agent.engine import EngineServer
from services.cell_agent.engine_hosts.base import EngineHost


class EmbeddedEngineHost(EngineHost):
    name: ClassVar[str] = "embedded"

    def __init__(self, section: EngineSection, model_dir: Path, *, log_path: Path | None = None) -> None:
        super().__init__(section, model_dir, log_path=log_path)
        self.server = EngineServer(section, model_dir=model_dir)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def metrics_registry(self) -> CollectorRegistry | None:
        return self.server.metrics_registry

    async def start(self) -> None:
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop()

    async def num_in_flight(self) -> int:
        core = self.server.core
        return await core.control(lambda: core.num_running + core.num_waiting)

    async def hand_back(self) -> int:
        core = self.server.core

        def abort_all() -> int:
            count = core.num_running + core.num_waiting
            core.pause("abort")
            return count

        return await core.control(abort_all)

    async def release(self, *, weights: bool) -> None:
        await self.server.release_memory(["kv_cache", "weights"] if weights else ["kv_cache"])
        self.weights_released = self.weights_released or weights

    async def resume(self) -> None:
        await self.server.resume_memory(["kv_cache", "weights"] if self.weights_released else ["kv_cache"])

    async def load_weights(self, path: Path, version: int) -> None:
        if (Path(path) / ADAPTER_CONFIG).is_file():
            adapter = await asyncio.to_thread(read_adapter_dir, Path(path), self.server.arch)
            await self._serve_adapter(adapter, str(path), version)
            return
        await self.server.update_weights_from_disk(path, weight_version=str(version))
        self.weights_released = False

    async def push_adapter(self, adapter: LoraAdapter, version: int) -> None:
        await self._serve_adapter(adapter, "__tensor__", version)

    async def _serve_adapter(self, adapter: LoraAdapter, path: str, version: int) -> None:
        """`gyre.engine.adapters.serve_adapter`, in-process (the base weights come back first if released)."""
        if self.weights_released:
            await self.server.update_weights_from_disk(self.model_dir, weight_version="0")
            self.weights_released = False
        name = adapter_name(version)
        assert name is not None
        if name not in self.server.adapters.loaded():
            await self.server.load_adapter(name, adapter, path)
        await self.server.set_weight_version(str(version))
        for stale in stale_adapters(self.server.adapters.loaded(), version):
            await self.server.unload_adapter(stale)

    async def push_weights(
        self, named: Mapping[str, torch.Tensor], version: int, *, abort_requests: bool = False
    ) -> None:
        await self.server.update_weights(
            named, weight_version=str(version), abort_all_requests=abort_requests
        )
        self.weights_released = False

    async def reopen(self) -> None:
        core = self.server.core
        await core.control(core.resume)

    async def wait_ready(self, timeout_s: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self.server.healthy:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"the embedded engine at {self.url} is not ready after {timeout_s} s")
            await asyncio.sleep(0.01)

    async def weight_version(self) -> str:
        return self.server.core.source.weight_version
