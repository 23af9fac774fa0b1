"""EngineClient: one async client for the embedded engine and for a real SGLang server.

    async with EngineClient("http://127.0.0.1:30000") as engine:
        result = await engine.generate(input_ids, {"max_new_tokens": 64, "temperature": 1.0}, rid="e1-c7")
        async for chunk in engine.generate_stream(input_ids, {"max_new_tokens": 64}):
            ...                                   # chunk.new_output_ids, chunk.new_logprobs, chunk.finished
        await engine.pause_generation("retract")
        await engine.update_weights_from_tensor(model.state_dict(), weight_version="4")
        await engine.update_weights_from_disk("/ckpt/published/v00000004", weight_version="4")
        await engine.init_weights_update_group(master_address="10.0.0.5", master_port=29600, rank_offset=1,
                                               world_size=2, group_name="g", backend="nccl")
        await engine.update_weights_from_distributed(names, dtypes, shapes, group_name="g", weight_version="4")
        await engine.load_lora_adapter("policy-v4", "/ckpt/published/v00000004")   # a PEFT directory
        result = await engine.generate(input_ids, {"max_new_tokens": 64}, lora_path="policy-v4")
        await engine.unload_lora_adapter("policy-v3")

Weight updates take SGLang's three paths: `update_weights_from_tensor` (the tensors in the request),
`update_weights_from_disk` (an HF directory the server reads), and the distributed pair: after
`init_weights_update_group` the caller broadcasts each tensor named in `update_weights_from_distributed`
over that group while the request is in flight (`gyre.engine.update_group` is the caller's side of
the group). Every update carries a `weight_version`; the server flushes its prefix cache (`flush_cache`)
and aborts running requests only when `abort_all_requests` says so. A real SGLang loads tensors and
broadcasts only inside a weight-update session (`/begin_weight_update` … `/end_weight_update`, else 400):
the client opens one around those two calls when the server is SGLang. SGLang flushes only with no
request running, so around every update that keeps running requests the client retracts them and
continues them after it (`_retracted_for_flush`). The served version is read from
`/get_model_info` (SGLang has no `GET /get_weight_version`) and comes with every `/generate` answer. LoRA adapters take SGLang's
endpoints (`/load_lora_adapter` with a PEFT directory, `/load_lora_adapter_from_tensors`,
`/unload_lora_adapter`; the server needs `--enable-lora`) and a request names its adapter in
`lora_path`; `update_weight_version` changes the version the server reports without touching weights.

Used by the proxy (generation, abort, KV migration) and the cell agent (pause, memory, weights). It
speaks SGLang's native API with SGLang's field names; `/gyre/kv/*` exists only on the embedded
engine (a real SGLang answers 404 → `EngineNotFound`, and the proxy recomputes instead).

Transport: whole exchanges (`generate`, abort, pause, weights, ...) over plain HTTP go through
`gyre.engine.http1.Http1Pool`, keep-alive connections over asyncio streams: the proxy sends one
`/generate` per harness call, and aiohttp's request machinery was ~10% of its CPU under `gyre bench
load`. Streams (`generate_stream`) and HTTPS use one aiohttp session per client (created on first use,
inside the caller's loop), whose connector keeps up to 2,048 keep-alive connections. Neither is httpx: on
that hot path httpx cost ~2.2 ms of CPU per request against ~0.35 ms for aiohttp (its pure-Python h11
parser and request model; one client process against one uvicorn server, 2,000 requests of a 5,000-id
prompt), and its pool rescans every connection per event, so a large pool grows quadratically.

Retries: only when the connection could not be made (refused, connect timeout), with exponential
backoff: such a request never reached the server, so a retry cannot duplicate work. Everything else
maps to one `EngineError` subclass (see errors.py). Log-probs are requested by default: every caller
that records TITO needs them. Importing this module does not import torch (the proxy does not need it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import numpy as np
import orjson

from gyre import tls
from gyre.engine.errors import (
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    error_for_status,
    error_message,
)
from gyre.engine.http1 import Http1BrokenError, Http1ConnectError, Http1Pool
from gyre.engine.types import GenerateChunk, GenerateResult, KVPinInfo, StreamAccumulator

if TYPE_CHECKING:
    import torch

_RETRYABLE = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
_MAX_CONNECTIONS = 2048
"""Connections to one engine before requests queue (the proxy sends every call of its executions there)."""
_MAX_EVENT_BYTES = 64 << 20
"""Longest line of a streamed answer (SGLang's non-incremental events repeat every output id so far)."""
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Reply:
    """A whole answer of the engine."""

    status_code: int
    content: bytes
    url: str
    reason: str = ""

    def json(self) -> Any:
        return orjson.loads(self.content)


class EngineClient:
    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        max_connect_retries: int = 3,
        retry_backoff_s: float = 0.2,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_connect_retries = max_connect_retries
        self.retry_backoff_s = retry_backoff_s
        self._connect_timeout_s = connect_timeout_s
        url = urlsplit(self.base_url)
        self._path_prefix = url.path
        identity = tls.current()
        self._ssl = identity.client_context() if url.scheme == "https" and identity is not None else None
        """HTTPS with this process's TLS identity (`gyre.tls`): it shows its certificate and trusts only the
        deployment's CA; without one, HTTPS checks the server against the system's CAs."""
        self._pool = (
            Http1Pool(
                url.hostname,
                url.port or (443 if url.scheme == "https" else 80),
                connect_timeout_s=connect_timeout_s,
                ssl=self._ssl,
            )
            if url.hostname and (url.scheme == "http" or self._ssl is not None)
            else None
        )
        """Whole exchanges (`gyre.engine.http1`); streams go through aiohttp."""
        self._session: aiohttp.ClientSession | None = None
        self._server_kind: str | None = None

    def _timeout(self, timeout_s: float | None) -> aiohttp.ClientTimeout:
        """`timeout_s` (default: the client's) for each read, and for waiting on a pooled connection; the
        connect itself gets `connect_timeout_s`. No total: a long streamed output may take its time."""
        read_s = self.timeout_s if timeout_s is None else timeout_s
        return aiohttp.ClientTimeout(
            total=None, connect=read_s, sock_connect=self._connect_timeout_s, sock_read=read_s
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=_MAX_CONNECTIONS, limit_per_host=0, ssl=self._ssl if self._ssl is not None else True
                ),
                timeout=self._timeout(None),
                skip_auto_headers=("User-Agent",),
                read_bufsize=1 << 18,
            )
        return self._session

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # ---- transport ---------------------------------------------------------------------------

    async def _open(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        timeout_s: float | None = None,
    ) -> aiohttp.ClientResponse:
        """The engine's answer, its body not read yet (the caller releases it)."""
        url = self.base_url + path
        data, content_type = _payload(json, content)
        headers = None if content_type is None else {"content-type": content_type}
        timeout = self._timeout(timeout_s) if timeout_s is not None else None
        with _transport_errors(url):
            return await self._connecting(
                url,
                lambda: self.session.request(method, url, data=data, headers=headers, timeout=timeout),
                _RETRYABLE,
            )

    async def _connecting(
        self, url: str, send: Callable[[], Awaitable[_T]], retryable: tuple[type[Exception], ...]
    ) -> _T:
        """`send()`, again with exponential backoff while it fails to connect (`retryable`): such a request
        never reached the server, so a retry cannot duplicate work."""
        attempt = 0
        while True:
            try:
                return await send()
            except retryable as e:
                if attempt >= self.max_connect_retries:
                    raise EngineUnavailable(f"{url}: cannot connect: {e!r}", url=url) from e
                await asyncio.sleep(self.retry_backoff_s * 2**attempt)
                attempt += 1

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        timeout_s: float | None = None,
    ) -> Reply:
        """One request on the engine's base URL and its whole answer, whatever the status (a raw request
        outside this API, such as the embedded engine's `/gyre/script`)."""
        pool = self._pool
        if pool is not None:
            url = self.base_url + path
            data, content_type = _payload(json, content)
            read_s = self.timeout_s if timeout_s is None else timeout_s
            with _transport_errors(url):
                status, reason, body = await self._connecting(
                    url,
                    lambda: pool.request(
                        method, self._path_prefix + path, data, content_type, timeout_s=read_s
                    ),
                    (Http1ConnectError,),
                )
            return Reply(status, body, url, reason)
        response = await self._open(method, path, json=json, content=content, timeout_s=timeout_s)
        try:
            with _transport_errors(str(response.url)):
                return await _read(response)
        finally:
            response.release()

    async def _call(self, method: str, path: str, **request: Any) -> Reply:
        """`request`, raising the engine's error for a status of 400 and above."""
        reply = await self.request(method, path, **request)
        if reply.status_code >= 400:
            raise _error_from(reply)
        return reply

    # ---- generation --------------------------------------------------------------------------

    @staticmethod
    def _generate_body(
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any] | None,
        rid: str | None,
        return_logprob: bool,
        return_text_in_logprobs: bool,
        stream: bool,
        lora_path: str | None = None,
        return_routed_experts: bool = False,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            # an integer array is written to JSON as is (orjson's numpy support): a prompt of thousands of
            # ids then costs no list of Python ints on the way (the proxy's prompts are arrays)
            "input_ids": input_ids if isinstance(input_ids, list | np.ndarray) else list(input_ids),
            "sampling_params": dict(sampling_params or {}),
            "return_logprob": return_logprob,
            "stream": stream,
        }
        if rid is not None:
            body["rid"] = rid
        if return_text_in_logprobs:
            body["return_text_in_logprobs"] = True
        if lora_path is not None:
            body["lora_path"] = lora_path
        if return_routed_experts:
            body["return_routed_experts"] = True
        return body

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any] | None = None,
        *,
        rid: str | None = None,
        return_logprob: bool = True,
        return_text_in_logprobs: bool = False,
        timeout_s: float | None = None,
        lora_path: str | None = None,
        return_routed_experts: bool = False,
    ) -> GenerateResult:
        """One request; `lora_path` names the LoRA adapter to run on (SGLang's field: the name the
        adapter was loaded under), None for the base weights; `return_routed_experts` asks for the MoE
        experts of every forwarded token (`GenerateResult.routed_experts`)."""
        body = self._generate_body(
            input_ids,
            sampling_params,
            rid,
            return_logprob,
            return_text_in_logprobs,
            False,
            lora_path,
            return_routed_experts,
        )
        response = await self._call("POST", "/generate", json=body, timeout_s=timeout_s)
        return GenerateResult.from_json(response.json())

    async def generate_stream(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any] | None = None,
        *,
        rid: str | None = None,
        return_logprob: bool = True,
        return_text_in_logprobs: bool = False,
        timeout_s: float | None = None,
        lora_path: str | None = None,
        return_routed_experts: bool = False,
    ) -> AsyncIterator[GenerateChunk]:
        """Stream `/generate`; the last chunk has `finished` set (and, when asked, `routed_experts`).
        Closing the iterator early closes the connection, which makes the server abort the request."""
        body = self._generate_body(
            input_ids,
            sampling_params,
            rid,
            return_logprob,
            return_text_in_logprobs,
            True,
            lora_path,
            return_routed_experts,
        )
        response = await self._open("POST", "/generate", json=body, timeout_s=timeout_s)
        url = str(response.url)
        finished = False
        try:
            with _transport_errors(url, timed_out="stream timed out", broken="stream broke"):
                if response.status >= 400:
                    raise _error_from(await _read(response))
                acc = StreamAccumulator()
                while line := await response.content.readuntil(b"\n", max_size=_MAX_EVENT_BYTES):
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        finished = True
                        return
                    try:
                        event = orjson.loads(data)
                    except orjson.JSONDecodeError as e:  # the connection was cut mid-event (a drained engine)
                        raise EngineUnavailable(f"{url}: stream broke mid-event: {e}", url=url) from e
                    if "error" in event:
                        raise error_for_status(400, error_message(event, "stream error"), url)
                    chunk = acc.accept(event)
                    finished = chunk.finished
                    yield chunk
        finally:
            if finished:
                response.release()  # the connection goes back to the pool
            else:
                response.close()  # cut: the server sees the disconnect and aborts the request

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        if rid is None and not abort_all:
            raise ValueError("abort needs a rid or abort_all=True")
        await self._call("POST", "/abort_request", json={"rid": rid or "", "abort_all": abort_all})

    # ---- control -----------------------------------------------------------------------------

    async def pause_generation(self, mode: str = "abort") -> None:
        if mode not in ("abort", "in_place", "retract"):
            raise ValueError(f"pause mode must be 'abort', 'in_place' or 'retract'; got {mode!r}")
        await self._call("POST", "/pause_generation", json={"mode": mode})

    async def continue_generation(self) -> None:
        await self._call("POST", "/continue_generation", json={})

    async def flush_cache(self) -> bool:
        """True if flushed; False if the server refused because requests are running."""
        response = await self.request("POST", "/flush_cache")
        if response.status_code == 400:
            return False
        if response.status_code >= 400:
            raise _error_from(response)
        return True

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        await self._call(
            "POST", "/release_memory_occupation", json={"tags": list(tags) if tags is not None else None}
        )

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        await self._call(
            "POST", "/resume_memory_occupation", json={"tags": list(tags) if tags is not None else None}
        )

    async def server_kind(self) -> str:
        """`embedded` (Gyre's engine) or `sglang`, asked once (`/get_server_info`)."""
        return await self._kind()

    async def _kind(self) -> str:
        if self._server_kind is None:
            info = await self.get_server_info()
            self._server_kind = "embedded" if info.get("engine") == "gyre-embedded" else "sglang"
        return self._server_kind

    async def update_weights_from_tensor(
        self,
        named_tensors: Mapping[str, torch.Tensor],
        *,
        weight_version: str | None = None,
        encoding: str = "auto",
        tp_size: int = 1,
        flush_cache: bool = True,
        abort_all_requests: bool = False,
    ) -> str:
        """Push parameters by name. `encoding`: `safetensors` (embedded engine), `sglang` (SGLang's
        MultiprocessingSerializer, colocated processes only) or `auto` (asks the server which)."""
        from gyre.engine.tensor_codec import SAFETENSORS, SGLANG, update_weights_payload  # imports torch

        if encoding == "auto":
            encoding = SAFETENSORS if await self._kind() == "embedded" else SGLANG
        shared: list[torch.Tensor] = []  # SGLang's encoding: memory the server reads before it answers
        payload = await asyncio.to_thread(
            update_weights_payload,
            named_tensors,
            encoding=encoding,
            tp_size=tp_size,
            weight_version=weight_version,
            flush_cache=flush_cache,
            abort_all_requests=abort_all_requests,
            keep=shared,
        )
        async with self._retracted_for_flush(flush_cache, abort_all_requests), self._weight_update_session():
            response = await self._call("POST", "/update_weights_from_tensor", json=payload)
        shared.clear()
        return str(response.json().get("message", ""))

    @contextlib.asynccontextmanager
    async def _weight_update_session(self) -> AsyncIterator[None]:
        """SGLang's `/begin_weight_update` … `/end_weight_update` around a tensor or distributed update
        (the embedded engine loads without one). The session is closed even when the update failed."""
        if await self._kind() != "sglang":
            yield
            return
        await self._call("POST", "/begin_weight_update", json={})
        try:
            yield
        finally:
            await self._call("POST", "/end_weight_update", json={})

    async def update_weights_from_disk(
        self,
        model_path: str,
        *,
        weight_version: str | None = None,
        load_format: str | None = None,
        abort_all_requests: bool = False,
    ) -> str:
        body = {
            "model_path": model_path,
            "load_format": load_format,
            "weight_version": weight_version,
            "abort_all_requests": abort_all_requests,
        }
        async with self._retracted_for_flush(True, abort_all_requests):  # SGLang flushes after a disk load
            response = await self._call("POST", "/update_weights_from_disk", json=body)
        return str(response.json().get("message", ""))

    @contextlib.asynccontextmanager
    async def _retracted_for_flush(self, flush_cache: bool, abort_all_requests: bool) -> AsyncIterator[None]:
        """SGLang flushes its prefix cache after a weight update only when no request runs, and unless it
        is paused an update first waits for every request in flight to end (minutes for an agent's long
        calls; new ones wait behind it) and then may still find one running (400: the weights changed, the
        cache was not flushed). Around an update that flushes and keeps running requests, they are
        retracted to its queue (`pause_generation` mode `retract`, their KV freed) and continued after
        it: they recompute their prefix under the new weights. The embedded engine updates and flushes
        with requests running (they keep their KV)."""
        if not flush_cache or abort_all_requests or await self._kind() != "sglang":
            yield
            return
        await self.pause_generation("retract")
        try:
            yield
        finally:
            await self.continue_generation()

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
        timeout_s: float | None = None,
    ) -> str:
        """Make the server's ranks join the caller's weight-update group (rank 0 at master_address:port,
        hosted by the caller, who joins concurrently: the server answers once the group has formed)."""
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        response = await self._call("POST", "/init_weights_update_group", json=body, timeout_s=timeout_s)
        return str(response.json().get("message", ""))

    async def update_weights_from_distributed(
        self,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        *,
        group_name: str = "weight_update_group",
        weight_version: str | None = None,
        flush_cache: bool = True,
        abort_all_requests: bool = False,
        timeout_s: float | None = None,
    ) -> str:
        """Announce tensors (HF names, dtype names such as `bfloat16`, shapes) that the caller broadcasts
        from rank 0 of `group_name`, in this order, while the request is in flight."""
        if not len(names) == len(dtypes) == len(shapes):
            raise ValueError("names, dtypes and shapes must have one entry per tensor")
        body = {
            "names": list(names),
            "dtypes": list(dtypes),
            "shapes": [list(s) for s in shapes],
            "group_name": group_name,
            "flush_cache": flush_cache,
            "abort_all_requests": abort_all_requests,
            "weight_version": weight_version,
        }
        async with self._retracted_for_flush(flush_cache, abort_all_requests), self._weight_update_session():
            response = await self._call(
                "POST", "/update_weights_from_distributed", json=body, timeout_s=timeout_s
            )
        return str(response.json().get("message", ""))

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> str:
        response = await self._call("POST", "/destroy_weights_update_group", json={"group_name": group_name})
        return str(response.json().get("message", ""))

    async def update_weight_version(self, new_version: str, *, abort_all_requests: bool = False) -> None:
        """Report `new_version` from now on, weights unchanged (SGLang's `/update_weight_version`)."""
        body = {"new_version": new_version, "abort_all_requests": abort_all_requests}
        await self._call("POST", "/update_weight_version", json=body)

    # ---- LoRA adapters -------------------------------------------------------------------------

    async def load_lora_adapter(
        self, lora_name: str, lora_path: str, *, pinned: bool = False
    ) -> dict[str, Any]:
        """Serve the PEFT adapter directory `lora_path` (as the server sees it) as `lora_name`; returns
        the adapters now loaded (name → path)."""
        body = {"lora_name": lora_name, "lora_path": lora_path, "pinned": pinned}
        return _loaded_adapters(await self._call("POST", "/load_lora_adapter", json=body))

    async def load_lora_adapter_from_tensors(
        self,
        lora_name: str,
        tensors: Mapping[str, torch.Tensor],
        config: Mapping[str, Any],
        *,
        pinned: bool = False,
    ) -> dict[str, Any]:
        """Serve an adapter sent in the request: its PEFT-named matrices and adapter_config.json, as
        base64 safetensors (`load_format: "safetensors"`, the embedded engine's form: it unpickles
        nothing; SGLang takes its own serialized form here, so push SGLang a directory instead)."""
        from gyre.engine.tensor_codec import SAFETENSORS, encode_safetensors_b64  # imports torch

        serialized = await asyncio.to_thread(encode_safetensors_b64, tensors)
        body = {
            "lora_name": lora_name,
            "config_dict": dict(config),
            "serialized_tensors": serialized,
            "load_format": SAFETENSORS,
            "pinned": pinned,
        }
        return _loaded_adapters(await self._call("POST", "/load_lora_adapter_from_tensors", json=body))

    async def unload_lora_adapter(self, lora_name: str) -> dict[str, Any]:
        """Stop serving `lora_name` (requests running on it finish first); returns the adapters left."""
        return _loaded_adapters(
            await self._call("POST", "/unload_lora_adapter", json={"lora_name": lora_name})
        )

    # ---- health and info ---------------------------------------------------------------------

    async def health(self) -> bool:
        """True when the server answers 200; False when it answers 503 or cannot be reached."""
        try:
            response = await self.request("GET", "/health")
        except EngineUnavailable:
            return False
        return response.status_code == 200

    async def health_generate(self, timeout_s: float | None = None) -> bool:
        try:
            response = await self.request("GET", "/health_generate", timeout_s=timeout_s)
        except (EngineUnavailable, EngineTimeout):
            return False
        return response.status_code == 200

    async def wait_healthy(self, timeout_s: float, poll_s: float = 0.5) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not await self.health():
            if asyncio.get_running_loop().time() > deadline:
                raise EngineUnavailable(f"{self.base_url} not healthy after {timeout_s} s", url=self.base_url)
            await asyncio.sleep(poll_s)

    async def get_model_info(self) -> dict[str, Any]:
        return dict((await self._call("GET", "/get_model_info")).json())

    async def get_server_info(self) -> dict[str, Any]:
        return dict((await self._call("GET", "/get_server_info")).json())

    async def get_weight_version(self) -> str | None:
        """The version of the weights served (`/get_model_info`'s `weight_version`)."""
        version = (await self.get_model_info()).get("weight_version")
        return None if version is None else str(version)

    # ---- KV migration (embedded engine only) -------------------------------------------------

    async def pin_kv(self, rid: str) -> KVPinInfo:
        data = (await self._call("POST", "/gyre/kv/pin", json={"rid": rid})).json()
        return KVPinInfo(
            handle=data["handle"],
            rid=data["rid"],
            num_tokens=int(data["num_tokens"]),
            weight_version=data["weight_version"],
        )

    async def export_kv(self, handle: str) -> bytes:
        return (await self._call("POST", "/gyre/kv/export", json={"handle": handle})).content

    async def import_kv(self, payload: bytes) -> int:
        data = (await self._call("POST", "/gyre/kv/import", content=payload)).json()
        return int(data["num_tokens"])

    async def release_kv(self, handle: str) -> None:
        await self._call("POST", "/gyre/kv/release", json={"handle": handle})


