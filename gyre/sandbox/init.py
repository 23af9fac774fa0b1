"""The in-sandbox supervisor: sets up isolation, runs one command, records how it ended.

Started by the runner (and the evaluator) as `python -I init.py CONTROL_DIR/spec.json`, in its
own session (process group = its pid), as root for the `isolated` launcher. Standard library only,
so it starts fast and imports nothing of the repository. Three processes:

    supervisor   host network; for network mode `proxy` serves CONTROL_DIR/proxy.sock and relays
                 each connection to the proxy's TCP address; waits for the netns child, then
                 adds the CPU time of the whole sandbox to status.json (`sandbox_cpu_s`).
    netns child  (modes `proxy` and `none`) a new network namespace with only loopback up; for
                 `proxy` listens on 127.0.0.1:PORT and relays to proxy.sock; forks the command,
                 waits for it and writes CONTROL_DIR/status.json (exit code or signal, rusage).
    command      in its own process group (the runner signals that group: the supervisor
                 survives to record the outcome); in a private mount namespace, reveals the paths it needs that sit under
                 directories closed to other users (see `reveal`); with `binds`, chroots into a view
                 of the host root in which they are mounted (see `enter_root`); drops to the sandbox uid/gid
                 (no supplementary groups), applies the rlimits,
                 resets SIGPIPE/SIGXFSZ, chdirs into the workspace and execs with the given env;
                 stdout/stderr go to CONTROL_DIR/{stdout,stderr}.log. A failure before exec
                 reaches the parent through a close-on-exec pipe and is recorded as `exec_error`.
                 (Under the fork server, forkserver.py, the same steps run in a fork of a
                 pre-imported interpreter, which runs a `python -m` harness in place of the exec.)

The supervisor and the netns child ignore SIGTERM (a group-wide SIGTERM is meant for the
command); they end when the command has ended. Mode `host` skips the namespace (no network
isolation). The spec keys are written by `gyre/sandbox/launchers/supervised.py`.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import resource
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

CLONE_NEWNET, CLONE_NEWNS = 0x40000000, 0x00020000
MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 4096, 8192, 0x4000, 1 << 18
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
RLIMITS = {
    "cpu_s": resource.RLIMIT_CPU,
    "address_space_bytes": resource.RLIMIT_AS,
    "processes": resource.RLIMIT_NPROC,
    "file_size_bytes": resource.RLIMIT_FSIZE,
    "open_files": resource.RLIMIT_NOFILE,
    "core_bytes": resource.RLIMIT_CORE,
}


def write_json(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, SIOCGIFFLAGS, ifr))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def _libc_call(name: str, *args: Any) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}{args}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(v: str | None) -> bytes | None:
        return v.encode() if v is not None else None

    _libc_call("mount", enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))


def new_network_namespace() -> None:
    _libc_call("unshare", CLONE_NEWNET)
    loopback_up()


def closed_ancestor(path: str) -> tuple[str, str] | None:
    """(first ancestor of `path` that others cannot traverse, the next component) or None."""
    parts = [p for p in path.split("/") if p]
    current = "/"
    for part in parts:
        if not os.stat(current).st_mode & 0o001:
            return current, part
        current = os.path.join(current, part)
    return None


def _closed_groups(paths: list[str]) -> dict[str, set[str]]:
    groups: dict[str, set[str]] = {}
    for path in paths:
        found = closed_ancestor(os.path.realpath(path))
        if found:
            groups.setdefault(found[0], set()).add(found[1])
    return groups


_private = False


def private_mounts() -> None:
    """A mount namespace of this process's own, whose mounts the host never sees (once)."""
    global _private
    if not _private:
        _libc_call("unshare", CLONE_NEWNS)
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        _private = True


def _cover(directory: str) -> None:
    """Replace `directory` by a tmpfs holding bind mounts of its entries, so entries can be added to it
    without touching the host (entries are held by O_PATH fds and bound back through /proc/self/fd)."""
    held = [
        (
            name,
            os.path.isdir(os.path.join(directory, name))
            and not os.path.islink(os.path.join(directory, name)),
            os.path.islink(os.path.join(directory, name)),
            os.open(os.path.join(directory, name), os.O_PATH | os.O_NOFOLLOW),
        )
        for name in os.listdir(directory)
    ]
    links = {name: os.readlink(os.path.join(directory, name)) for name, _, is_link, _ in held if is_link}
    _mount("tmpfs", directory, "tmpfs", 0, "mode=0755")
    for name, is_dir, is_link, fd in held:
        target = os.path.join(directory, name)
        if is_link:
            os.symlink(links[name], target)
        elif is_dir:
            os.mkdir(target)
            _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        else:
            open(target, "w").close()
            _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
        os.close(fd)


