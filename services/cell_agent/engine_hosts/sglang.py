"""An SGLang server launched and supervised by the cell (`gyre.engine.SGLangLauncher`: GPU nodes, or CPUs
with `sglang_device: cpu`), then driven over HTTP like any engine that serves SGLang's native API."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from gyre.config.engine import EngineSection
from gyre.engine.sglang_launcher import SGLangLauncher
from services.cell_agent.engine_hosts.http import HttpEngineHost


class SGLangEngineHost(HttpEngineHost):
    """An SGLang server launched by the cell (GPU nodes), then driven like any HTTP engine."""

    name: ClassVar[str] = "sglang"

    def __init__(self, section: EngineSection, model_dir: Path, *, log_path: Path | None = None) -> None:
        if not section.sglang_model_path:
            section = section.model_copy(update={"sglang_model_path": str(model_dir)})
        super().__init__(section, model_dir, log_path=log_path)
        self.launcher = SGLangLauncher(section, log_path=log_path)
        self._base_url = self.launcher.url

    async def start(self) -> None:
        await self.launcher.start()
        self._base_url = self.launcher.url  # a new port if the first was taken before the server bound it
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        await self.launcher.stop()
