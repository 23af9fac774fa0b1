"""One training run of `gyre bench cluster` on a compose project that is up: wait for health, train with
node-level faults, shut down, read the events, check the invariants, gather where traffic went.

    result = ClusterRun(project, run_dir, config, ports, steps=6, faults=["satellite-kill"]).execute(420)

The host reaches the stack only through the ports compose publishes on 127.0.0.1 (the scheduler's gRPC,
NATS and its monitoring port, Redis, the proxy's HTTP), as the deployment's `cli` TLS identity; everything
between services goes between containers. After the run, `tls` gathers what the servers themselves say
about the connections (NATS's /connz `tls_version` of every client) and which clients they refuse:
plaintext ones and ones without a certificate, at NATS, Redis, the scheduler's gRPC, the proxy's and an
engine's HTTP (the last from inside the runner's container, as a neighbour would try). Beside the
servers' word, the wire's: `tls.capture` is a packet capture of the network's bridge for the whole run
(bench/_capture.py), every TCP connection between two containers classified by its client's first bytes,
TLS or plaintext; `tls.capture_all_tls` is its verdict (the refusal probes come after it, unseen).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import redis

from app.demo.events import read_events
from app.demo.faults import Fault, Injection, fault_report
from app.demo.ledger import read_event_lines
from app.demo.report import execution_counts
from app.deploy.access import REDIS_LOGIN_FILE
from bench._capture import NetworkCapture
from bench._compose import ComposeProject
from gyre import tls
from gyre.config.infra import read_login
from gyre.rpc import call_while_restarting, sync_channel
from gyre.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

SATELLITE, CORE = "cell-agent-2", "cell-agent-0"
PARTITION_S = 10.0


class ClusterRun:
    def __init__(
        self,
        project: ComposeProject,
        run_dir: Path,
        config: dict[str, Any],
        ports: dict[str, int],
        steps: int,
        faults: list[str],
        tls_dir: Path,
        capture: NetworkCapture | None = None,
    ) -> None:
        self.project = project
        self.capture = capture
        self.identity = tls.TlsFiles.under(tls_dir, "cli")
        self.tls_dir = tls_dir
        tls.configure(self.identity)  # the bench's channel to the scheduler and its NATS reader
        self.run_dir = run_dir
        self.run_id = str(config["run"]["id"])
        self.services = ["nats", "redis", "scheduler", "proxy", "runner", "evaluator", "packer"] + [
            f"cell-agent-{k}" for k in range(int(config["scheduler"]["num_cells"]))
        ]
        self.ports = ports
        self.steps = steps
        self.faults = faults
        self.injections: list[Injection] = []
        self.state: scheduler_pb2.SchedulerState | None = None

    def execute(self, start_timeout_s: float) -> dict[str, Any]:
        """Train with the faults. The scheduler starts the run as soon as every peer answers, which on a
        loaded machine is long before every container has passed its healthcheck: the faults' clock
        starts with the run (the first answer of the scheduler naming its cells), the healthchecks are
        awaited beside it."""
        ready: dict[str, float] = {}
        health = threading.Thread(
            target=lambda: ready.update(self.project.wait_healthy(self.services, start_timeout_s)),
            name="health",
            daemon=True,
        )
        health.start()
        channel = sync_channel(f"127.0.0.1:{self.ports['GYRE_SCHEDULER_PORT']}")
        scheduler = scheduler_pb2_grpc.SchedulerStub(channel)
        injector = threading.Thread(target=self._inject_all, name="faults", daemon=True)
        t0 = time.monotonic()
        try:
            while True:
                self.state = retrying(
                    lambda: scheduler.GetState(scheduler_pb2.GetStateRequest(), timeout=30), start_timeout_s
                )
                st = self.state
                print(
                    f"[cluster {time.monotonic() - t0:5.0f}s] step {st.steps}/{self.steps} "
                    f"faults {sum(bool(i.at_s) for i in self.injections)}/{len(self.faults)} "
                    f"healthy {len(ready)}/{len(self.services)}",
                    file=sys.stderr,
                    flush=True,
                )
                if not injector.is_alive() and not self.injections and self.faults and st.cells:
                    injector.start()
                if st.steps >= self.steps and not injector.is_alive() and not health.is_alive():
                    break
                if time.monotonic() - t0 > start_timeout_s + 60 * (5 + 3 * self.steps):
                    raise TimeoutError(f"{self.steps} steps not reached; at {st.steps}")
                time.sleep(1.0)
            if len(ready) < len(self.services):
                missing = sorted(set(self.services) - set(ready))
                raise TimeoutError(f"not healthy after {start_timeout_s:.0f} s: {', '.join(missing)}")
            print(f"[cluster] healthy: {ready}", file=sys.stderr, flush=True)
            train_s = time.monotonic() - t0
            retrying(
                lambda: scheduler.Shutdown(scheduler_pb2.ShutdownRequest(cancel_running=True), timeout=120)
            )
            settle(scheduler)
            if self.capture is not None:  # before the refusal probes below, which dial in plaintext
                self.capture.stop()
            hosts = self._hosts()
            secured = self._tls(hosts["hosts"])
            if self.capture is not None:
                wire = self.capture.report({ip: s for s, ip in hosts["hosts"].items()})
                secured["capture"] = wire
                secured["capture_all_tls"] = bool(wire["all_tls"])
        finally:
            channel.close()
        events_path, executions = self._save_events()
        report = fault_report(read_event_lines(events_path), self.injections, self.steps)
        rows = report["faults"]
        total = {
            k: sum(int(r[k]) for r in rows.values()) for k in ("lost", "double_trained", "harness_errors")
        }
        return {
            "completed": report["run"].get("completed", False) if isinstance(report["run"], dict) else False,
            "steps": int(self.state.steps) if self.state is not None else 0,
            **total,
            "recovery_s": {i.fault.label(): i.recovery_s for i in self.injections},
            "executions": executions,
            "faults": rows,
            "run": report["run"],
            "healthy_s": ready,
            "train_s": round(train_s, 1),
            **hosts,
            "tls": secured,
        }

    # -- faults ----------------------------------------------------------------------------------
    def _inject_all(self) -> None:
        at_step = 0
        for name in self.faults:
            fault = Fault(name, at_step=at_step, when="training" if name == "core-kill" else "any", name=name)
            injection = Injection(fault)
            self.injections.append(injection)
            if not self._wait_for(fault, timeout_s=600):
                injection.detail = "not injected: its moment never came"
                continue
            try:
                self._inject(injection)
            except Exception as e:  # the report says what went wrong; the run goes on
                injection.detail = f"{type(e).__name__}: {e}"
            at_step = (self.state.steps if self.state is not None else 0) + (1 if name != "core-kill" else 0)

    def _wait_for(self, fault: Fault, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            st = self.state
            if st is not None and self._moment(st, fault):
                return True
            time.sleep(0.2)
        return False

    def _moment(self, st: scheduler_pb2.SchedulerState, fault: Fault) -> bool:
        if not fault.at_step <= st.steps < self.steps:
            return False
        return fault.when != "training" or (
            bool(st.cells) and st.cells[0].role == common_pb2.CELL_ROLE_TRAINING
        )

    def _inject(self, injection: Injection) -> None:
        name = injection.fault.label()
        service = {"satellite-kill": SATELLITE, "satellite-partition": SATELLITE, "core-kill": CORE}.get(
            name, "redis"
        )
        before = self.project.containers()[service]
        injection.at_s = time.time()
        t0 = time.monotonic()
        if name.endswith("-kill"):
            self.project.kill(service)
            injection.detail = f"pid {before.pid} SIGKILLed"
        elif name == "satellite-partition":
            self.project.partition(service, PARTITION_S)
            t0 = time.monotonic()
            injection.detail = f"{service} ({before.ip}) off the network for {PARTITION_S:.0f} s"
        else:
            self.project.restart(service)
            injection.detail = "podman restart"
        injection.recovery_s = self._recovered(
            service, before.restarts if name.endswith("-kill") else None, t0
        )

    def _recovered(
        self, service: str, restarts_before: int | None, t0: float, timeout_s: float = 300
    ) -> float | None:
        while time.monotonic() - t0 < timeout_s:
            c = self.project.containers().get(service)
            restarted = restarts_before is None or (c is not None and c.restarts > restarts_before)
            if c is not None and c.state == "running" and restarted and self.project.healthcheck(service):
                return round(time.monotonic() - t0, 2)
            time.sleep(0.5)
        return None

    # -- after the run -----------------------------------------------------------------------------
    def _save_events(self) -> tuple[Path, dict[str, int]]:
        """The run's events as `gyre up` writes them (`events.jsonl`) and the report's execution counts
        from them (`summary.json`'s `executions`), which `gyre audit` checks against its own records."""
        from app.demo.run import _event_line

        events = asyncio.run(read_events(f"nats://127.0.0.1:{self.ports['GYRE_NATS_PORT']}", self.run_id))
        path = self.run_dir / "events.jsonl"
        with open(path, "w") as f:
            for r in events:
                f.write(_event_line(r) + "\n")
        executions = execution_counts(events)
        (self.run_dir / "summary.json").write_text(json.dumps({"executions": executions}, indent=2))
        return path, executions

    def _hosts(self) -> dict[str, Any]:
        """Every container's address; the engines the scheduler hands the proxy and the addresses their
        names resolve to inside the network; the address each NATS client connected from (/connz)."""
        found = self.project.containers()
        hosts = {s: c.ip for s, c in sorted(found.items())}
        engines = {}
        if self.state is not None:
            for cell in self.state.cells:
                url = cell.engine.url
                if not url:
                    continue
                name = url.split("//", 1)[-1].rsplit(":", 1)[0]
                engines[url] = hosts.get(name, "")
        connz = json.loads(
            urllib.request.urlopen(
                f"http://127.0.0.1:{self.ports['GYRE_NATS_MONITOR_PORT']}/connz?limit=1024", timeout=10
            ).read()
        )
        clients = {str(c.get("name") or c["cid"]): str(c["ip"]) for c in connz.get("connections", [])}
        gyre_ips = {ip for s, ip in hosts.items() if s not in ("nats", "redis")}
        crossed = (
            len(set(hosts.values())) == len(hosts)
            and bool(engines)
            and all(ip and ip != hosts.get("proxy") for ip in engines.values())
            and bool(clients)
            and {ip for ip in clients.values()} <= gyre_ips
        )
        return {"hosts": hosts, "engines": engines, "nats_clients": clients, "crossed_hosts": crossed}

    # -- transport security ------------------------------------------------------------------------------
    def _tls(self, hosts: dict[str, str]) -> dict[str, Any]:
        """What the servers say about their connections, and which clients they refuse. Every refusal is
        paired with a client with the deployment's certificate accepted on the same port, so a server that
        is not listening at all cannot pass for one that refuses."""
        p = self.ports
        connz = json.loads(
            urllib.request.urlopen(
                f"http://127.0.0.1:{p['GYRE_NATS_MONITOR_PORT']}/connz?limit=1024", timeout=10
            ).read()
        )
        nats_tls = {
            str(c.get("name") or c["cid"]): str(c.get("tls_version", "")) for c in connz["connections"]
        }
        redis_view = _redis_server_view(p["GYRE_REDIS_PORT"], self.tls_dir, hosts)
        cli_cert = {
            "ssl_certfile": str(self.identity.cert),
            "ssl_keyfile": str(self.identity.key),
            "ssl_ca_certs": str(self.identity.ca),
        }
        no_cert = ssl.create_default_context(cafile=str(self.identity.ca))
        scheduler = f"127.0.0.1:{p['GYRE_SCHEDULER_PORT']}"
        refused = {
            "nats plaintext": _refused(lambda: _nats_ping(p["GYRE_NATS_PORT"], None)),
            "nats without certificate": _refused(lambda: _nats_ping(p["GYRE_NATS_PORT"], no_cert)),
            "redis plaintext": _refused(lambda: _redis_ping(p["GYRE_REDIS_PORT"], None)),
            "redis without certificate": _refused(
                lambda: _redis_ping(p["GYRE_REDIS_PORT"], {"ssl_ca_certs": str(self.identity.ca)})
            ),
            # Redis cannot map a certificate to an ACL user: without its identity's password, a client is
            # the `default` user, which is off.
            "redis with certificate, without password": _refused(
                lambda: _redis_ping(p["GYRE_REDIS_PORT"], cli_cert)
            ),
            "scheduler grpc plaintext": _refused(lambda: _grpc_health(grpc.insecure_channel(scheduler))),
            "scheduler grpc without certificate": _refused(
                lambda: _grpc_health(
                    grpc.secure_channel(
                        scheduler, grpc.ssl_channel_credentials(self.identity.ca.read_bytes())
                    )
                )
            ),
            "proxy http plaintext": _refused(lambda: _http_get(p["GYRE_PROXY_HTTP_PORT"], None)),
            "engine http plaintext": self._inside(_ENGINE_PROBE, "http", None) == _REFUSED,
            "engine https without certificate": self._inside(_ENGINE_PROBE, "https", None) == _REFUSED,
            "cell grpc plaintext": self._inside(_GRPC_PROBE, "plaintext", None) == _REFUSED,
            "cell grpc without certificate": self._inside(_GRPC_PROBE, "tls", None) == _REFUSED,
        }
        accepted = {
            "nats with certificate": not _refused(
                lambda: _nats_ping(p["GYRE_NATS_PORT"], self.identity.client_context())
            ),
            "redis with certificate and password": not _refused(
                lambda: _redis_ping(p["GYRE_REDIS_PORT"], cli_cert, _redis_login(self.tls_dir, "cli"))
            ),
            "scheduler grpc with certificate": not _refused(lambda: _grpc_health(sync_channel(scheduler))),
            "proxy https (the CA, no certificate: a harness)": not _refused(
                lambda: _http_get(p["GYRE_PROXY_HTTP_PORT"], no_cert)
            ),
            "engine https with certificate": self._inside(_ENGINE_PROBE, "https", "runner") == 0,
            "cell grpc with certificate": self._inside(_GRPC_PROBE, "tls", "runner") == 0,
        }
        return {
            "nats_tls_versions": nats_tls,
            "all_nats_clients_tls": bool(nats_tls) and all(nats_tls.values()),
            "redis": redis_view,
            "refused": refused,
            "accepted": accepted,
            "secure": all(refused.values())
            and all(accepted.values())
            and bool(nats_tls)
            and all(nats_tls.values())
            and redis_view["tls_only"],
        }

    def _inside(self, probe: str, mode: str, identity: str | None) -> int:
        """Run `probe` inside the runner's container, as a neighbour on the network would dial cell 1
        (`mode`; `identity`: the certificate it shows, or none); its exit code: 0 = answered,
        `_REFUSED` = the server refused it, anything else = the probe could not run."""
        name = self.project.containers()["runner"].name
        argv = ["podman", "exec", name, "python", "-c", probe, mode, identity or ""]
        done = subprocess.run(argv, env=self.project.env, capture_output=True, timeout=60)
        return done.returncode


_REFUSED = 3
_ENGINE_PROBE = """
import ssl, sys, urllib.request
scheme, ident = sys.argv[1], sys.argv[2]
ctx = ssl.create_default_context(cafile="/etc/gyre/tls/runner/ca.crt")
if ident:
    ctx.load_cert_chain(f"/etc/gyre/tls/{ident}/tls.crt", f"/etc/gyre/tls/{ident}/tls.key")
try:
    urllib.request.urlopen(f"{scheme}://cell-agent-1:30000/health", timeout=10,
                           context=ctx if scheme == "https" else None)
except Exception as e:
    print(type(e).__name__, e); sys.exit(3)
"""
"""An engine's HTTP from inside a container (the runner's, which has Python and its own certificate)."""
_GRPC_PROBE = """
import sys, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
mode, ident = sys.argv[1], sys.argv[2]
d = f"/etc/gyre/tls/{ident or 'runner'}"
ca = open(f"{d}/ca.crt", "rb").read()
if mode == "plaintext":
    channel = grpc.insecure_channel("cell-agent-1:50060")
elif ident:
    key, cert = open(f"{d}/tls.key", "rb").read(), open(f"{d}/tls.crt", "rb").read()
    channel = grpc.secure_channel("cell-agent-1:50060", grpc.ssl_channel_credentials(ca, key, cert))
else:
    channel = grpc.secure_channel("cell-agent-1:50060", grpc.ssl_channel_credentials(ca))
try:
    health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
except grpc.RpcError as e:
    print(e.code(), e.details()); sys.exit(3)
"""
"""A cell agent's gRPC from inside a container."""


def _redis_login(tls_dir: Path, identity: str) -> dict[str, str]:
    """`identity`'s Redis ACL user and password (`gyre tls init`'s `<identity>/redis.json`)."""
    login = read_login(str(tls_dir / "{service}" / REDIS_LOGIN_FILE), identity)
    assert login is not None
    return {"username": login.user, "password": login.password}


def _redis_server_view(port: int, tls_dir: Path, hosts: dict[str, str]) -> dict[str, Any]:
    """Redis's own word on its listeners (`CONFIG GET`: no plaintext port, client certificates required)
    and on its clients (`CLIENT LIST`: the container each connected from; with no plaintext port, every
    one of them came in over TLS), asked as the `redis` identity (the ACL user of its health check, which
    may read both; `cli` may not)."""
    identity = tls.TlsFiles.under(tls_dir, "redis")
    login = _redis_login(tls_dir, "redis")
    client = redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_timeout=10,
        ssl=True,
        ssl_cert_reqs="required",
        ssl_certfile=str(identity.cert),
        ssl_keyfile=str(identity.key),
        ssl_ca_certs=str(identity.ca),
        username=login["username"],
        password=login["password"],
    )
    try:
        config = {
            str(k, "utf-8") if isinstance(k, bytes) else str(k): str(v, "utf-8")
            if isinstance(v, bytes)
            else v
            for name in ("port", "tls-port", "tls-auth-clients")
            for k, v in client.config_get(name).items()
        }
        me = client.client_id()
        by_ip = {ip: s for s, ip in hosts.items()}
        clients = sorted(
            by_ip.get(str(c["addr"]).rsplit(":", 1)[0], str(c["addr"]))
            for c in client.client_list()
            if int(c["id"]) != me
        )
    finally:
        client.close()
    return {
        "config": config,
        "clients": clients,
        "tls_only": config.get("port") == "0" and config.get("tls-auth-clients") == "yes" and bool(clients),
    }


