"""Per-run credentials of the embedded default: one NATS user and one Redis ACL user per service.

`gyre up` / `gyre demo` call `generate(run_dir, run_id)` before starting the servers. It writes, all mode
0600 in a 0700 directory `runs/<run>/credentials/`:

    nats/<user>.json, redis/<user>.json   {"user": …, "password": …} for each client (`nats.credentials_file`,
                                          `redis.credentials_file` point at them with `{user}` → `{service}`)
    nats-users.json                       the nats-server `authorization.users` block (passwords and the
                                          subject permissions of gyre/bus/permissions.py)
    redis.acl                             the redis-server ACL file: the default user off, one user per
                                          client with keys `gyre:<run>:*` only and the commands it needs

Passwords are fresh random tokens each time a run starts; the Redis ACL file keeps only their SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from gyre.bus.permissions import BUS_USERS, permissions

#: Redis command rules per client. Services: data commands (`@read`, `@write`), Lua scripts (EVAL,
#: EVALSHA, SCRIPT LOAD: `@scripting`), MULTI/EXEC (`@transaction`), PING/AUTH/HELLO (`@connection`) and
#: TIME, never `@admin`/`@dangerous` (FLUSHALL, KEYS, CONFIG, DEBUG, SHUTDOWN, ...). `supervisor` only
#: checks that the server answers; `cli` reads (reports, `gyre trace`, memory figures from INFO).
_SERVICE_RULES = "-@all +@read +@write +@scripting +@transaction +@connection +time -@admin -@dangerous"
REDIS_RULES: dict[str, str] = {
    **{user: _SERVICE_RULES for user in BUS_USERS if user not in ("supervisor", "cli")},
    "supervisor": "-@all +ping +info",
    "cli": "-@all +@read +@connection +time -@admin -@dangerous +info",
}


def redis_acl_line(user: str, password: str, run_id: str, rules: str | None = None) -> str:
    """The ACL file line of `user`: on, its password's SHA-256, keys `gyre:<run>:*` only, no channels, and
    `rules` (default: its `REDIS_RULES`). The deploy shape's users.acl is made of the same lines
    (app/deploy/access.py)."""
    digest = hashlib.sha256(password.encode()).hexdigest()
    return f"user {user} on #{digest} resetkeys ~gyre:{run_id}:* resetchannels {rules or REDIS_RULES[user]}"


@dataclass(frozen=True, slots=True)
class RunCredentials:
    """Where a run's generated credentials are."""

    directory: Path

    @property
    def nats_template(self) -> str:
        """`nats.credentials_file` of the run."""
        return str(self.directory / "nats" / "{service}.json")

    @property
    def redis_template(self) -> str:
        """`redis.credentials_file` of the run."""
        return str(self.directory / "redis" / "{service}.json")

    @property
    def nats_users(self) -> Path:
        return self.directory / "nats-users.json"

    @property
    def redis_acl(self) -> Path:
        return self.directory / "redis.acl"


def _write_private(path: Path, text: str) -> None:
    """Create `path` with mode 0600 from the start (no window in which others could read it)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def generate(run_dir: Path, run_id: str) -> RunCredentials:
    """Fresh users and passwords for every client of `run_id`, written under `run_dir/credentials/`."""
    creds = RunCredentials(run_dir / "credentials")
    creds.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(creds.directory, 0o700)
    nats_users: list[dict[str, object]] = []
    acl = ["user default off"]
    for user in BUS_USERS:
        nats_password, redis_password = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        _write_private(
            Path(creds.nats_template.replace("{service}", user)),
            json.dumps({"user": user, "password": nats_password}),
        )
        _write_private(
            Path(creds.redis_template.replace("{service}", user)),
            json.dumps({"user": user, "password": redis_password}),
        )
        nats_users.append({"user": user, "password": nats_password, "permissions": permissions(run_id, user)})
        acl.append(redis_acl_line(user, redis_password, run_id))
    _write_private(creds.nats_users, json.dumps(nats_users, indent=1))
    _write_private(creds.redis_acl, "\n".join(acl) + "\n")
    return creds