def _mountpoint(new_root: str, target: str, is_dir: bool, owned: set[str]) -> str:
    """Create `target` (absolute, inside `new_root`) as a mount point; directories that belong to the
    host are covered first, so nothing is created on the host."""
    current = new_root
    parts = [p for p in target.split("/") if p]
    for i, part in enumerate(parts):
        nxt = os.path.join(current, part)
        last = i == len(parts) - 1
        if os.path.islink(nxt):
            raise OSError(f"bind target {target} passes through the symlink /{'/'.join(parts[: i + 1])}")
        if not os.path.lexists(nxt):
            if current not in owned:
                _cover(current)
                owned.add(current)
            if last and not is_dir:
                open(nxt, "w").close()
            else:
                os.mkdir(nxt, 0o755)
            owned.add(nxt)
        current = nxt
    return current


def enter_root(new_root: str, binds: list[list[str]]) -> None:
    """chroot into a view of the host root (a tmpfs holding a bind mount of every top-level entry)
    in which each (source, target) of `binds` is bind-mounted at its absolute target."""
    private_mounts()
    os.makedirs(new_root, exist_ok=True)
    _mount("tmpfs", new_root, "tmpfs", 0, "mode=0755")
    owned = {new_root}
    for name in os.listdir("/"):
        source, target = "/" + name, os.path.join(new_root, name)
        if os.path.islink(source):
            os.symlink(os.readlink(source), target)
        elif os.path.isdir(source):
            os.mkdir(target)
            _mount(source, target, None, MS_BIND | MS_REC)
        else:
            open(target, "w").close()
            _mount(source, target, None, MS_BIND)
    for source, inside in binds:
        point = _mountpoint(new_root, inside, os.path.isdir(source), owned)
        _mount(source, point, None, MS_BIND | MS_REC)
    os.chroot(new_root)
    os.chdir("/")


def reveal(paths: list[str], max_depth: int = 16) -> None:
    """Make `paths` reachable for the sandbox uid without changing the host's permissions.

    In a private mount namespace of the command, every closed ancestor directory (e.g. a 0700
    /root holding the Python installation, or a 0700 pytest temp dir) is covered by a tmpfs that
    holds only bind mounts of the entries on the way to `paths`; the rest of that directory is
    hidden. Entries are opened (O_PATH) before they are covered and bound back through
    /proc/self/fd. Nested closed directories are handled one level per round.
    """
    groups = _closed_groups(paths)
    if not groups:
        return
    private_mounts()
    for _ in range(max_depth):
        if not groups:
            return
        held: list[tuple[str, bool, int]] = []
        for closed, names in groups.items():
            for name in sorted(names):
                source = os.path.join(closed, name)
                held.append((source, os.path.isdir(source), os.open(source, os.O_PATH | os.O_CLOEXEC)))
        for closed in groups:
            _mount("tmpfs", closed, "tmpfs", 0, "mode=0755")
        for source, is_dir, fd in held:
            if is_dir:
                os.mkdir(source)
            else:
                open(source, "w").close()
            _mount(f"/proc/self/fd/{fd}", source, None, MS_BIND | MS_REC)
            os.close(fd)
        groups = _closed_groups(paths)
    raise PermissionError(f"cannot reveal {sorted(groups)} within {max_depth} levels of closed directories")


def pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
        with contextlib.suppress(OSError):
            s.shutdown(how)


