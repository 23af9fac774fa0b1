"""The runner's side of the fork server (forkserver.py): start it, fork sandboxes from it, stop it.

    server = ForkServer.start("harness", paths=(repo,), log_path=run_dir / "logs" / "runner-forkserver.log")
    launcher.fork_server = server          # launches of `python -m harness …` now fork from it
    ...
    await server.stop()

The server preloads in the background (`ready()` waits for it, bounded); a launch that it cannot take
(another command, a different PYTHONPATH, a server that failed or died) starts the sandbox supervisor
as a new interpreter instead, so the fork server only ever changes what a start costs. The supervisor
it forks is not the runner's child: its exit comes back from the server (`ForkedProcess`: wait4 status
and the CPU time of the sandbox's whole process tree); if the server dies first, the handle polls the
supervisor's pid like an adopted sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from gyre import procs
from gyre.log import get_logger

SERVER_SCRIPT = Path(__file__).with_name("forkserver.py")
log = get_logger("gyre.runner.forkserver")


class ForkServerError(RuntimeError):
    """The fork server could not take a launch (the caller starts the sandbox the plain way)."""


class ForkedProcess:
    """A sandbox supervisor forked by the server: `returncode` and `wait()` as asyncio's Process has."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.started = procs.start_time(pid)
        self.status: int | None = None
        """wait4 status as the server reported it (None until then)."""
        self.cpu_s = 0.0
        """CPU seconds of the sandbox's process tree (supervisor, netns child, command and its children)."""
        self.done = asyncio.Event()

    @property
    def returncode(self) -> int | None:
        if self.status is not None:
            return os.waitstatus_to_exitcode(self.status)
        if self.server.alive or (self.started is not None and procs.alive(self.pid, self.started)):
            return None
        return -1  # the server died and so did the supervisor: its status.json tells how it ended

    async def wait(self) -> int:
        await self.done.wait()
        while self.returncode is None:  # the server died first: poll like an adopted sandbox
            await asyncio.sleep(0.2)
        code = self.returncode
        assert code is not None
        return code


class ForkServer:
    def __init__(self, module: str, paths: tuple[str, ...], log_path: Path, start_timeout_s: float) -> None:
        self.module = module
        self.paths = paths
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.info: dict[str, Any] = {}
        """The server's ready line: pid, preload_cpu_s, modules, maxrss_kb."""
        self.alive = False
        self.error = ""
        self._stopping = False
        self._process: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._ready = asyncio.get_running_loop().create_future()
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._forked: dict[int, ForkedProcess] = {}
        self._next_id = 0
        self._lock = asyncio.Lock()
        self._task = asyncio.ensure_future(self._run())

    @classmethod
    def start(
        cls, module: str, *, paths: tuple[str, ...], log_path: Path, start_timeout_s: float = 300.0
    ) -> ForkServer:
        """Start the server in the background (call from a running event loop)."""
        return cls(module, paths, log_path, start_timeout_s)

    def accepts(self, argv: list[str], env: dict[str, str]) -> bool:
        """`argv` is `python -m MODULE …` with the PYTHONPATH the server was started with."""
        return (
            argv[:3] == [sys.executable, "-m", self.module]
            and env.get("PYTHONPATH", "") == os.pathsep.join(self.paths)
            and not self.error
        )

    async def ready(self) -> bool:
        """Wait (bounded by the start timeout) until the server has preloaded; False if it failed."""
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), self.start_timeout_s)
        except TimeoutError:
            self._fail(f"not ready after {self.start_timeout_s:.0f} s")
        return self.alive

    async def spawn(self, spec_path: Path, log_path: Path) -> ForkedProcess:
        """Fork one sandbox supervisor on `spec_path`; ForkServerError when the server cannot."""
        if not await self.ready() or self._writer is None:
            raise ForkServerError(f"fork server unavailable: {self.error}")
        async with self._lock:
            self._next_id += 1
            request_id = self._next_id
            reply = self._replies[request_id] = asyncio.get_running_loop().create_future()
            line = json.dumps({"id": request_id, "spec": str(spec_path), "log": str(log_path)}) + "\n"
            try:
                self._writer.write(line.encode())
                await self._writer.drain()
            except (ConnectionError, OSError) as e:
                self._replies.pop(request_id, None)
                self._fail(f"request: {e}")
                raise ForkServerError(f"fork server unavailable: {e}") from None
        try:
            answer = await reply
        finally:
            self._replies.pop(request_id, None)
        if "pid" not in answer:
            raise ForkServerError(str(answer.get("error", "fork server refused the launch")))
        return self._forked[int(answer["pid"])]

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Close the socket (the server exits; sandboxes it started keep running) and wait for it."""
        self._stopping = True
        if self._writer is not None:
            self._writer.close()
        if self._process is not None and self._process.returncode is None:
            try:
                await asyncio.wait_for(self._process.wait(), timeout_s)
            except TimeoutError:
                self._process.kill()
                await self._process.wait()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with theirs, self.log_path.open("ab") as err:
                self._process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-I",
                    str(SERVER_SCRIPT),
                    "--fd",
                    str(theirs.fileno()),
                    "--module",
                    self.module,
                    *(a for p in self.paths for a in ("--path", p)),
                    pass_fds=(theirs.fileno(),),
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=err,
                )
            reader, self._writer = await asyncio.open_unix_connection(sock=ours)
            while line := await reader.readline():
                self._dispatch(json.loads(line))
            self._fail("the fork server exited")
        except (OSError, ValueError) as e:
            self._fail(f"{type(e).__name__}: {e}")
        finally:
            self.alive = False
            for forked in self._forked.values():
                forked.done.set()

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "exited" in message:
            forked = self._forked.pop(int(message["exited"]), None)
            if forked is not None:
                forked.status, forked.cpu_s = int(message["status"]), float(message["cpu_s"])
                forked.done.set()
        elif "ready" in message:
            self.info, self.alive = message, True
            log.info(
                "fork_server_ready", module=self.module, **{k: v for k, v in message.items() if k != "ready"}
            )
            if not self._ready.done():
                self._ready.set_result(True)
        elif "id" in message:
            if "pid" in message:
                self._forked[int(message["pid"])] = ForkedProcess(self, int(message["pid"]))
            reply = self._replies.get(int(message["id"]))
            if reply is not None and not reply.done():
                reply.set_result(message)
        elif "error" in message:
            self._fail(str(message["error"]))

    def _fail(self, error: str) -> None:
        if not self.error:
            self.error = "stopped" if self._stopping else error
            if not self._stopping:
                log.error("fork_server_unavailable", module=self.module, error=error, log=str(self.log_path))
        self.alive = False
        if not self._ready.done():
            self._ready.set_result(False)
        for reply in self._replies.values():
            if not reply.done():
                reply.set_result({"error": error})
