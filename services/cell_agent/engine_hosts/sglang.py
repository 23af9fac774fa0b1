"""An SGLang server launched and supervised by the cell (`gyre.engine.SGLangLauncher`: GPU nodes, or CPUs
with `sglang_device: cpu`), then driven over HTTP like any engine that serves SGLang's native API.

A server that dies is restarted by the launcher (30-200 s on these CPUs) while the cell goes on: the proxy
fails its calls over to other engines meanwhile (services/proxy/generation.py). The new server starts with
the cell's newest publication (`weights_on_restart`; an adapter publication loads after the start), gets
back what the role switches had done to the dead one (admission stopped, memory released), and then the
cell's `on_restarted` runs. While no server answers, a switch to training does not wait for one (nothing
runs on it: `hand_back` returns 0, the state is applied at the restart), a push of weights fails at once
(the restart serves the newest publication), and what needs a server (a switch to rollout, loading
weights) waits for the restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from gyre.config.engine import EngineSection
from gyre.engine import EngineUnavailable
from gyre.engine.sglang_launcher import SGLangLauncher
from gyre.log import get_logger
from gyre.model.lora import LoraAdapter
from gyre.model.lora_spec import CONFIG_FILE as ADAPTER_CONFIG
from services.cell_agent.engine_hosts.http import HttpEngineHost

log = get_logger("gyre.cell_agent.engine")


class SGLangEngineHost(HttpEngineHost):
    """An SGLang server launched by the cell (GPU nodes), then driven like any HTTP engine."""

    name: ClassVar[str] = "sglang"

    def __init__(self, section: EngineSection, model_dir: Path, *, log_path: Path | None = None) -> None:
        if not section.sglang_model_path:
            section = section.model_copy(update={"sglang_model_path": str(model_dir)})
        super().__init__(section, model_dir, log_path=log_path)
        self.launcher = SGLangLauncher(section, log_path=log_path)
        self.launcher.restart_weights = self._restart_weights
        self.launcher.on_restarted = self._restarted
        self._base_url = self.launcher.url
        self._paused = False
        """Admission stopped (`hand_back`) and not reopened: a restarted server is paused again."""
        self._kv_released = False
        """Memory released (`release`) and not resumed: a restarted server releases it again."""
        self._release_weights = False
        """What the last `release` released besides the KV cache."""
        self._state = asyncio.Lock()
        """Held while admission or memory changes, so a restart restores a state no switch is changing."""

    async def start(self) -> None:
        await self.launcher.start()
        self._base_url = self.launcher.url  # a new port if the first was taken before the server bound it
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        await self.launcher.stop()

    def supervision(self) -> Coroutine[Any, Any, None] | None:
        return self.launcher.wait()

    # -- restarts ----------------------------------------------------------------------------------------

    async def _restart_weights(self) -> tuple[str, str] | None:
        """The cell's newest publication as the restarted server's model (an adapter: loaded after it starts)."""
        weights = await self.weights_on_restart() if self.weights_on_restart is not None else None
        if weights is None or (weights[0] / ADAPTER_CONFIG).is_file():
            return None
        return str(weights[0]), str(weights[1])

    async def _restarted(self) -> None:
        async with self._state:
            self.weights_released = False  # a new server holds the weights it started with
            if self._paused:
                await self.client.pause_generation("abort")
            if self._kv_released:
                await super().release(weights=self._release_weights)
        log.info("engine_restored", url=self.url, paused=self._paused, released=self._kv_released)
        if self.on_restarted is not None:
            await self.on_restarted()

    async def _serving(self) -> None:
        """Wait for a server while the launcher restarts one."""
        if not self.launcher.up:
            launcher = self.launcher
            await launcher.wait_up(
                launcher.startup_timeout_s + launcher.restart_backoff_s * launcher.max_restarts
            )

    # -- the role switches ---------------------------------------------------------------------------------

    async def hand_back(self) -> int:
        async with self._state:
            self._paused = True
            return await super().hand_back() if self.launcher.up else 0

    async def release(self, *, weights: bool) -> None:
        async with self._state:
            self._kv_released, self._release_weights = True, weights
            if self.launcher.up:
                await super().release(weights=weights)

    async def resume(self) -> None:
        await self._serving()
        async with self._state:
            if self._kv_released:
                await super().resume()
            self._kv_released = False

    async def reopen(self) -> None:
        await self._serving()
        async with self._state:
            await super().reopen()
            self._paused = False

    async def num_in_flight(self) -> int:
        return await super().num_in_flight() if self.launcher.up else 0

    async def weight_version(self) -> str:
        """The server's weight version; "" while no server answers."""
        return await super().weight_version() if self.launcher.up else ""

    async def wait_ready(self, timeout_s: float) -> None:
        await self.launcher.wait_up(timeout_s)
        await super().wait_ready(timeout_s)

    async def load_weights(self, path: Path, version: int) -> None:
        await self._serving()
        await super().load_weights(path, version)

    async def push_weights(
        self, named: Mapping[str, torch.Tensor], version: int, *, abort_requests: bool = False
    ) -> None:
        self._refuse_while_down()
        await super().push_weights(named, version, abort_requests=abort_requests)

    async def push_adapter(self, adapter: LoraAdapter, version: int) -> None:
        self._refuse_while_down()
        await super().push_adapter(adapter, version)

    def _refuse_while_down(self) -> None:
        if not self.launcher.up:
            raise EngineUnavailable(
                f"SGLang at {self.url} is restarting; it starts with the newest publication", url=self.url
            )
