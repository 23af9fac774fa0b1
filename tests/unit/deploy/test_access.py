"""What each identity may do on NATS and Redis in the deploy shape (app/deploy/access.py): generated from the
embedded default's tables, the committed deploy/nats/permissions.conf equal to what they generate, and the
certificates (`gyre tls init`'s and cert-manager's) naming the users those files grant."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from app.deploy.access import (
    DEPLOY_NATS_USERS,
    DEPLOY_REDIS_RULES,
    nats_permissions,
    nats_user,
    write_access,
)
from app.stack.credentials import REDIS_RULES
from gyre.bus.permissions import BUS_USERS, permissions
from gyre.config import GyreConfig
from gyre.config.infra import read_login
from tests.unit.deploy.support import COMPOSE_CONFIG, DEPLOY, K8S

PERMISSIONS = DEPLOY / "nats" / "permissions.conf"


def _users(text: str) -> dict[str, dict[str, object]]:
    """The users of a generated permissions.conf (one JSON object a line inside `users = [ … ]`)."""
    rows = [json.loads(line.strip().rstrip(",")) for line in text.splitlines() if line.startswith("    {")]
    return {row["user"]: row["permissions"] for row in rows}


def test_the_committed_nats_permissions_are_what_the_table_generates(k8s_config: GyreConfig) -> None:
    """deploy/nats/permissions.conf (the Kubernetes ConfigMap's) is gyre/bus/permissions.py's table for the
    base config's run id: change the table, and this fails until the file is regenerated with the command
    its header names."""
    expected = nats_permissions(k8s_config.run.id)
    assert PERMISSIONS.read_text() == expected, (
        "deploy/nats/permissions.conf is stale: gyre deploy nats-permissions --config "
        "deploy/k8s/base/gyre.yaml --out deploy/nats/permissions.conf"
    )


def test_every_identity_gets_the_embedded_defaults_subjects_and_nothing_else() -> None:
    users = _users(nats_permissions("r1"))
    assert set(users) == {f"CN={u}" for u in BUS_USERS if u != "supervisor"}
    for user in DEPLOY_NATS_USERS:
        assert users[nats_user(user)] == permissions("r1", user), user
    runner = users["CN=runner"]
    assert "gyre.r1.group.dispatched" not in runner["publish"]["allow"]  # type: ignore[index]
    assert runner["subscribe"]["allow"] == ["_INBOX_runner.>"]  # type: ignore[index]
    cli = users["CN=cli"]  # read-only: no event of its own, no stream or durable of its own
    assert not [s for s in cli["publish"]["allow"] if s.startswith("gyre.") or ".STREAM.CREATE." in s]  # type: ignore[index]


def test_the_certificates_subjects_are_the_nats_users(tmp_path: Path) -> None:
    """nats-server's verify_and_map spells a subject in RFC 2253 (`CN=runner`): `gyre tls init`'s
    certificates and cert-manager's (commonName alone) map to the users of permissions.conf."""
    from cryptography import x509

    from gyre.tls import CELL_AGENT, cell_directory, cell_uri, common_name, issue

    issued = [cell_directory(c) if i == CELL_AGENT else i for i in DEPLOY_NATS_USERS for c in range(2)]
    issue(tmp_path, {identity: [] for identity in issued})  # cells' own: cell_agent-0, cell_agent-1
    for identity in issued:
        cert = x509.load_pem_x509_certificate((tmp_path / identity / "tls.crt").read_bytes())
        assert cert.subject.rfc4514_string() == nats_user(common_name(identity)), identity
    certificates = {
        doc["spec"]["secretName"]: doc["spec"]
        for doc in yaml.safe_load_all((K8S / "components" / "cert-manager" / "certificates.yaml").read_text())
        if doc and doc["kind"] == "Certificate" and doc["spec"]["secretName"].startswith("gyre-tls-")
    }
    for identity in DEPLOY_NATS_USERS:
        if identity == "cli":
            continue  # a tool outside the cluster: `gyre tls init`'s
        secrets = [f"gyre-tls-{identity.replace('_', '-')}"]
        if identity == CELL_AGENT:  # one per cell, its cell in a URI
            secrets = [f"gyre-tls-cell-agent-{c}" for c in range(3)]
            assert [certificates[s]["uris"] for s in secrets] == [[cell_uri(c)] for c in range(3)]
        for secret in secrets:
            spec = certificates[secret]
            assert spec["commonName"] == identity and "subject" not in spec, identity


def test_write_access_gives_every_identity_a_redis_user_of_the_embedded_rules(tmp_path: Path) -> None:
    written = write_access(tmp_path, "r1")
    acl = (tmp_path / "redis" / "users.acl").read_text()
    lines = acl.splitlines()
    assert lines[0] == "user default off" and len(lines) == 1 + len(DEPLOY_REDIS_RULES)
    for user, rules in DEPLOY_REDIS_RULES.items():
        path = tmp_path / user / "redis.json"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        login = read_login(str(tmp_path / "{service}" / "redis.json"), user)
        assert login is not None and login.user == user and login.password not in acl
        (line,) = [x for x in lines if x.startswith(f"user {user} ")]
        digest = hashlib.sha256(login.password.encode()).hexdigest()
        assert line == f"user {user} on #{digest} resetkeys ~gyre:r1:* resetchannels {rules}"
    for user in ("scheduler", "proxy", "runner", "evaluator", "packer", "cell_agent", "cli"):
        assert DEPLOY_REDIS_RULES[user] == REDIS_RULES[user]
    assert "supervisor" not in DEPLOY_REDIS_RULES and "@dangerous" not in DEPLOY_REDIS_RULES["redis"]
    assert (tmp_path / "nats" / "permissions.conf").read_text() == nats_permissions("r1")
    assert set(written) >= {"redis/users.acl", "nats/permissions.conf", "runner/redis.json"}


def test_tls_init_writes_the_access_files_for_the_configs_run_id(tmp_path: Path) -> None:
    from app.cli import app

    out = tmp_path / "tls"
    args = ["tls", "init", "--config", str(COMPOSE_CONFIG), "--out", str(out), "--group", str(os.getgid())]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    run_id = yaml.safe_load(COMPOSE_CONFIG.read_text())["run"]["id"]
    assert (out / "nats" / "permissions.conf").read_text() == nats_permissions(run_id)
    assert f"~gyre:{run_id}:*" in (out / "redis" / "users.acl").read_text()
    for path in (out / "runner" / "redis.json", out / "redis" / "users.acl"):
        st = path.stat()
        assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == os.getgid(), path
    assert read_login(str(out / "{service}" / "redis.json"), "runner") is not None  # 0640 is accepted


@pytest.mark.parametrize("config", ["compose", "k8s"])
def test_the_deploy_configs_read_each_services_redis_login_beside_its_certificate(
    config: str, compose_config: GyreConfig, k8s_config: GyreConfig
) -> None:
    loaded = compose_config if config == "compose" else k8s_config
    assert loaded.tls.enabled
    assert loaded.redis.credentials_file == f"{loaded.tls.dir}/{{service}}/redis.json"