def relay(listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
    """Accept forever; join each connection to a fresh upstream connection (two pump threads).

    A peer that goes away mid-connection (the proxy killed and restarted under a harness) is an EPIPE for
    that connection only: SIGPIPE is ignored here (main thread), else it would kill the whole sandbox."""
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)

    def serve(conn: socket.socket) -> None:
        try:
            upstream = connect()
        except OSError:
            conn.close()
            return
        threads = [
            threading.Thread(target=pump, args=p, daemon=True) for p in ((conn, upstream), (upstream, conn))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        conn.close()
        upstream.close()

    def loop() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()


def exec_argv(spec: dict[str, Any], report_fd: int) -> NoReturn:
    """The last step of the command's process: exec its argv (the close-on-exec report pipe closes)."""
    os.execvpe(spec["argv"][0], spec["argv"], spec["env"])


Execute = Callable[[dict[str, Any], int], NoReturn]
"""The command's last step (`exec_argv`; the fork server runs a pre-imported module in place)."""


def exec_command(
    spec: dict[str, Any], report_fd: int, listener: socket.socket | None, execute: Execute = exec_argv
) -> NoReturn:
    """In the command's process: drop privileges, apply limits, then `execute`. Never returns."""
    try:
        if listener is not None:
            listener.close()
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        os.setpgid(0, 0)  # the command's own group: stopping it leaves the supervisor to report
        control = spec["control_dir"]
        stdin = os.open(os.devnull, os.O_RDONLY)
        out = os.open(os.path.join(control, "stdout.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        err = os.open(os.path.join(control, "stderr.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        for fd, target in ((stdin, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
        if spec.get("uid") is not None:
            reveal(spec.get("reveal", []))
        if spec.get("binds"):
            enter_root(spec["root_dir"], spec["binds"])
        for name, value in spec["limits"].items():
            if value is not None:
                resource.setrlimit(RLIMITS[name], (value, value))
        if spec.get("uid") is not None:
            os.setgroups([])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
        os.chdir(spec["cwd"])
        os.umask(0o022)
        execute(spec, report_fd)
    except BaseException as e:  # everything before exec is reported to the parent
        try:
            os.write(report_fd, f"{type(e).__name__}: {e}".encode()[:1000])
        finally:
            os._exit(127)


def run_command(spec: dict[str, Any], listener: socket.socket | None, execute: Execute = exec_argv) -> int:
    """In the netns child: fork the command, wait, write status.json. Returns the exit status."""
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    started = time.time()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        exec_command(spec, write_fd, listener, execute)
    os.close(write_fd)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also from the parent, so the group exists before anyone signals it
    write_json(os.path.join(spec["control_dir"], "command.json"), {"pid": pid})
    if listener is not None:
        relay(listener, lambda: _unix_connect(spec["network"]["socket"]))
    with os.fdopen(read_fd, "rb") as r:
        exec_error = r.read().decode(errors="replace")
    _, status, usage = os.wait4(pid, 0)
    result = {
        "command_pid": pid,
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "exec_error": exec_error or None,
        "started_at": started,
        "ended_at": time.time(),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "maxrss_kb": usage.ru_maxrss,
    }
    write_json(os.path.join(spec["control_dir"], "status.json"), result)
    return status


def _unix_connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def tcp_connect(host: str, port: int, connect_timeout_s: float = 30.0) -> socket.socket:
    """A blocking connection to the proxy; `connect_timeout_s` bounds the connect only: a model call may
    send nothing for minutes (a slow engine's first token, a drain), and a read timeout would cut it."""
    s = socket.create_connection((host, port), timeout=connect_timeout_s)
    s.settimeout(None)
    return s


def netns_child(spec: dict[str, Any], execute: Execute = exec_argv) -> NoReturn:
    """Never returns: isolates the network, runs the command, exits with its status."""
    code = 125
    try:
        mode = spec["network"]["mode"]
        listener = None
        if mode in ("proxy", "none"):
            new_network_namespace()
        if mode == "proxy":
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", spec["network"]["listen_port"]))
            listener.listen(128)
        status = run_command(spec, listener, execute)
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    except BaseException as e:  # recorded for the runner, which reports INFRA_FAILURE
        write_json(
            os.path.join(spec["control_dir"], "status.json"), {"setup_error": f"{type(e).__name__}: {e}"}
        )
    os._exit(code)


def record_sandbox_cpu(status_path: str) -> None:
    """Add `sandbox_cpu_s` to the status: CPU of this supervisor and everything it waited for (the
    netns child, the command and the command's children), i.e. what the whole sandbox cost."""
    try:
        with open(status_path) as f:
            status = json.load(f)
    except (OSError, ValueError):
        return
    cpu = sum(
        u.ru_utime + u.ru_stime
        for u in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )
    write_json(status_path, {**status, "sandbox_cpu_s": round(cpu, 3)})


def main(spec_path: str, execute: Execute = exec_argv) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    network = spec["network"]
    os.chdir(spec["control_dir"])  # the relay socket is bound by a relative name (AF_UNIX paths are short)
    try:
        if network["mode"] == "proxy":
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            if os.path.exists(network["socket"]):
                os.unlink(network["socket"])
            listener.bind(network["socket"])
            listener.listen(128)
    except OSError as e:
        write_json(os.path.join(spec["control_dir"], "status.json"), {"setup_error": f"proxy relay: {e}"})
        return 125
    pid = os.fork()
    if pid == 0:
        if network["mode"] == "proxy":
            listener.close()
        netns_child(spec, execute)
    if network["mode"] == "proxy":
        target = (network["target_host"], network["target_port"])
        relay(listener, lambda: tcp_connect(*target))
    _, status = os.waitpid(pid, 0)
    status_path = os.path.join(spec["control_dir"], "status.json")
    if not os.path.exists(status_path):
        killed_by = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        write_json(
            status_path,
            {
                "setup_error": f"sandbox child ended without a status (signal {killed_by})",
                "signal": killed_by,
            },
        )
    record_sandbox_cpu(status_path)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
