"""The fork server: one pre-imported interpreter from which sandboxes of a `python -m MODULE` harness
are forked, so an execution does not pay the interpreter start and its imports again (`import
anthropic` alone is ~3 CPU-seconds on a shared core; a fork is milliseconds).

Started by the runner (gyre/sandbox/forkclient.py), never by hand:

    python -I forkserver.py --fd N --module harness --path /repo

`-I` keeps the runner's environment and PYTHON* variables out; the server imports `MODULE.__main__`
(and with it the SDK) once, with `--path` entries first on sys.path, and holds nothing else: it is a
fresh process, not a fork of the runner, so no credential of the runner is in the memory each sandbox
inherits. It then serves requests on the socket `--fd` (one end of a socketpair; no filesystem
endpoint exists that a sandbox could reach), one JSON line each:

    → {"id": 7, "spec": "/…/control/spec.json", "log": "/…/control/supervisor.log"}
    ← {"id": 7, "pid": 4242}                  the sandbox supervisor, in its own session
    ← {"exited": 4242, "status": 0, "cpu_s": 0.21}   when it ends (wait4 status, CPU of its whole tree)

Each request is one fork. The child closes every inherited descriptor, starts a session, and runs
the sandbox supervisor of init.py on the spec exactly as `python -I -S init.py SPEC` would: the same
network namespace, mount namespace (reveal, binds, chroot), rlimits, uid/gid drop without groups,
process group, scrubbed environment and stdio files, the same status.json. Only the last step
differs: where init.py would exec `python -m MODULE ARGS`, the command process (already dropped,
limited and isolated) closes every descriptor but stdio, replaces `os.environ` with exactly the
spec's environment, and runs MODULE as `__main__` in place (runpy), then `_exit`s with its status.
A command that is not `python -m MODULE` is exec'd as usual.

What a fork does not renew, unlike an exec: the address-space layout (ASLR), the str hash seed and
the interpreter's flags (`-I`) are those of the fork server, shared by every execution it starts;
and the process stays non-dumpable after its uid change (no ptrace by its own uid, no core), which
is stricter. `ps` shows a forked execution under the server's command line (its name, `ps -o comm`,
is `MODULE-fork`). MODULE's `__main__` must do its work under `if __name__ == "__main__"` (the server
imports it once to load what it imports, then runs it fresh per execution, as `python -m` does).

The server is single-threaded (forking a threaded process is unsafe; it refuses to start if an import
started a thread), reaps its children on SIGCHLD through a wakeup pipe, and exits when the runner's
end of the socket closes; sandboxes it started keep running (each is its own session) for the runner
to adopt or stop.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import importlib.util
import io
import json
import os
import resource
import runpy
import select
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15


def load_init() -> ModuleType:
    """init.py of this directory, by path (the server runs as a script, outside the package)."""
    path = Path(__file__).with_name("init.py")
    spec = importlib.util.spec_from_file_location("gyre_sandbox_init", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_module(module: str, spec: dict[str, Any], report_fd: int) -> NoReturn:
    """In the command process, after init.py's isolation steps: run `python -m module args` in place."""
    os.closerange(3, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 65536)  # report_fd too
    del report_fd
    env: dict[str, str] = dict(spec["env"])
    if not env.get("LC_ALL") and (env.get("LC_CTYPE") or env.get("LANG") or "C") in ("C", "POSIX"):
        env["LC_CTYPE"] = "C.UTF-8"  # what a new interpreter's locale coercion (PEP 538) would set
    os.environ.clear()
    os.environ.update(env)
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    for name, fd, errors in (("stdout", 1, "strict"), ("stderr", 2, "backslashreplace")):
        raw = io.FileIO(fd, "w", closefd=False)
        setattr(
            sys,
            name,
            io.TextIOWrapper(
                raw if unbuffered else io.BufferedWriter(raw),
                encoding="utf-8",
                errors=errors,
                write_through=unbuffered or fd == 2,
                line_buffering=fd == 2,
            ),
        )
    if "tempfile" in sys.modules:
        sys.modules["tempfile"].tempdir = None  # TMPDIR is the sandbox's, not the server's
    signal.signal(signal.SIGINT, signal.default_int_handler)
    ctypes.CDLL(None).prctl(PR_SET_NAME, f"{module}-fork".encode()[:15])  # `ps -o comm` / top tell them apart
    sys.path.insert(0, os.getcwd())  # what `python -m` puts first
    sys.argv = [module, *spec["argv"][3:]]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code & 0xFF)


