"""What each identity of the deploy shape (compose, Kubernetes) may do on NATS and Redis, from the same tables
as the embedded default's per-run users (gyre/bus/permissions.py for NATS, app/stack/credentials.py's
`REDIS_RULES` for Redis).

NATS: the server maps a client's certificate to a user by its subject (`tls { verify_and_map: true }`):
`CN=<identity>`, as `gyre tls init` (gyre.tls.issue) and the cert-manager Certificates
(deploy/k8s/components/cert-manager) issue them, and `authorization.users` gives each user its subjects.
`nats_permissions(run_id)` is that block, deploy/nats/nats.conf includes it as `permissions.conf`:

    gyre deploy nats-permissions --config deploy/k8s/base/gyre.yaml --out deploy/nats/permissions.conf

(the committed file, for Kubernetes' run id; tests/unit/deploy/test_access.py fails when it differs), and
`gyre tls init --config C --out D` writes `D/nats/permissions.conf` for C's run id (compose mounts it).

Redis 6.2/7 cannot map a certificate to an ACL user, so each identity logs in with a password as well:
`gyre tls init` writes `D/<identity>/redis.json` (`{"user", "password"}`, the format of
`redis.credentials_file`, which the deploy configs point at `/etc/gyre/tls/{service}/redis.json`) and the
server's ACL file `D/redis/users.acl` (SHA-256 of the passwords; the `default` user off; keys
`gyre:<run>:*` only).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from app.stack.credentials import REDIS_RULES, redis_acl_line
from gyre.bus.permissions import BUS_USERS, permissions
from gyre.tls import CELL_AGENT, cell_directory

DEPLOY_NATS_USERS: tuple[str, ...] = tuple(user for user in BUS_USERS if user != "supervisor")
"""Identities with a NATS user in the deploy shape: the services and `cli` (the embedded default's
`supervisor` has no deploy counterpart: the container runtime or the kubelet restarts containers)."""

REDIS_MONITOR_RULES = "-@all +ping +info +config|get +client|list +client|id"
"""The `redis` identity's own ACL user: the container's health check (PING) and an operator's look at the
server (INFO, CONFIG GET, CLIENT LIST), no key. The embedded default's `supervisor` (PING, INFO) has the
role of the health check there."""

DEPLOY_REDIS_RULES: dict[str, str] = {
    **{user: rules for user, rules in REDIS_RULES.items() if user != "supervisor"},
    "redis": REDIS_MONITOR_RULES,
}
"""Identities with a Redis ACL user in the deploy shape and their commands (keys: `gyre:<run>:*`)."""

PERMISSIONS_FILE = "permissions.conf"
"""nats-server's users (the `nats` identity's directory of `gyre tls init`, deploy/nats/ for Kubernetes)."""
REDIS_LOGIN_FILE = "redis.json"
"""Each Redis client identity's login (`redis.credentials_file: <tls.dir>/{service}/redis.json`)."""
REDIS_ACL_FILE = "users.acl"
"""redis-server's ACL file, in the `redis` identity's directory (redis.conf's `aclfile`)."""


def nats_user(identity: str) -> str:
    """The NATS user a certificate of `identity` maps to: its subject in RFC 2253 form, as nats-server's
    `verify_and_map` spells it (gyre.tls.issue and cert-manager put the identity in the CN alone)."""
    return f"CN={identity}"


def nats_permissions(run_id: str) -> str:
    """nats-server config text: the `authorization` block of every deploy identity, for run `run_id`."""
    users = [{"user": nats_user(u), "permissions": permissions(run_id, u)} for u in DEPLOY_NATS_USERS]
    body = ",\n".join("    " + json.dumps(u, indent=None) for u in users)
    return (
        "# Generated from gyre/bus/permissions.py by app/deploy/access.py, for run id "
        f"{json.dumps(run_id)}: do not edit.\n"
        "# Regenerate: gyre deploy nats-permissions --config deploy/k8s/base/gyre.yaml "
        "--out deploy/nats/permissions.conf\n"
        "# (`gyre tls init --config C` writes the same for C's run id into its `nats` directory.)\n"
        "# A client's certificate maps to the user named by its subject (nats.conf: verify_and_map);\n"
        "# one that maps to none of them is refused.\n"
        "authorization {\n  users = [\n" + body + "\n  ]\n}\n"
    )


def redis_acl(run_id: str, passwords: dict[str, str]) -> str:
    """redis-server ACL file text: `default` off, one user per deploy identity of `passwords`."""
    lines = ["user default off"]
    lines += [redis_acl_line(u, passwords[u], run_id, DEPLOY_REDIS_RULES[u]) for u in DEPLOY_REDIS_RULES]
    return "\n".join(lines) + "\n"


def _write_private(path: Path, text: str, group: int | None) -> None:
    """`path` with mode 0600 from the start (0640 and `group` when given: the containers' group)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    if group is not None:
        os.chown(path, -1, group)
        path.chmod(0o640)


def write_access(out: Path, run_id: str, group: int | None = None, cells: int = 0) -> dict[str, Path]:
    """Fresh Redis passwords of every deploy identity and the servers' files, under `out` as `gyre tls init`
    lays it out: `<identity>/redis.json`, `redis/users.acl`, `nats/permissions.conf`. Returns the files.
    The cell agents' login goes into each of `cells` cells' own directories too (`cell_agent-<k>/`: what a
    cell's container mounts); NATS and Redis know the cells by their role, `cell_agent`."""
    passwords = {user: secrets.token_urlsafe(24) for user in DEPLOY_REDIS_RULES}
    written: dict[str, Path] = {}
    for user, password in passwords.items():
        directories = [user] + ([cell_directory(c) for c in range(cells)] if user == CELL_AGENT else [])
        for directory in directories:
            path = out / directory / REDIS_LOGIN_FILE
            _write_private(path, json.dumps({"user": user, "password": password}), group)
            written[f"{directory}/{REDIS_LOGIN_FILE}"] = path
    acl = out / "redis" / REDIS_ACL_FILE
    _write_private(acl, redis_acl(run_id, passwords), group)
    conf = out / "nats" / PERMISSIONS_FILE
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(nats_permissions(run_id))
    written[f"redis/{REDIS_ACL_FILE}"], written[f"nats/{PERMISSIONS_FILE}"] = acl, conf
    return written
