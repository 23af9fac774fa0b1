"""The shape every harness-facing API shares, and the one request driver they all go through.

An `ApiAdapter` knows one wire format (Anthropic Messages, OpenAI Chat Completions, OpenAI
Responses): how to read a request body, how to write a non-streaming answer, a `StreamEncoder`
for SSE, and its own error body. `handle_model_call` is the boundary: size limit →
authentication → JSON → conversion → `begin_call` → generate and record → answer, with every
failure mapped once to the caller's error format (an unexpected exception is logged here and
answered 500). A streaming answer starts only when the first engine output arrived, so a call
that fails before any output gets a plain HTTP error; after that, failures become the API's
error event.

Adding an API: subclass `ApiAdapter` and `StreamEncoder` in a module of this package and mount
the adapter in app.py.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gyre.log import bind_context, get_logger
from gyre.trajectory import Api, MessageMemo, ModelRequest, RequestError
from services.proxy.calls import CallResult, ModelCall
from services.proxy.errors import BodyTooLargeError, InternalError, InvalidRequestError, ProxyError
from services.proxy.metrics import OverheadClock
from services.proxy.streaming import StreamEvent

if TYPE_CHECKING:
    from services.proxy.core import ProxyCore

log = get_logger("gyre.proxy.api")


class StreamEncoder(ABC):
    """SSE bytes of one streamed answer."""

    @abstractmethod
    def start(self, call: ModelCall) -> bytes:
        """Opening events (sent once the first engine output arrived)."""

    @abstractmethod
    def events(self, events: list[StreamEvent]) -> bytes:
        """Content events."""

    @abstractmethod
    def finish(self, call: ModelCall, result: CallResult) -> bytes:
        """Closing events (sent after the output is recorded)."""

    @abstractmethod
    def error(self, error: ProxyError) -> bytes:
        """An error event after the stream started."""


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event: `event:` and `data:` (JSON) lines."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class ApiAdapter(ABC):
    api: ClassVar[Api]
    request_id_header: ClassVar[str] = "x-request-id"

    @abstractmethod
    def parse(self, body: Any, headers: Mapping[str, str], memo: MessageMemo | None = None) -> ModelRequest:
        """The request in the internal model; raises `RequestError` on malformed input. `memo`: the
        execution's converted messages (a harness resends its history on every call)."""

    def options(self, body: Any) -> dict[str, Any]:
        """API-specific request options the internal model does not carry (kept as `call.options`)."""
        return {}

    @abstractmethod
    def answer(self, call: ModelCall, result: CallResult) -> dict[str, Any]:
        """The non-streaming response body."""

    @abstractmethod
    def encoder(self, call: ModelCall) -> StreamEncoder:
        """A fresh encoder for one streamed answer."""

    @abstractmethod
    def error_body(self, error: ProxyError) -> dict[str, Any]:
        """The API's error JSON."""

    def error_status(self, error: ProxyError) -> int:
        return error.status

    def error_response(self, error: ProxyError, request_id: str) -> Response:
        return json_response(
            self.error_body(error), self.error_status(error), {self.request_id_header: request_id}
        )


def json_response(content: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content), status_code=status, media_type="application/json", headers=headers)


def new_request_id() -> str:
    return uuid.uuid4().hex[:24]


def api_key_of(headers: Mapping[str, str]) -> str | None:
    """`x-api-key`, else the token of `Authorization: Bearer`."""
    key = headers.get("x-api-key")
    if key:
        return key.strip()
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def check_declared_size(headers: Mapping[str, str], max_bytes: int) -> None:
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLargeError(f"request body of {declared} bytes exceeds the limit of {max_bytes} bytes")


async def read_json(request: Request, max_bytes: int, clock: OverheadClock) -> Any:
    """The body as JSON, reading at most `max_bytes` (chunked bodies are counted as they come)."""
    chunks: list[bytes] = []
    size = 0
    with clock.outside():
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise BodyTooLargeError(f"request body exceeds the limit of {max_bytes} bytes")
            chunks.append(chunk)
    try:
        return orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as e:
        raise InvalidRequestError(f"the request body is not valid JSON: {e}") from e


