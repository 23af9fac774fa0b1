"""gyre.rpc's error interceptor over a real grpc.aio server: each domain error answers with the status of
the first entry that names it, an error no entry names stays UNKNOWN, and answers pass through; a blocking
call is asked again while it fails as a restarting service's does, and only then."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from gyre.rpc import INVALID_ARGUMENT, ErrorStatus, aio_channel, bind, call_while_restarting, new_server


class Conflict(ValueError):
    pass


ERRORS: dict[bytes, Exception] = {
    b"conflict": Conflict("busy"),
    b"bad": ValueError("no such thing"),
    b"missing": KeyError("e7"),
    b"bug": RuntimeError("a bug"),
}


async def _echo(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    if request in ERRORS:
        raise ERRORS[request]
    return request


async def test_domain_errors_map_to_their_status_and_answers_pass() -> None:
    statuses = (
        ErrorStatus(Conflict, grpc.StatusCode.FAILED_PRECONDITION),
        ErrorStatus(KeyError, grpc.StatusCode.NOT_FOUND, lambda e: f"unknown: {e.args[0]}"),
        INVALID_ARGUMENT,
    )
    server = new_server(statuses)
    handler = grpc.unary_unary_rpc_method_handler(_echo)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {"Echo": handler}),))
    port = bind(server, "127.0.0.1:0")
    await server.start()
    try:
        async with aio_channel(f"127.0.0.1:{port}") as channel:
            echo = channel.unary_unary("/t.T/Echo")
            assert await echo(b"hello", timeout=10) == b"hello"
            expected = {
                b"conflict": (grpc.StatusCode.FAILED_PRECONDITION, "busy"),
                b"bad": (grpc.StatusCode.INVALID_ARGUMENT, "no such thing"),
                b"missing": (grpc.StatusCode.NOT_FOUND, "unknown: e7"),
            }
            for request, (code, detail) in expected.items():
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await echo(request, timeout=10)
                assert (info.value.code(), info.value.details()) == (code, detail)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await echo(b"bug", timeout=10)
            assert info.value.code() is grpc.StatusCode.UNKNOWN
    finally:
        await server.stop(0)


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


def _calls(*answers: object) -> Any:
    pending = list(answers)

    def call() -> object:
        answer = pending.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return call


def test_a_call_is_asked_again_while_its_service_restarts() -> None:
    waits: list[int] = []
    call = _calls(_Failed(grpc.StatusCode.UNAVAILABLE), _Failed(grpc.StatusCode.DEADLINE_EXCEEDED), "state")
    assert call_while_restarting(call, 60, lambda: waits.append(1)) == "state"
    assert len(waits) == 2


def test_other_errors_and_errors_past_the_deadline_are_raised() -> None:
    waits: list[int] = []
    with pytest.raises(_Failed) as refused:
        call_while_restarting(_calls(_Failed(grpc.StatusCode.INVALID_ARGUMENT)), 60, lambda: waits.append(1))
    with pytest.raises(_Failed) as late:
        call_while_restarting(_calls(_Failed(grpc.StatusCode.UNAVAILABLE)), -1, lambda: waits.append(1))
    assert (
        refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        and late.value.code() == grpc.StatusCode.UNAVAILABLE
    )
    assert waits == []
