"""The rollout engine a cell hosts, behind one interface for the role switches.

    embedded   the embedded engine in this process (`services.cell_agent.engine.EngineServer`),
               driven in-process: exact in-flight counts, weight updates without serialization
    sglang     an SGLang server launched and supervised by the cell (`gyre.engine.SGLangLauncher`),
               driven over its HTTP API with `gyre.engine.EngineClient`

The engine process lives as long as the cell agent; a switch to training only stops admission,
aborts what is in flight (the proxy retries it on another engine) and releases memory:

    n = await host.hand_back()                   # requests handed back for reroute
    await host.release(weights=False)            # KV cache (and weights where configured)
    ...
    await host.resume()                          # memory back
    await host.load_weights(path, version=4)     # newest published weights
    await host.reopen()                          # admit again

A run that trains a LoRA adapter publishes PEFT adapter directories: `load_weights` of one loads it as
the policy adapter of its version (`gyre.engine.adapters`: loaded, the weight version set, adapters
older than the previous one unloaded) on top of the base weights, and `push_adapter` does the same
with the adapter in hand.

To add a host: subclass `EngineHost`, set `name`, implement the methods, add it to `ENGINE_HOSTS`;
`cell_agent.engine.backend` selects it. The HTTP path is tested against the embedded engine's HTTP API
(the same SGLang-native API a real SGLang serves).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from prometheus_client import CollectorRegistry

from gyre.config.engine import EngineSection
from gyre.config.model import ModelSection
from gyre.engine import EngineClient
from gyre.engine.adapters import adapter_name, serve_adapter, stale_adapters
from gyre.engine.sglang_launcher import SGLangLauncher
from gyre.model.lora import LoraAdapter, read_adapter_dir
from gyre.model.lora_spec import CONFIG_FILE as ADAPTER_CONFIG
from gyre.model.lora_spec import adapter_config
from services.cell_agent.engine import EngineServer


class EngineHost(ABC):
    name: ClassVar[str]

    def __init__(self, section: EngineSection, model_section: ModelSection) -> None:
        self.section = section
        self.model_section = model_section
        self.weights_released = False

    @property
    @abstractmethod
    def url(self) -> str: ...

    @property
    def metrics_registry(self) -> CollectorRegistry | None:
        """The engine's Prometheus series when they live in this process (None: the engine serves its own)."""
        return None

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    @abstractmethod
    async def hand_back(self) -> int:
        """Stop admitting and abort every request in flight (running or queued); returns how many."""

    @abstractmethod
    async def release(self, *, weights: bool) -> None:
        """Release the KV cache (and the weights if `weights`)."""

    @abstractmethod
    async def resume(self) -> None:
        """Take back the memory released by `release`."""

    @abstractmethod
    async def load_weights(self, path: Path, version: int) -> None:
        """Serve the weights of a published directory as `version`; the prefix cache is flushed. A
        PEFT adapter directory is served as the policy adapter of `version` on the base weights."""

    @abstractmethod
    async def push_adapter(self, adapter: LoraAdapter, version: int) -> None:
        """Serve `adapter` as the policy adapter of `version` (a LoRA run's publication)."""

    @abstractmethod
    async def push_weights(
        self, named: Mapping[str, torch.Tensor], version: int, *, abort_requests: bool = False
    ) -> None:
        """Serve these weights as `version`; the prefix cache is flushed; running requests continue
        under the new weights unless `abort_requests`."""

    @abstractmethod
    async def reopen(self) -> None:
        """Admit requests again."""

    @abstractmethod
    async def wait_ready(self, timeout_s: float) -> None: ...

    @abstractmethod
    async def weight_version(self) -> str: ...


class EmbeddedEngineHost(EngineHost):
    name: ClassVar[str] = "embedded"

    def __init__(self, section: EngineSection, model_section: ModelSection) -> None:
        super().__init__(section, model_section)
        self.server = EngineServer(section, model_dir=model_section.require_path())

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
            await self.server.update_weights_from_disk(self.model_section.require_path(), weight_version="0")
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


class HttpEngineHost(EngineHost):
    """Drives an engine that serves the SGLang-native HTTP API at `base_url` (started elsewhere)."""

    name: ClassVar[str] = "http"

    def __init__(self, section: EngineSection, model_section: ModelSection, base_url: str = "") -> None:
        super().__init__(section, model_section)
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
        info = await self.client.get_server_info()
        states: list[dict[str, Any]] = list(info.get("internal_states") or [{}])
        count = sum(int(s.get("num_running_reqs", 0)) + int(s.get("num_waiting_reqs", 0)) for s in states)
        await self.client.pause_generation("abort")
        return count

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
        config = adapter_config(adapter.spec, adapter.targets, str(self.model_section.require_path()))
        await serve_adapter(self.client, version, tensors=adapter.tensors(), config=config)

    async def _base_back(self) -> None:
        """Weights released on the way into training come back as the base before an adapter loads."""
        if self.weights_released:
            await self.client.update_weights_from_disk(
                str(self.model_section.require_path()), weight_version="0"
            )
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


class SGLangEngineHost(HttpEngineHost):
    """An SGLang server launched by the cell (GPU nodes), then driven like any HTTP engine."""

    name: ClassVar[str] = "sglang"

    def __init__(self, section: EngineSection, model_section: ModelSection) -> None:
        if not section.sglang_model_path:
            section = section.model_copy(update={"sglang_model_path": str(model_section.require_path())})
        super().__init__(section, model_section)
        self.launcher = SGLangLauncher(section)
        self._base_url = self.launcher.url

    async def start(self) -> None:
        await self.launcher.start()
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        await self.launcher.stop()


ENGINE_HOSTS: dict[str, type[EngineHost]] = {
    EmbeddedEngineHost.name: EmbeddedEngineHost,
    SGLangEngineHost.name: SGLangEngineHost,
}


def create_engine_host(section: EngineSection, model_section: ModelSection) -> EngineHost:
    """The host of `section.backend` (`embedded` or `sglang`)."""
    try:
        cls = ENGINE_HOSTS[section.backend]
    except KeyError:
        raise ValueError(
            f"cell_agent.engine.backend {section.backend!r} has no engine host; available: {', '.join(ENGINE_HOSTS)}"
        ) from None
    return cls(section, model_section)