def _refused(attempt: Any) -> bool:
    """True when `attempt()` raised (the server refused the client, or the handshake failed)."""
    try:
        attempt()
    except Exception:
        return True
    return False


def _nats_ping(port: int, context: ssl.SSLContext | None) -> None:
    import nats

    async def ping() -> None:
        options: dict[str, Any] = {"tls": context} if context is not None else {}
        nc = await nats.connect(
            f"nats://127.0.0.1:{port}",
            allow_reconnect=False,
            connect_timeout=5,
            max_reconnect_attempts=0,
            **options,
        )
        try:
            await nc.flush(timeout=5)
        finally:
            await nc.close()

    asyncio.run(ping())


def _redis_ping(port: int, secure: dict[str, str] | None, login: dict[str, str] | None = None) -> None:
    options: dict[str, Any] = (
        {"ssl": True, "ssl_cert_reqs": "required", **secure} if secure is not None else {}
    )
    options.update(login or {})
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, socket_connect_timeout=5, **options)
    try:
        if not client.ping():
            raise RuntimeError("no PONG")
    finally:
        client.close()


def _grpc_health(channel: grpc.Channel) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with channel:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)


def _http_get(port: int, context: ssl.SSLContext | None) -> None:
    scheme = "https" if context is not None else "http"
    try:
        urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/v1/models", timeout=5, context=context)
    except urllib.error.HTTPError:
        return  # an HTTP answer (401, 404): the exchange itself went through


def retrying(call: Any, timeout_s: float = 300) -> Any:
    """`call()`, retried while the service it reaches restarts (a container or pod played again)."""
    return call_while_restarting(call, timeout_s, wait=lambda: time.sleep(0.5))


def settle(scheduler: scheduler_pb2_grpc.SchedulerStub, timeout_s: float = 180) -> None:
    """Wait (at most `timeout_s`) until the run has no execution in flight, and its last evaluations land."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = retrying(lambda: scheduler.GetState(scheduler_pb2.GetStateRequest(), timeout=30))
        if st.executions_in_flight == 0:
            time.sleep(2.0)  # the last evaluations land
            return
        time.sleep(0.5)
