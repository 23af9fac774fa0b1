"""The proxy's HTTP server: uvicorn on a socket bound before serving, as a task of the caller's loop.

    server = HttpServer(build_app(core), host="127.0.0.1", port=0)
    await server.start()            # server.port is known from here on
    await server.wait()             # raises if uvicorn exits on its own (supervise this)
    await server.stop(grace_s=5)    # finish in-flight calls, then close

Signals stay with the host process (uvicorn's own handlers are off). TCP_NODELAY matters for
small SSE events: asyncio sets it only on sockets created with IPPROTO_TCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn
from starlette.applications import Starlette


class _HostedUvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    def __init__(self, app: Starlette, *, host: str, port: int) -> None:
        self.host = host
        self.requested_port = port
        self.port = 0
        self._config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_keep_alive=75,
            backlog=2048,
            log_config=None,  # uvicorn's lines go through the process's logging (JSON, gyre/log.py)
        )
        self._server = _HostedUvicorn(self._config)
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None
        self._stopping = False

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.requested_port))
        sock.listen(2048)
        sock.setblocking(False)
        self._socket = sock
        self.port = sock.getsockname()[1]
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="proxy-http")
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the proxy's HTTP server exited during startup")
            await asyncio.sleep(0.01)

    async def wait(self) -> None:
        """Return when stopped on purpose; raise if the server ended by itself."""
        assert self._task is not None, "start() first"
        await asyncio.shield(self._task)
        if not self._stopping:
            raise RuntimeError("the proxy's HTTP server stopped unexpectedly")

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish for `grace_s`, then close. Idempotent."""
        if self._stopping or self._task is None:
            return
        self._stopping = True
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=grace_s)
        except TimeoutError:
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._socket is not None:
            self._socket.close()
