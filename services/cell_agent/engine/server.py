"""EngineServer: the embedded rollout engine as an async context manager (HTTP on 127.0.0.1).

    async with EngineServer(config.cell_agent.engine, model_dir=ModelDir.open(config.model).path) as engine:
        client = EngineClient(engine.url)
        ...
        await engine.update_weights(named_tensors, weight_version="3")   # in-process path

Weight updates arrive in-process (the hosting cell agent), or over HTTP by SGLang's three paths:
tensors in the request, an HF directory on disk, or a broadcast over a weight-update group the
trainer hosts (`update_groups.py`, gloo). With `enable_lora` it serves LoRA adapters on top of the
weights (`adapters.py`): loaded in-process or by `/load_lora_adapter`, named by a request's `lora_path`.

The server binds its socket before serving, so port 0 picks a free port and `url` is known once
`start()` returns. It serves the Hugging Face model directory `model_dir` (its tokenizer and stop ids
always come from there); a `model` passed in is served instead of the directory's weights and updated
in place by weight updates (pass a copy if the caller keeps training it). The scheduling loop and uvicorn run as tasks of the caller's event loop; model
compute runs on one worker thread. `stop()` is idempotent and time-capped; if the scheduling loop
crashed, `stop()` raises its error (after shutting everything down) so it is never swallowed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog
import torch

from gyre import tls
from gyre.config.engine import EngineSection
from gyre.config.infra import WILDCARD_HOSTS
from gyre.http_host import HttpHost
from gyre.model.arch import ModelArch, read_arch
from gyre.model.lora import LoraAdapter
from gyre.model.tokenizer import Tokenizer, generation_eos_ids
from gyre.model.weights import torch_dtype
from services.cell_agent.engine.adapters import NOT_ENABLED, EngineAdapters
from services.cell_agent.engine.core import EngineCore
from services.cell_agent.engine.http_api import EngineApi
from services.cell_agent.engine.metrics import engine_registry
from services.cell_agent.engine.protocol import RequestRefused, SamplingParams
from services.cell_agent.engine.sources import SourceContext, create_source
from services.cell_agent.engine.sources.base import OutputSourceError
from services.cell_agent.engine.update_groups import DistributedUpdate, UpdateGroups

UPDATE_GROUP_TIMEOUT_S = 120.0
"""Seconds a weight-update group waits for its peers (joining, and each update's broadcast)."""

log = structlog.get_logger(__name__)


def model_stop_ids(model_dir: Path, arch: ModelArch, tokenizer: Tokenizer) -> tuple[int, ...]:
    """Stop ids every request honours unless `ignore_eos`, as SGLang takes them: generation_config.json's
    eos ids, then config.json's, then the tokenizer's eos token (end of turn first, no repeats)."""
    ids = [*generation_eos_ids(model_dir), *arch.eos_token_ids]
    if tokenizer.eos_id is not None:
        ids.append(tokenizer.eos_id)
    return tuple(dict.fromkeys(i for i in ids if 0 <= i < arch.vocab_size))


def _script_file(path: Path | None) -> list[dict[str, Any]]:
    """The entries of `engine.script_file` (JSONL); a line that is not a JSON object is a ValueError
    naming the file and the line."""
    if path is None:
        return []
    entries: list[dict[str, Any]] = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{number}: not JSON ({e})") from e
        if not isinstance(entry, dict):
            raise ValueError(f"{path}:{number}: a script entry must be a JSON object")
        entries.append(entry)
    return entries


class EngineServer:
    def __init__(
        self,
        section: EngineSection,
        *,
        model_dir: Path,
        model: Any = None,
        script: Sequence[Any] = (),
    ) -> None:
        if section.backend != "embedded":
            raise ValueError(
                f"EngineServer is the embedded engine; engine.backend is {section.backend!r} "
                "(use gyre.engine.sglang_launcher for SGLang)"
            )
        self.section = section
        self.model_dir = Path(model_dir)
        self.arch = read_arch(self.model_dir)
        self.tokenizer = Tokenizer.from_dir(self.model_dir)
        self.eos_token_ids = model_stop_ids(self.model_dir, self.arch, self.tokenizer)
        self.probe_sampling = SamplingParams(max_new_tokens=1, temperature=0.0)
        self._model = model
        self._script = [*_script_file(section.script_file), *script]
        self._core: EngineCore | None = None
        self._core_task: asyncio.Task[None] | None = None
        self._http: HttpHost | None = None
        self.port = 0
        self._stopped = False
        self.metrics_registry = engine_registry(lambda: self._core)
        """`gyre_engine_*` series of this engine (its `GET /metrics`, and its cell agent's)."""
        self.update_groups = UpdateGroups(host=section.host, timeout_s=UPDATE_GROUP_TIMEOUT_S)

    # ---- lifecycle ---------------------------------------------------------------------------

    @property
    def core(self) -> EngineCore:
        if self._core is None:
            raise RuntimeError("EngineServer is not started")
        return self._core

    @property
    def url(self) -> str:
        """Where this host dials its engine: the loopback when it listens on every interface (a TLS
        certificate names 127.0.0.1, never 0.0.0.0); other hosts get the cell's peer host instead
        (`CellAgent.engine_url`)."""
        host = "127.0.0.1" if self.section.host in WILDCARD_HOSTS else self.section.host
        return f"{tls.http_scheme()}://{host}:{self.port}"

    @property
    def healthy(self) -> bool:
        core = self._core
        return core is not None and core.failed is None and not self._stopped and core.source.ready

    async def start(self) -> EngineServer:
        torch.set_num_threads(self.section.num_threads)
        ctx = SourceContext(
            section=self.section,
            model_dir=self.model_dir,
            arch=self.arch,
            tokenizer=self.tokenizer,
            eos_token_ids=self.eos_token_ids,
            weight_version=self.section.weight_version,
            model=self._model,
            script=self._script,
        )
        source = await asyncio.to_thread(create_source, self.section.output_source, ctx)
        if self.section.enable_lora:
            if not source.serves_lora:
                raise ValueError(
                    f"cell_agent.engine.enable_lora: the {source.name} output source does not compute outputs "
                    "with the model, so it cannot serve LoRA adapters"
                )
            source.adapters = EngineAdapters(self.arch, self.section, torch_dtype(self.section.dtype))
        self._core = EngineCore(
            source,
            tokenizer=self.tokenizer,
            eos_token_ids=frozenset(self.eos_token_ids),
            max_batch_size=self.section.max_batch_size,
            seed=self.section.seed,
            inline_step_ms=self.section.inline_step_ms,
        )
        self._core_task = asyncio.create_task(self._core.run(), name="engine-core")
        self._http = HttpHost(
            EngineApi(self).app(),
            host=self.section.host,
            port=self.section.port,
            name="engine-http",
            listen_backlog=128,
            keep_alive_s=30,
        )
        await self._http.start()
        self.port = self._http.port
        log.info(
            "engine_started", url=self.url, output_source=source.name, weight_version=source.weight_version
        )
        return self

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Health goes 503, in-flight requests end with an abort (503), then HTTP closes."""
        if self._stopped:
            return
        self._stopped = True
        error: BaseException | None = None
        if self._core is not None and self._core_task is not None:
            self._core.stop()
            try:
                await asyncio.wait_for(asyncio.shield(self._core_task), timeout=timeout_s)
            except TimeoutError:
                self._core_task.cancel()
            except Exception as e:  # the loop's own failure, raised below once cleanup is done
                error = e
        if self._http is not None:
            await self._http.stop(timeout_s)
        self.update_groups.clear()
        log.info("engine_stopped", url=self.url)
        if error is not None:
            raise error

    async def __aenter__(self) -> EngineServer:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.stop()
        except Exception:
            if exc is None:
                raise
            log.exception("engine_stop_failed_during_error")

    # ---- in-process control (the cell agent calls these directly) ----------------------------

    async def update_weights(
        self,
        named_tensors: Mapping[str, torch.Tensor],
        *,
        weight_version: str | None,
        flush_cache: bool = True,
        abort_all_requests: bool = False,
    ) -> str:
        core = self.core
        return await core.control(
            lambda: core.update_weights(
                lambda: core.source.update_weights(named_tensors, weight_version),
                flush_cache,
                abort_all_requests,
            )
        )

    async def update_weights_from_disk(
        self, path: Path, *, weight_version: str | None, abort_all_requests: bool = False
    ) -> str:
        core = self.core
        return await core.control(
            lambda: core.update_weights(
                lambda: core.source.load_weights_from_disk(path, weight_version), True, abort_all_requests
            )
        )

    async def update_weights_from_distributed(self, update: DistributedUpdate) -> str:
        """Receive `update`'s tensors over its group (generation goes on meanwhile), then apply them."""
        try:
            tensors = await self.update_groups.receive(update)
        except RuntimeError as e:  # a peer died or the broadcast timed out: the group is unusable now
            self.update_groups.drop(update.group_name)
            raise OutputSourceError(
                f"receiving over weight-update group {update.group_name!r} failed: {e}"
            ) from e
        return await self.update_weights(
            tensors,
            weight_version=update.weight_version,
            flush_cache=update.flush_cache,
            abort_all_requests=update.abort_all_requests,
        )

    async def set_weight_version(self, version: str, *, abort_all_requests: bool = False) -> None:
        """SGLang's `/update_weight_version`: report `version` from now on (weights unchanged)."""
        core = self.core

        def apply() -> None:
            if abort_all_requests:
                core.abort(None, abort_all=True)
            core.source.set_weight_version(version)

        await core.control(apply)

    # ---- LoRA adapters -------------------------------------------------------------------------

    @property
    def adapters(self) -> EngineAdapters:
        adapters = self.core.source.adapters
        if adapters is None:
            raise RequestRefused(NOT_ENABLED)
        return adapters

    async def load_adapter(
        self, name: str, adapter: LoraAdapter, path: str, *, pinned: bool = False
    ) -> dict[str, str]:
        """Serve `adapter` under `name` from the next step on; returns every loaded adapter (name → path)."""
        adapters = self.adapters
        await self.core.control(
            lambda: adapters.load(name, adapter.to(torch_dtype(self.section.dtype)), path, pinned)
        )
        log.info(
            "lora_adapter_loaded", name=name, path=path, rank=adapter.spec.rank, targets=len(adapter.targets)
        )
        return adapters.loaded()

    async def unload_adapter(self, name: str, poll_s: float = 0.01) -> dict[str, str]:
        """Refuse new requests naming `name` now; free it once the requests running on it are done."""
        adapters = self.adapters
        lora_id = await self.core.control(lambda: adapters.unregister(name))
        while adapters.in_flight(lora_id):
            await asyncio.sleep(poll_s)
        await self.core.control(lambda: adapters.drop(lora_id))
        log.info("lora_adapter_unloaded", name=name)
        return adapters.loaded()

    async def release_memory(self, tags: Sequence[str] | None = None) -> None:
        core = self.core
        await core.control(lambda: core.release_memory(tags))

    async def resume_memory(self, tags: Sequence[str] | None = None) -> None:
        core = self.core
        await core.control(lambda: core.resume_memory(tags))
