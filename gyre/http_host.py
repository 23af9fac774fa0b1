"""`HttpHost`: an ASGI app served by uvicorn as a task of the caller's event loop, on a socket bound first.

The proxy's harness-facing API and the embedded engine's SGLang API are both hosted this way:

    host = HttpHost(app, host="127.0.0.1", port=0, name="proxy-http")
    await host.start()              # host.port is known from here on (port 0 picks a free one)
    supervisor.spawn(host.wait(), "http")   # raises if uvicorn exits on its own
    await host.stop(grace_s=5)      # stop accepting, let in-flight requests finish, then close

Why this shape: binding before serving makes the port known when `start()` returns (port 0 works, and
a port in use fails `start()`, not a background task); uvicorn's signal handlers are off because the
host process owns its signals (gyre.lifecycle); uvicorn's log lines go through the process's logging
(JSON, gyre/log.py). The socket is created with IPPROTO_TCP because asyncio sets TCP_NODELAY only on
sockets that say they are TCP; without it small responses and SSE events wait ~40 ms on Nagle plus
delayed ACK. The uvicorn configuration is built in `_uvicorn_config` and nowhere else, TLS included: with
a TLS identity configured (`gyre.tls.configure`) the host serves HTTPS with it, and asks clients for a
certificate the deployment's CA signed unless `client_certificates=False` (the proxy's harness API, whose
callers authenticate with their per-execution keys).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import uvicorn

from gyre import tls

STARTUP_POLL_S = 0.01


class _HostedUvicorn(uvicorn.Server):
    """uvicorn without signal handlers: the host process owns its signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpHost:
    def __init__(
        self,
        app: Any,
        *,
        host: str,
        port: int,
        name: str,
        listen_backlog: int = 2048,
        keep_alive_s: int = 75,
        client_certificates: bool = True,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.port = 0
        self.name = name
        self._listen_backlog = listen_backlog
        self._client_certificates = client_certificates
        self._server = _HostedUvicorn(self._uvicorn_config(app, keep_alive_s))
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None
        self._stopping = False

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def _uvicorn_config(self, app: Any, keep_alive_s: int) -> uvicorn.Config:
        self.tls = tls.current()
        secure: dict[str, Any] = {}
        if self.tls is not None:
            secure = {
                "ssl_certfile": str(self.tls.cert),
                "ssl_keyfile": str(self.tls.key),
                "ssl_ca_certs": str(self.tls.ca),
                "ssl_cert_reqs": ssl.CERT_REQUIRED if self._client_certificates else ssl.CERT_NONE,
            }
        return uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_keep_alive=keep_alive_s,
            backlog=self._listen_backlog,
            log_config=None,  # uvicorn's lines go through the process's logging (JSON, gyre/log.py)
            **secure,
        )

    async def start(self) -> None:
        """Bind `host:port`, start serving, return once uvicorn has started (raises if it could not)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.requested_port))
            sock.listen(self._listen_backlog)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._socket = sock
        self.port = sock.getsockname()[1]
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name=self.name)
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError(f"the {self.name} server exited during startup")
            await asyncio.sleep(STARTUP_POLL_S)

    async def wait(self) -> None:
        """Return when stopped on purpose; raise if the server ended by itself."""
        assert self._task is not None, "start() first"
        await asyncio.shield(self._task)
        if not self._stopping:
            raise RuntimeError(f"the {self.name} server stopped unexpectedly")

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
