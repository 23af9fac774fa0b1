"""Generated run credentials: private files, one user per client, Redis keys scoped to the run."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest

from app.stack.credentials import generate
from gyre.bus.permissions import BUS_USERS
from gyre.config.infra import read_login


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_file_is_private_and_every_client_has_its_own_password(tmp_path: Path) -> None:
    creds = generate(tmp_path, "r1")
    assert _mode(creds.directory) == 0o700
    files = [p for p in creds.directory.rglob("*") if p.is_file()]
    assert files and all(_mode(p) == 0o600 for p in files)
    passwords = set()
    for user in BUS_USERS:
        for template in (creds.nats_template, creds.redis_template):
            login = read_login(template, user)
            assert login is not None and login.user == user
            passwords.add(login.password)
    assert len(passwords) == 2 * len(BUS_USERS)


def test_the_acl_file_disables_the_default_user_and_keeps_only_hashes(tmp_path: Path) -> None:
    creds = generate(tmp_path, "r1")
    lines = creds.redis_acl.read_text().splitlines()
    assert lines[0] == "user default off"
    scheduler = read_login(creds.redis_template, "scheduler")
    assert scheduler is not None and scheduler.password not in creds.redis_acl.read_text()
    (line,) = [x for x in lines if x.startswith("user scheduler ")]
    assert f"#{hashlib.sha256(scheduler.password.encode()).hexdigest()}" in line
    assert "~gyre:r1:*" in line and "+@scripting" in line and "-@dangerous" in line
    users = {u["user"]: u for u in json.loads(creds.nats_users.read_text())}
    assert set(users) == set(BUS_USERS) and users["runner"]["permissions"]["publish"]["allow"]


def test_a_regenerated_run_gets_new_passwords(tmp_path: Path) -> None:
    first = read_login(generate(tmp_path, "r1").nats_template, "proxy")
    second = read_login(generate(tmp_path, "r1").nats_template, "proxy")
    assert first is not None and second is not None and first.password != second.password


def test_a_credentials_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "proxy.json"
    f.write_text(json.dumps({"user": "proxy", "password": "x"}))
    f.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        read_login(str(tmp_path / "{service}.json"), "proxy")
    f.chmod(0o600)
    assert read_login(str(tmp_path / "{service}.json"), "proxy") is not None
    with pytest.raises(ValueError, match="not found"):
        read_login(str(tmp_path / "{service}.json"), "packer")
    assert read_login(None, "proxy") is None


def test_a_credentials_file_its_group_may_read_is_accepted(tmp_path: Path) -> None:
    """0640 (`gyre tls init --group`: the containers' group) and 0440 (a Kubernetes secret volume with
    fsGroup) are accepted, as the TLS keys are; group-writable is not."""
    f = tmp_path / "proxy.json"
    f.write_text(json.dumps({"user": "proxy", "password": "x"}))
    for mode in (0o640, 0o440):
        f.chmod(mode)
        assert read_login(str(tmp_path / "{service}.json"), "proxy") is not None
    f.chmod(0o660)
    with pytest.raises(ValueError, match="chmod 600"):
        read_login(str(tmp_path / "{service}.json"), "proxy")