class Server:
    def __init__(self, sock: socket.socket, module: str, init: ModuleType) -> None:
        self.sock = sock
        self.module = module
        self.init = init
        self.prefix = [sys.executable, "-m", module]
        self.children: set[int] = set()
        self._buffer = b""

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall((json.dumps(message) + "\n").encode())

    def execute(self, spec: dict[str, Any], report_fd: int) -> NoReturn:
        if spec["argv"][:3] == self.prefix:
            run_module(self.module, spec, report_fd)
        self.init.exec_argv(spec, report_fd)

    def fork(self, request: dict[str, Any]) -> None:
        pid = os.fork()
        if pid == 0:
            self._child(request["spec"], request["log"])
        self.children.add(pid)
        self.send({"id": request["id"], "pid": pid})

    def _child(self, spec_path: str, log_path: str) -> NoReturn:
        code = 125
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            for fd, target in ((null, 0), (null, 1), (log, 2)):
                os.dup2(fd, target)
            os.closerange(3, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 65536)
            code = self.init.main(spec_path, execute=self.execute)
        except BaseException:
            traceback.print_exc()
        os._exit(code & 0xFF)

    def reap(self) -> None:
        while self.children:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            self.children.discard(pid)
            self.send({"exited": pid, "status": status, "cpu_s": round(usage.ru_utime + usage.ru_stime, 3)})

    def requests(self) -> list[dict[str, Any]] | None:
        """Complete request lines read from the socket; None when the runner closed it."""
        data = self.sock.recv(65536)
        if not data:
            return None
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def serve(self) -> int:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        while True:
            try:
                ready, _, _ = select.select([self.sock, wake_r], [], [])
            except InterruptedError:
                continue
            if wake_r in ready:
                while True:
                    try:
                        if not os.read(wake_r, 4096):
                            break
                    except BlockingIOError:
                        break
                self.reap()
            if self.sock in ready:
                batch = self.requests()
                if batch is None:
                    return 0
                for request in batch:
                    try:
                        self.fork(request)
                    except OSError as e:
                        self.send({"id": request.get("id"), "error": f"fork: {e}"})
            self.reap()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="forkserver.py")
    p.add_argument("--fd", type=int, required=True, help="this end of the runner's socketpair")
    p.add_argument("--module", required=True, help="the `python -m` module to serve pre-imported")
    p.add_argument(
        "--path", action="append", default=[], help="put first on sys.path (the harness's PYTHONPATH)"
    )
    args = p.parse_args(argv)
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # never outlive the runner
    sock = socket.socket(fileno=args.fd)
    started = time.process_time()
    try:
        sys.path[:0] = args.path
        importlib.import_module(f"{args.module}.__main__")
        del sys.modules[f"{args.module}.__main__"]  # its imports stay; `python -m` runs the file itself fresh
        init = load_init()
        if threading.active_count() != 1:
            raise RuntimeError(f"importing {args.module} started threads; a fork server cannot fork safely")
    except BaseException as e:
        sock.sendall(
            (json.dumps({"error": f"preload {args.module}: {type(e).__name__}: {e}"}) + "\n").encode()
        )
        return 1
    usage = resource.getrusage(resource.RUSAGE_SELF)
    sock.sendall(
        (
            json.dumps(
                {
                    "ready": True,
                    "pid": os.getpid(),
                    "modules": len(sys.modules),
                    "preload_cpu_s": round(time.process_time() - started, 3),
                    "maxrss_kb": usage.ru_maxrss,
                }
            )
            + "\n"
        ).encode()
    )
    return Server(sock, args.module, init).serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
