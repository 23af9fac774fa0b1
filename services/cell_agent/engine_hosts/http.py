"""An engine that serves SGLang's native HTTP API at a URL, driven over HTTP with `gyre.engine.EngineClient`:
the base of the SGLang host (which launches its server), and on its own a server started elsewhere (the
embedded engine's HTTP API in tests)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from gyre.config.engine import EngineSection
from gyre.engine import EngineClient
from gyre.engine.adapters import serve_adapter
from gyre.model.lora import LoraAdapter
from gyre.model.lora_spec import CONFIG_FILE as ADAPTER_CONFIG
from gyre.model.lora_spec import adapter_config
from services.cell_agent.engine_hosts.base import EngineHost

SGLANG_IN_FLIGHT_GAUGES = ("sglang:num_running_reqs{", "sglang:num_queue_reqs{")
"""SGLang's Prometheus gauges of requests running and queued (`--enable-metrics`, set by the launcher)."""


class HttpEngineHost(EngineHost):
    """Drives an engine that serves the SGLang-native HTTP API at `base_url` (started elsewhere)."""

    name: ClassVar[str] = "http"

    def __init__(
        self, section: EngineSection, model_dir: Path, base_url: str = "", *, log_path: Path | None = None
    ) -> None:
        super().__init__(section, model_dir, log_path=log_path)
        self._base_url = base_url
        self._client: EngineClient | None = None

    @property
    def url(self) -> str:
        return self._base_url

    @property
    def client(self) -> EngineClient:
        if self._client is None:
            self._client = EngineClient(self.url, timeout_s=600.0)
        return self._client

    async def start(self) -> None:
        await self.client.wait_healthy(timeout_s=60.0)

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def hand_back(self) -> int:
        count = await self.num_in_flight()
        await self.client.pause_generation("abort")
        return count

    async def num_in_flight(self) -> int:
        """Requests running or queued: the server's internal states where they say (the embedded engine),
        else SGLang's own gauges on `/metrics` (SGLang 0.5.23 reports no counts in `/get_server_info`; its
        scheduler refreshes the gauges when it prefills and every 40 decode steps, so a count may trail)."""
        info = await self.client.get_server_info()
        states: list[dict[str, Any]] = list(info.get("internal_states") or [{}])
        if any("num_running_reqs" in s for s in states):
            return sum(int(s.get("num_running_reqs", 0)) + int(s.get("num_waiting_reqs", 0)) for s in states)
        reply = await self.client.request("GET", "/metrics")
        total = 0.0
        for line in reply.content.decode().splitlines():
            if line.startswith(SGLANG_IN_FLIGHT_GAUGES):
                total += float(line.rsplit(" ", 1)[1])
        return int(total)

    async def release(self, *, weights: bool) -> None:
        await self.client.release_memory_occupation(["kv_cache", "weights"] if weights else ["kv_cache"])
        self.weights_released = self.weights_released or weights

    async def resume(self) -> None:
        await self.client.resume_memory_occupation(
            ["kv_cache", "weights"] if self.weights_released else ["kv_cache"]
        )

    async def load_weights(self, path: Path, version: int) -> None:
        if (Path(path) / ADAPTER_CONFIG).is_file():
            await self._base_back()
            await serve_adapter(self.client, version, path=str(path))
            return
        await self.client.update_weights_from_disk(str(path), weight_version=str(version))
        self.weights_released = False

    async def push_adapter(self, adapter: LoraAdapter, version: int) -> None:
        await self._base_back()
        config = adapter_config(adapter.spec, adapter.targets, str(self.model_dir))
        await serve_adapter(self.client, version, tensors=adapter.tensors(), config=config)

    async def _base_back(self) -> None:
        """Weights released on the way into training come back as the base before an adapter loads."""
        if self.weights_released:
            await self.client.update_weights_from_disk(str(self.model_dir), weight_version="0")
            self.weights_released = False

    async def push_weights(
        self, named: Mapping[str, torch.Tensor], version: int, *, abort_requests: bool = False
    ) -> None:
        await self.client.update_weights_from_tensor(
            named, weight_version=str(version), abort_all_requests=abort_requests
        )
        self.weights_released = False

    async def reopen(self) -> None:
        await self.client.continue_generation()

    async def wait_ready(self, timeout_s: float) -> None:
        await self.client.wait_healthy(timeout_s=timeout_s, poll_s=0.05)

    async def weight_version(self) -> str:
        return await self.client.get_weight_version() or ""
