"""The HTTP surface of the embedded engine: SGLang's native endpoints plus Gyre's `/gyre/*` extensions.

SGLang endpoints (entrypoints/http_server.py), same paths, methods, fields and status codes:
`/generate`, `/abort_request`, `/pause_generation`, `/continue_generation`, `/flush_cache`,
`/release_memory_occupation`, `/resume_memory_occupation`, `/update_weights_from_tensor`,
`/update_weights_from_disk`, `/init_weights_update_group`, `/update_weights_from_distributed`,
`/destroy_weights_update_group` (gloo: `update_groups.py`), `/health`, `/health_generate`,
`/get_model_info` (with `weight_version`; SGLang has no `/get_weight_version`), `/get_server_info`,
`/update_weight_version`, `/metrics`
(Prometheus: `gyre_engine_*` where SGLang has `sglang:*`), and the LoRA endpoints `/load_lora_adapter`,
`/load_lora_adapter_from_tensors` and `/unload_lora_adapter` (answered as SGLang's LoRAUpdateOutput;
`adapters.py`). Errors use SGLang's shapes: `{"error": {"message": ...}}` for a refused
request, `{"object": "error", "message", "type", "param", "code"}` for a body that does not parse,
`{"success": false, "message": ...}` for weight updates.

Gyre extensions: `/gyre/kv/{pin,export,import,release}` (KV migration, see kv_transfer.py) and
`/gyre/script` (the scripted output source's queue).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import orjson
import torch
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

import gyre
from gyre.config.engine import EngineSection
from gyre.model.arch import ModelArch, ModelError
from gyre.model.lora import LoraAdapter, adapter_from_tensors, read_adapter_dir
from gyre.model.lora_spec import spec_from_config
from gyre.model.tokenizer import Tokenizer
from services.cell_agent.engine.core import EngineCore
from services.cell_agent.engine.output import OutputBuilder
from services.cell_agent.engine.protocol import (
    GenerateRequest,
    RequestRefused,
    SamplingParams,
    parse_generate,
)
from services.cell_agent.engine.sources.base import OutputSourceError
from services.cell_agent.engine.sources.scripted import ScriptedSource
from services.cell_agent.engine.update_groups import DistributedUpdate, UpdateGroups, parse_update
from services.cell_agent.engine.weights import decode_lora_tensors, decode_named_tensors

HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK_"


class ServedEngine(Protocol):
    """What the routes need of the engine they serve: `EngineServer` (server.py), which builds
    `EngineApi(self)` and so imports this module, not the other way round."""

    section: EngineSection
    model_dir: Path
    arch: ModelArch
    tokenizer: Tokenizer
    eos_token_ids: tuple[int, ...]
    probe_sampling: SamplingParams
    port: int
    metrics_registry: CollectorRegistry
    update_groups: UpdateGroups

    @property
    def core(self) -> EngineCore: ...

    @property
    def healthy(self) -> bool: ...

    async def update_weights(
        self,
        named_tensors: Mapping[str, torch.Tensor],
        *,
        weight_version: str | None,
        flush_cache: bool = True,
        abort_all_requests: bool = False,
    ) -> str: ...

    async def update_weights_from_disk(
        self, path: Path, *, weight_version: str | None, abort_all_requests: bool = False
    ) -> str: ...

    async def update_weights_from_distributed(self, update: DistributedUpdate) -> str: ...

    async def set_weight_version(self, version: str, *, abort_all_requests: bool = False) -> None: ...

    async def load_adapter(
        self, name: str, adapter: LoraAdapter, path: str, *, pinned: bool = False
    ) -> dict[str, str]: ...

    async def unload_adapter(self, name: str, poll_s: float = 0.01) -> dict[str, str]: ...


def _json(content: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status_code, media_type="application/json")


def _error(message: str, status_code: int = 400) -> Response:
    return _json({"error": {"message": message}}, status_code)


async def _body(request: Request, *, allow_empty: bool = False) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip() and allow_empty:
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise HTTPException(400, f"the request body is not JSON: {e}") from e
    if body is None and allow_empty:
        return {}
    if not isinstance(body, dict):
        raise HTTPException(400, "the request body must be a JSON object")
    return body


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code in (404, 405):
        return _json({"detail": exc.detail}, exc.status_code)
    return _json(
        {
            "object": "error",
            "message": exc.detail,
            "type": "Bad Request",
            "param": None,
            "code": exc.status_code,
        },
        exc.status_code,
    )


async def _domain_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestRefused | OutputSourceError)
    return _error(str(exc), exc.status_code)


class EngineApi:
    """The engine's routes, one method per endpoint over the `EngineServer` that hosts
    `EngineApi(server).app()`. To add an endpoint: a method here and its line in `routes` (and what it
    needs of the server in `ServedEngine`)."""

    def __init__(self, server: ServedEngine) -> None:
        self.server = server
        self.core = server.core

    def app(self) -> Starlette:
        return Starlette(
            routes=self.routes(),
            exception_handlers={
                HTTPException: _http_error,
                RequestRefused: _domain_error,
                OutputSourceError: _domain_error,
            },
        )

    def routes(self) -> list[Route]:
        return [
            Route("/generate", self.generate, methods=["POST", "PUT"]),
            Route("/abort_request", self.abort_request, methods=["POST"]),
            Route("/pause_generation", self.pause_generation, methods=["POST"]),
            Route("/continue_generation", self.continue_generation, methods=["POST"]),
            Route("/flush_cache", self.flush_cache, methods=["GET", "POST"]),
            Route("/release_memory_occupation", self.release_memory_occupation, methods=["GET", "POST"]),
            Route("/resume_memory_occupation", self.resume_memory_occupation, methods=["GET", "POST"]),
            Route("/update_weights_from_tensor", self.update_weights_from_tensor, methods=["POST"]),
            Route("/update_weights_from_disk", self.update_weights_from_disk, methods=["POST"]),
            Route("/init_weights_update_group", self.init_weights_update_group, methods=["POST"]),
            Route("/update_weights_from_distributed", self.update_weights_from_distributed, methods=["POST"]),
            Route("/destroy_weights_update_group", self.destroy_weights_update_group, methods=["POST"]),
            Route("/update_weight_version", self.update_weight_version, methods=["POST"]),
            Route("/load_lora_adapter", self.load_lora_adapter, methods=["POST"]),
            Route("/load_lora_adapter_from_tensors", self.load_lora_adapter_from_tensors, methods=["POST"]),
            Route("/unload_lora_adapter", self.unload_lora_adapter, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/health_generate", self.health_generate, methods=["GET"]),
            Route("/get_model_info", self.get_model_info, methods=["GET"]),
            Route("/get_server_info", self.get_server_info, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/gyre/kv/pin", self.kv_pin, methods=["POST"]),
            Route("/gyre/kv/export", self.kv_export, methods=["POST"]),
            Route("/gyre/kv/import", self.kv_import, methods=["POST"]),
            Route("/gyre/kv/release", self.kv_release, methods=["POST"]),
            Route("/gyre/script", self.script, methods=["GET", "POST"]),
        ]

    def weight_version(self) -> str:
        return self.core.source.weight_version

    # ---- generation -------------------------------------------------------------------------------

    async def generate(self, request: Request) -> Response:
        body = await _body(request)
        req = parse_generate(
            body, self.server.tokenizer, self.core.source.vocab_size, self.core.source.context_len
        )
        changed = asyncio.Event()
        state = self.core.submit(req, changed.set)
        builder = OutputBuilder(
            state, self.server.tokenizer, self.server.section.incremental_streaming_output
        )
        if req.stream:
            return StreamingResponse(self._stream(state, builder, changed), media_type="text/event-stream")
        try:
            while not state.finished:
                try:
                    await asyncio.wait_for(changed.wait(), timeout=1.0)
                except TimeoutError:
                    if await request.is_disconnected():
                        self.core.abort(req.rid)
                        return Response(status_code=499)
                changed.clear()
        except asyncio.CancelledError:
            self.core.abort(req.rid)
            raise
        if state.error is not None:
            return _error(str(state.error), getattr(state.error, "status_code", 400))
        if state.finish is not None and state.finish.type == "abort" and state.finish.status_code:
            return _error(state.finish.message or "aborted", state.finish.status_code)
        return _json(builder.final(self.weight_version()))

    async def _stream(
        self, state: Any, builder: OutputBuilder, changed: asyncio.Event
    ) -> AsyncIterator[bytes]:
        try:
            while True:
                await changed.wait()
                changed.clear()
                if state.error is not None:
                    yield b"data: " + orjson.dumps({"error": {"message": str(state.error)}}) + b"\n\n"
                    break
                chunk = builder.chunk(self.weight_version())
                if chunk is not None:
                    yield b"data: " + orjson.dumps(chunk) + b"\n\n"
                if state.finished:
                    break
            yield b"data: [DONE]\n\n"
        finally:
            if not state.finished:
                self.core.abort(state.rid)

    async def abort_request(self, request: Request) -> Response:
        body = await _body(request)
        rid, abort_all = body.get("rid", ""), bool(body.get("abort_all", False))
        if not abort_all and not rid:
            return Response(status_code=200)
        self.core.abort(str(rid) if rid else None, abort_all)
        return Response(status_code=200)

    # ---- pause, cache, memory ---------------------------------------------------------------------

    async def pause_generation(self, request: Request) -> Response:
        body = await _body(request, allow_empty=True)
        mode = str(body.get("mode", "abort"))
        await self.core.control(lambda: self.core.pause(mode))
        return _json({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: Request) -> Response:
        await self.core.control(self.core.resume)
        return _json({"message": "Generation continued successfully.", "status": "ok"})

    async def flush_cache(self, request: Request) -> Response:
        ok = await self.core.control(self.core.flush_cache)
        return Response(
            "Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n",
            status_code=200 if ok else 400,
        )

    async def release_memory_occupation(self, request: Request) -> Response:
        tags = (await _body(request, allow_empty=True)).get("tags")
        await self.core.control(lambda: self.core.release_memory(tags))
        return _json(None)

    async def resume_memory_occupation(self, request: Request) -> Response:
        tags = (await _body(request, allow_empty=True)).get("tags")
        await self.core.control(lambda: self.core.resume_memory(tags))
        return _json(None)

    # ---- weights ----------------------------------------------------------------------------------

    async def update_weights_from_tensor(self, request: Request) -> Response:
        body = await _body(request)
        try:
            tensors = await asyncio.to_thread(decode_named_tensors, body)
            message = await self.server.update_weights(
                tensors,
                weight_version=body.get("weight_version"),
                flush_cache=bool(body.get("flush_cache", True)),
                abort_all_requests=bool(body.get("abort_all_requests", False)),
            )
        except (RequestRefused, OutputSourceError) as e:
            return _json({"success": False, "message": str(e)}, 400)
        return _json({"success": True, "message": message})

    async def update_weights_from_disk(self, request: Request) -> Response:
        body = await _body(request)
        path, version = body.get("model_path"), body.get("weight_version")
        if not isinstance(path, str) or not path:
            return _json(
                {"success": False, "message": "model_path is required", "num_paused_requests": 0}, 400
            )
        try:
            message = await self.server.update_weights_from_disk(
                Path(path),
                weight_version=version,
                abort_all_requests=bool(body.get("abort_all_requests", False)),
            )
        except (RequestRefused, OutputSourceError) as e:
            return _json({"success": False, "message": str(e), "num_paused_requests": 0}, 400)
        return _json({"success": True, "message": message, "num_paused_requests": 0})

    async def update_weight_version(self, request: Request) -> Response:
        body = await _body(request)
        version = body.get("new_version")
        if not isinstance(version, str) or not version:
            return _json({"success": False, "message": "new_version is required"}, 400)
        await self.server.set_weight_version(version, abort_all_requests=bool(body.get("abort_all_requests")))
        return _json(
            {"success": True, "message": f"Weight version updated to {version}", "new_version": version}
        )

    # ---- LoRA adapters ----------------------------------------------------------------------------

    def _lora_result(self, loaded: dict[str, str] | None, error: str | None = None) -> Response:
        if loaded is None:
            adapters = self.core.source.adapters
            loaded = adapters.loaded() if adapters is not None else {}
        body = {"success": error is None, "error_message": error, "loaded_adapters": loaded}
        return _json(body, 200 if error is None else 400)

    async def load_lora_adapter(self, request: Request) -> Response:
        body = await _body(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            return self._lora_result(None, "lora_name and lora_path are required")
        try:
            adapter = await asyncio.to_thread(read_adapter_dir, Path(path), self.server.arch)
            loaded = await self.server.load_adapter(name, adapter, path, pinned=bool(body.get("pinned")))
        except (RequestRefused, OutputSourceError, ModelError) as e:
            return self._lora_result(None, str(e))
        return self._lora_result(loaded)

    async def load_lora_adapter_from_tensors(self, request: Request) -> Response:
        body = await _body(request)
        name, config = body.get("lora_name"), body.get("config_dict")
        if not isinstance(name, str) or not name or not isinstance(config, dict):
            return self._lora_result(None, "lora_name and config_dict (adapter_config.json) are required")
        try:
            tensors = await asyncio.to_thread(decode_lora_tensors, body)
            spec = spec_from_config(config, "config_dict")
            adapter = adapter_from_tensors(self.server.arch, spec, tensors, "serialized_tensors")
            loaded = await self.server.load_adapter(
                name, adapter, "__tensor__", pinned=bool(body.get("pinned"))
            )
        except (RequestRefused, OutputSourceError, ModelError) as e:
            return self._lora_result(None, str(e))
        return self._lora_result(loaded)

    async def unload_lora_adapter(self, request: Request) -> Response:
        name = (await _body(request)).get("lora_name")
        if not isinstance(name, str) or not name:
            return self._lora_result(None, "lora_name is required")
        try:
            loaded = await self.server.unload_adapter(name)
        except (RequestRefused, OutputSourceError) as e:
            return self._lora_result(None, str(e))
        return self._lora_result(loaded)

    async def init_weights_update_group(self, request: Request) -> Response:
        body = await _body(request)
        try:
            message = await self.server.update_groups.init(body)
        except (RequestRefused, OutputSourceError) as e:
            return _json({"success": False, "message": str(e)}, 400)
        except RuntimeError as e:  # the trainer's rendezvous could not be joined in time
            return _json({"success": False, "message": f"joining the weight-update group failed: {e}"}, 400)
        return _json({"success": True, "message": message})

    async def update_weights_from_distributed(self, request: Request) -> Response:
        body = await _body(request)
        try:
            message = await self.server.update_weights_from_distributed(parse_update(body))
        except (RequestRefused, OutputSourceError) as e:
            return _json({"success": False, "message": str(e)}, 400)
        return _json({"success": True, "message": message})

    async def destroy_weights_update_group(self, request: Request) -> Response:
        try:
            message = self.server.update_groups.destroy(await _body(request, allow_empty=True))
        except RequestRefused as e:
            return _json({"success": False, "message": str(e)}, 400)
        return _json({"success": True, "message": message})

    # ---- health and info --------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return Response(status_code=200 if self.server.healthy else 503)

    async def health_generate(self, request: Request) -> Response:
        if not self.server.healthy:
            return Response(status_code=503)
        if not self.core.source.probe_by_generation:
            return Response(status_code=200)
        probe = GenerateRequest(
            rid=f"{HEALTH_CHECK_RID_PREFIX}{time.time()}",
            input_ids=(self.server.eos_token_ids[0] if self.server.eos_token_ids else 0,),
            sampling=self.server.probe_sampling,
        )
        changed = asyncio.Event()
        state = self.core.submit(probe, changed.set)
        try:
            await asyncio.wait_for(
                _until_finished(state, changed), timeout=self.server.section.health_check_timeout_s
            )
        except TimeoutError:
            self.core.abort(probe.rid)
            return Response(status_code=503)
        ok = state.finish is not None and state.finish.type != "abort"
        return Response(status_code=200 if ok else 503)

    async def get_model_info(self, request: Request) -> Response:
        info = self.core.source.model_info()
        return _json(
            {
                "model_path": info.get("model_path"),
                "tokenizer_path": str(self.server.model_dir),
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.weight_version(),
                **{k: v for k, v in info.items() if k != "model_path"},
            }
        )

    async def metrics(self, request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(self.server.metrics_registry), media_type=content_type)

    async def get_server_info(self, request: Request) -> Response:
        section = self.server.section
        return _json(
            {
                "engine": "gyre-embedded",
                "version": gyre.__version__,
                "output_source": self.core.source.name,
                "host": section.host,
                "port": self.server.port,
                "context_length": self.core.source.context_len,
                "max_running_requests": section.max_batch_size,
                "chunked_prefill_size": section.max_prefill_tokens,
                "page_size": section.block_size,
                "disable_radix_cache": not section.enable_prefix_cache,
                "incremental_streaming_output": section.incremental_streaming_output,
                "random_seed": section.seed,
                "tp_size": 1,
                "enable_lora": section.enable_lora,
                "max_lora_rank": section.max_lora_rank,
                "lora_target_modules": section.lora_target_modules,
                "max_loaded_loras": section.max_loaded_loras,
                "weight_version": self.weight_version(),
                "internal_states": [self.core.stats()],
            }
        )

    # ---- Gyre extensions: KV migration and the script ---------------------------------------------

    async def kv_pin(self, request: Request) -> Response:
        rid = (await _body(request)).get("rid")
        if not isinstance(rid, str) or not rid:
            raise RequestRefused("rid is required")
        pin = await self.core.control(lambda: self.core.pin(rid))
        return _json(
            {
                "handle": pin.handle,
                "rid": pin.rid,
                "num_tokens": pin.num_tokens,
                "weight_version": pin.weight_version,
            }
        )

    async def kv_export(self, request: Request) -> Response:
        handle = str((await _body(request)).get("handle", ""))
        blob = await self.core.control(lambda: self.core.source.export_kv(handle))
        return Response(blob, media_type="application/octet-stream")

    async def kv_import(self, request: Request) -> Response:
        blob = await request.body()
        num_tokens = await self.core.control(lambda: self.core.source.import_kv(blob))
        return _json({"num_tokens": num_tokens})

    async def kv_release(self, request: Request) -> Response:
        handle = str((await _body(request)).get("handle", ""))
        await self.core.control(lambda: self.core.source.unpin(handle))
        return _json({"success": True})

    async def script(self, request: Request) -> Response:
        source = self.core.source
        if not isinstance(source, ScriptedSource):
            return _error(
                f"/gyre/script needs the scripted output source; this engine runs {source.name!r}", 404
            )
        if request.method == "POST":
            body = await _body(request)
            entries = body.get("entries", [])
            if not isinstance(entries, list):
                raise RequestRefused("entries must be a list of script entries")
            replace = bool(body.get("replace", False))
            await self.core.control(lambda: source.add_script(entries, replace=replace))
        return _json(source.script_status())


async def _until_finished(state: Any, changed: asyncio.Event) -> None:
    while not state.finished:
        await changed.wait()
        changed.clear()
