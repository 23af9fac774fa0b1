"""`tls` in the config and `gyre tls init`: TLS needs servers of its own (the embedded stack refuses it) and a
rediss:// Redis; the command writes a CA and each identity's certificate for the names its peers dial (the
compose config's), keys private or readable by the given group only; a missing file is one line naming
the command that writes it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from gyre import tls
from gyre.config import ConfigError, load_config
from gyre.paths import REPO_ROOT
from gyre.tls import tls_files

COMPOSE_CONFIG = REPO_ROOT / "deploy" / "compose" / "gyre.yaml"


def _with_tls(directory: Path) -> dict[str, dict[str, object]]:
    """The compose config with TLS on, its certificates under `directory`."""
    return {"tls": {"enabled": True, "dir": str(directory)}, "redis": {"url": "rediss://redis:6379/0"}}


def test_the_embedded_stack_refuses_tls() -> None:
    with pytest.raises(ConfigError, match=r"tls\.enabled needs nats\.url and redis\.url"):
        load_config(None, environ={}, overrides={"tls": {"enabled": True}})


def test_tls_needs_a_rediss_url() -> None:
    overrides = {
        "tls": {"enabled": True},
        "nats": {"url": "nats://n:4222"},
        "redis": {"url": "redis://r:6379/0"},
    }
    with pytest.raises(ConfigError, match=r"redis\.url must be rediss://"):
        load_config(None, environ={}, overrides=overrides)


def test_plaintext_stays_the_default() -> None:
    config = load_config(None, environ={})
    assert not config.tls.enabled and tls_files(config.tls, "scheduler") is None


def test_a_missing_certificate_names_the_command_that_writes_it(tmp_path: Path) -> None:
    config = load_config(COMPOSE_CONFIG, environ={}, overrides=_with_tls(tmp_path))
    with pytest.raises(ValueError, match=r"scheduler/tls.crt not found \(`gyre tls init --out"):
        tls_files(config.tls, "scheduler")


def test_tls_init_writes_every_identity_for_the_names_its_peers_dial(tmp_path: Path) -> None:
    out = tmp_path / "tls"
    done = subprocess.run(
        [
            *(sys.executable, "-c", "from app.cli import main; main()", "tls", "init"),
            *("--config", str(COMPOSE_CONFIG), "--out", str(out), "--group", str(os.getgid())),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    written = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(written) == {
        "scheduler",
        "proxy",
        "runner",
        "evaluator",
        "packer",
        "cell_agent-0",
        "cell_agent-1",
        "cell_agent-2",
        "nats",
        "redis",
        "cli",
    }

    def names(identity: str) -> set[str]:
        cert = x509.load_pem_x509_certificate((out / identity / "tls.crt").read_bytes())
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return set(alt.get_values_for_type(x509.DNSName)) | {
            str(a) for a in alt.get_values_for_type(x509.IPAddress)
        }

    for cell in range(3):  # each cell its own certificate: its own host only, and its cell's URI
        assert names(f"cell_agent-{cell}") == {f"cell-agent-{cell}", "localhost", "127.0.0.1", "::1"}
        files = tls.TlsFiles.under(out, f"cell_agent-{cell}")
        assert files.cell == cell and _common_name(files) == "cell_agent"
        assert (out / f"cell_agent-{cell}" / "redis.json").read_bytes() == (
            out / "cell_agent" / "redis.json"
        ).read_bytes()
    assert "redis" in names("redis") and "nats" in names("nats") and "scheduler" in names("scheduler")
    key = out / "scheduler" / "tls.key"
    assert key.stat().st_mode & 0o777 == 0o640 and key.stat().st_gid == os.getgid()
    assert (out / "ca" / "ca.key").stat().st_mode & 0o777 == 0o600
    ca = (out / "ca" / "ca.crt").read_bytes()
    assert all((out / identity / "ca.crt").read_bytes() == ca for identity in written)
    config = load_config(COMPOSE_CONFIG, environ={}, overrides=_with_tls(out))
    files = tls_files(config.tls, "cell_agent", cell=1)
    assert files is not None and files.cell == 1 and files.client_context() is not None
    mounted = tmp_path / "mounted"  # a container's view: its own cell's directory mounted as cell_agent/
    shutil.copytree(out / "cell_agent-1", mounted / "cell_agent")
    tls_config = load_config(COMPOSE_CONFIG, environ={}, overrides=_with_tls(mounted)).tls
    files = tls_files(tls_config, "cell_agent", cell=1)
    assert files is not None and files.cert == mounted / "cell_agent" / "tls.crt"
    with pytest.raises(ValueError, match=r"names cell 1, not cell 2: each cell agent needs its own"):
        tls_files(tls_config, "cell_agent", cell=2)  # cell 1's key mounted into cell 2's container


def test_tls_init_for_a_group_it_cannot_give_the_keys_to_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--group` chowns the keys, which only root or a member of the group may do: a one-line error, exit 2."""
    from typer.testing import CliRunner

    from app.cli import app

    def refuse(path: object, uid: int, gid: int) -> None:
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(os, "chown", refuse)
    args = [
        "tls",
        "init",
        "--config",
        str(COMPOSE_CONFIG),
        "--out",
        str(tmp_path / "tls"),
        "--group",
        "10001",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: --group 10001: only root or a member of group 10001"), line


def _common_name(files: tls.TlsFiles) -> str:
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    (name,) = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(name.value)