def parse_request(
    core: ProxyCore,
    adapter: ApiAdapter,
    body: Any,
    headers: Mapping[str, str],
    memo: MessageMemo | None = None,
) -> ModelRequest:
    """The body in the internal model. A converter that fails on malformed input with anything but
    `RequestError` has a bug: it is logged and counted (`gyre_proxy_conversion_bugs`), and the
    harness still gets the 400 its malformed request deserves."""
    try:
        return adapter.parse(body, headers, memo)
    except RequestError as e:
        raise InvalidRequestError(str(e), e.field) from e
    except (TypeError, AttributeError, KeyError, IndexError, ValueError) as e:
        core.metrics.conversion_bugs.inc()
        log.exception("request_conversion_bug", error=repr(e))
        raise InvalidRequestError(f"malformed request: {e!r}") from e


async def handle_model_call(core: ProxyCore, adapter: ApiAdapter, request: Request) -> Response:
    clock = OverheadClock()
    request_id = new_request_id()
    bind_context(request=request_id, api=str(adapter.api))
    call: ModelCall | None = None
    try:
        check_declared_size(request.headers, core.section.max_body_bytes)
        state = await core.executions.for_key(api_key_of(request.headers))
        bind_context(execution=state.execution_id)
        body = await read_json(request, core.section.max_body_bytes, clock)
        model_request = parse_request(core, adapter, body, request.headers, state.memo)
        call = await core.begin(state, model_request, request_id, clock)
        call.options = adapter.options(body)
        if model_request.stream:
            return await _stream(core, adapter, call, clock)
        result = await call.complete()
        response = json_response(adapter.answer(call, result), 200, {adapter.request_id_header: request_id})
        core.metrics.answered(str(adapter.api), 200)
        core.metrics.overhead.labels(str(adapter.api)).observe(clock.seconds)
        return response
    except ProxyError as e:
        return _failed(core, adapter, e, call, request_id)
    except Exception as e:
        log.exception("proxy_internal_error", error=repr(e))
        return _failed(core, adapter, InternalError(f"internal error in the proxy: {e!r}"), call, request_id)


def _failed(
    core: ProxyCore, adapter: ApiAdapter, error: ProxyError, call: ModelCall | None, request_id: str
) -> Response:
    core.metrics.answered(str(adapter.api), adapter.error_status(error))
    core.metrics.failed(str(adapter.api), error, core.in_transition(call))
    log.info("call_refused", status=error.status, error=error.message[:300])
    return adapter.error_response(error, request_id)


async def _stream(core: ProxyCore, adapter: ApiAdapter, call: ModelCall, clock: OverheadClock) -> Response:
    encoder = adapter.encoder(call)
    events = call.stream()
    first = await events.__anext__()

    async def body() -> AsyncIterator[bytes]:
        try:
            yield encoder.start(call) + encoder.events(first)
            async for batch in events:
                chunk = encoder.events(batch)
                if chunk:
                    with clock.outside():
                        yield chunk
            assert call.result is not None
            core.metrics.answered(str(adapter.api), 200)
            yield encoder.finish(call, call.result)
        except ProxyError as e:
            core.metrics.failed(str(adapter.api), e, core.in_transition(call))
            log.info("stream_failed", status=e.status, error=e.message[:300])
            yield encoder.error(e)
        except Exception as e:
            log.exception("proxy_internal_error", error=repr(e))
            failure = InternalError(f"internal error in the proxy: {e!r}")
            core.metrics.failed(str(adapter.api), failure, core.in_transition(call))
            yield encoder.error(failure)
        finally:
            await events.aclose()
            core.metrics.overhead.labels(str(adapter.api)).observe(clock.seconds)

    return StreamingResponse(
        body(),
        media_type="text/event-stream",
        headers={adapter.request_id_header: call.request_id, "cache-control": "no-cache"},
    )
