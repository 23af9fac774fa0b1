"""Inside a deployment, check what a sandbox of a service can reach: `python -m app.stack.sandbox_check
--config /etc/gyre/gyre.yaml --service runner` runs one sandbox with the service's configured launcher, on
this host (the service's container or pod), whose command does what a hostile harness or verifier would do
first: read every file of the deployment's TLS directory and of the NATS and Redis credentials files, and
the environment of every process, and dial NATS, Redis, every service's gRPC port and every engine. Exit 0
when it read none of them and reached none of them (and, for the runner, reached the proxy through its
relay — its harness API answered an HTTP request — which shows the sandbox ran and its network works);
else 1. The last line is one JSON object.

    kubectl -n gyre exec deploy/runner -- python -m app.stack.sandbox_check --config /etc/gyre/gyre.yaml --service runner
    docker compose -f deploy/compose/compose.yaml exec evaluator python -m app.stack.sandbox_check \\
        --config /etc/gyre/gyre.yaml --service evaluator

`--isolation NAME` checks another launcher than the configured one (`process`: the control that shows the
check can fail, since it runs as the service's own user). The sandbox runs under uids of its own, past the
service's (`uid_base + 1000 * CHECK_INSTANCE`), so its sweep cannot touch a live execution's processes.
`gyre bench cluster` and `gyre bench kube` run it in the runner's and the evaluator's containers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

CHECK_INSTANCE = 900
"""The check's sandbox uids are those of service instance 900: no deployment runs that many instances."""

SECRET_SUFFIXES = (".key", ".json", ".acl")
"""What `gyre tls init` writes that is secret: `tls.key`, `redis.json`, `users.acl`."""

ATTEMPT = r"""
import json, os, socket, sys
plan = json.loads(sys.argv[1])
read, denied = [], {}
for path in plan["files"]:
    try:
        with open(path, "rb") as f:
            f.read(1)
        read.append(path)
    except OSError as e:
        denied[path] = type(e).__name__
accepted, refused = [], {}
for host, port in plan["dial"]:
    try:
        socket.create_connection((host, port), timeout=3).close()
        accepted.append(f"{host}:{port}")
    except OSError as e:
        refused[f"{host}:{port}"] = type(e).__name__
proxy = None
if plan["proxy_port"]:
    try:
        conn = socket.create_connection(("127.0.0.1", plan["proxy_port"]), timeout=10)
        if plan["proxy_tls"]:
            import ssl
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            conn = context.wrap_socket(conn)
        conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
        proxy = conn.recv(12).startswith(b"HTTP/")
        conn.close()
    except OSError:
        proxy = False
print(json.dumps({"uid": os.getuid(), "read": read, "denied": denied, "accepted": accepted,
                  "refused": refused, "proxy_reached": proxy}))
"""


def _files(config: Any) -> list[str]:
    """Every credential a sandbox must not read: the TLS directory's secrets (private keys, Redis passwords,
    the Redis ACL file; not the certificates, which are public: a harness is given the CA's); the NATS and Redis
    credentials files of every identity; and the environment of every process here."""
    from gyre.authz import IDENTITIES

    found: set[Path] = set()
    if config.tls.enabled and Path(config.tls.dir).is_dir():
        found |= {p for p in Path(config.tls.dir).rglob("*") if p.is_file() and p.suffix in SECRET_SUFFIXES}
    for template in (config.nats.credentials_file, config.redis.credentials_file):
        if template:
            found |= {Path(template.replace("{service}", i)) for i in IDENTITIES}
    found = {p for p in found if p.is_file()}
    environs = [f"/proc/{pid}/environ" for pid in sorted(int(d) for d in os.listdir("/proc") if d.isdigit())]
    return [*sorted(str(p) for p in found), *environs]