def _loaded_adapters(reply: Reply) -> dict[str, Any]:
    body = reply.json()
    loaded = body.get("loaded_adapters") if isinstance(body, dict) else None
    return dict(loaded) if isinstance(loaded, dict) else {}


async def _read(response: aiohttp.ClientResponse) -> Reply:
    """The whole answer (the caller releases the response)."""
    return Reply(response.status, await response.read(), str(response.url), response.reason or "")


@contextlib.contextmanager
def _transport_errors(
    url: str, *, timed_out: str = "timed out", broken: str = "connection failed"
) -> Iterator[None]:
    """aiohttp's timeouts and connection failures as the engine errors every caller handles."""
    try:
        yield
    except TimeoutError as e:
        raise EngineTimeout(f"{url}: {timed_out}: {e!r}", url=url) from e
    except (aiohttp.ClientError, Http1BrokenError) as e:
        raise EngineUnavailable(f"{url}: {broken}: {e!r}", url=url) from e


def _payload(json: Any, content: bytes | None) -> tuple[bytes | None, str | None]:
    """A request's body and content type: `json` serialized (numpy arrays included), or raw `content`."""
    if json is not None:
        return orjson.dumps(json, option=orjson.OPT_SERIALIZE_NUMPY), "application/json"
    return content, None if content is None else "application/octet-stream"


def _error_from(reply: Reply) -> EngineError:
    try:
        body: Any = reply.json()
    except orjson.JSONDecodeError:
        body = None
    fallback = reply.content.decode(errors="replace").strip() or reply.reason
    return error_for_status(reply.status_code, error_message(body, fallback), reply.url)
