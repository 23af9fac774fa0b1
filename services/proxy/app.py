"""The proxy's HTTP surface (Starlette): the three harness APIs, probes and `/metrics`.

    POST /v1/messages[?beta=true]      Anthropic Messages (Claude Code)    anthropic_api.py
    POST /v1/messages/count_tokens     Anthropic token count               anthropic_api.py
    POST /v1/chat/completions          OpenAI Chat Completions             chat_api.py
    POST /v1/responses                 OpenAI Responses (Codex)            responses_api.py
    HEAD|GET /, /api/hello, /health    200 (Claude Code probes the first two)
    GET /metrics                       Prometheus text format

Unknown paths and methods get 404/405 in the error format of the API their path belongs to
(Anthropic under /v1/messages, OpenAI elsewhere).
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.proxy.anthropic_api import AnthropicAdapter, count_tokens
from services.proxy.api import ApiAdapter, handle_model_call, new_request_id
from services.proxy.chat_api import ChatAdapter
from services.proxy.core import ProxyCore
from services.proxy.errors import ErrorKind, NotFoundError, ProxyError
from services.proxy.responses_api import ResponsesAdapter


class _MethodNotAllowed(ProxyError):
    status = 405
    kind = ErrorKind.NOT_FOUND


def build_app(core: ProxyCore) -> Starlette:
    anthropic, chat, responses = AnthropicAdapter(), ChatAdapter(), ResponsesAdapter()

    def model_route(adapter: ApiAdapter) -> Any:
        async def endpoint(request: Request) -> Response:
            return await handle_model_call(core, adapter, request)

        return endpoint

    async def count(request: Request) -> Response:
        return await count_tokens(core, anthropic, request)

    async def probe(request: Request) -> Response:
        return Response(status_code=200)

    async def metrics(request: Request) -> Response:
        return Response(core.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        adapter: ApiAdapter = anthropic if request.url.path.startswith("/v1/messages") else chat
        error: ProxyError
        if exc.status_code == 405:
            error = _MethodNotAllowed(f"method {request.method} is not allowed on {request.url.path}")
        else:
            error = NotFoundError(f"no such endpoint: {request.method} {request.url.path}")
        core.metrics.answered("none", error.status)
        return adapter.error_response(error, new_request_id())

    routes = [
        Route("/v1/messages", model_route(anthropic), methods=["POST"]),
        Route("/v1/messages/count_tokens", count, methods=["POST"]),
        Route("/v1/chat/completions", model_route(chat), methods=["POST"]),
        Route("/v1/responses", model_route(responses), methods=["POST"]),
        Route("/", probe, methods=["GET", "HEAD"]),
        Route("/api/hello", probe, methods=["GET", "HEAD"]),
        Route("/health", probe, methods=["GET", "HEAD"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})