def _targets(config: Any) -> list[tuple[str, int]]:
    """Every server of the deployment but the proxy's harness API: NATS, Redis, each service's gRPC port,
    each cell agent's and each engine's port."""
    run = config.run
    dial: list[tuple[str, int]] = []
    for url in (config.nats.url, config.redis.url):
        parts = urlsplit(url) if url else None
        if parts is not None and parts.hostname and parts.port:
            dial.append((parts.hostname, parts.port))
    for name in ("scheduler", "proxy", "runner", "evaluator", "packer"):
        port = getattr(config, name).port
        if port:
            dial.append((run.peer_host(name), port))
    cells = config.cell_agent
    for k in range(config.scheduler.num_cells):
        host = run.peer_host("cell_agent", k)
        for ports in (cells.ports, cells.engine_ports):
            if k < len(ports) and ports[k]:
                dial.append((host, ports[k]))
    return dial


async def check(config: Any, service: str, isolation: str | None = None) -> dict[str, Any]:
    """Run the check's sandbox with `service`'s launcher (or `isolation`'s) and judge what it reached."""
    from gyre.sandbox.host import run_labels
    from gyre.sandbox.launchers import LauncherSpec, NetworkPolicy, SandboxSpec, launcher_class
    from gyre.sandbox.uids import uid_range

    box = getattr(config, service).sandbox
    cls = launcher_class(isolation or box.isolation)
    if cls.own_filesystem:
        raise ValueError(
            f"the {cls.name} launcher's sandboxes are containers of the engine, not of this host: "
            "`gyre bench redteam` attacks them"
        )
    uids = uid_range(box.uid_base, CHECK_INSTANCE, 1) if cls.uses_uids else None
    launcher = cls.create(
        LauncherSpec(section=box, num_slots=1, uids=uids, labels=run_labels(config), work_dir=None)
    )
    proxy_port = 0
    network = NetworkPolicy("host")
    if service == "runner" and launcher.isolates_network and config.proxy.http_port:
        proxy_port = config.proxy.http_port
        network = NetworkPolicy.proxy(config.run.peer_host("proxy"), proxy_port)
    elif launcher.isolates_network:
        network = NetworkPolicy("none")
    files, dial = _files(config), _targets(config)
    plan = {"files": files, "dial": dial, "proxy_port": proxy_port, "proxy_tls": bool(config.tls.enabled)}
    base = Path(config.run.path) if Path(config.run.path).is_dir() else Path(tempfile.gettempdir())
    root = Path(tempfile.mkdtemp(prefix="sandbox-check-", dir=base))
    workspace = root / "ws"
    workspace.mkdir()
    spec = SandboxSpec(
        name=f"sandbox-check-{uuid.uuid4().hex[:8]}",
        argv=[sys.executable, "-I", "-S", "-c", ATTEMPT, json.dumps(plan)],
        cwd=workspace,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin"},
        root=root / "box",
        network=network,
        writable=(workspace,),
    )
    try:
        handle = await launcher.launch(spec)
        outcome = await handle.wait()
        output = handle.stdout()
        await handle.release()
    finally:
        await launcher.close()
        shutil.rmtree(root, ignore_errors=True)
    lines = [line for line in output.splitlines() if line.startswith("{")]
    if not lines:
        return {
            "service": service,
            "launcher": launcher.name,
            "ok": False,
            "error": f"the sandbox printed no result (exit {outcome.exit_code}): {output[-500:]!r}",
        }
    seen = json.loads(lines[-1])
    ok = not seen["read"] and not seen["accepted"] and seen["proxy_reached"] is not False
    return {
        "service": service,
        "launcher": launcher.name,
        "sandbox_uid": seen["uid"],
        "files_tried": len(files),
        "credentials_read": seen["read"],
        "connections_tried": len(dial),
        "connections_accepted": seen["accepted"],
        "proxy_reached": seen["proxy_reached"],
        "ok": ok,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.stack.sandbox_check", description=__doc__)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--service", choices=("runner", "evaluator"), required=True)
    parser.add_argument("--isolation", default=None, help="a launcher other than the configured one")
    args = parser.parse_args(argv)

    from gyre.config import load_config

    config = load_config(args.config)
    result = asyncio.run(check(config, args.service, args.isolation))
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
