"""Harness command registry contract, and the runner's config sections."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from gyre import tls
from gyre.config import ConfigError, load_config
from gyre.config.runner import RunnerSection
from gyre.sandbox import SandboxLimits
from gyre.tasks import Task
from services.runner.harnesses import (
    CA_INSIDE,
    HARNESSES,
    TRUST_ENV,
    CommandHarness,
    Launch,
    check_harness,
    make_harness,
)

LAUNCH = Launch(
    Task("add/3+5", "3+5=? Write the answer to answer.txt."),
    "3+5=? Write the answer to answer.txt.",
    "e1",
    "http://127.0.0.1:8123",
    "key-e1",
    Path("/sandbox/home"),
)


def build(name: str) -> object:
    return CommandHarness(["bash", "-c", "{prompt}"]) if name == "command" else HARNESSES[name]()


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_every_harness_builds_a_command_and_a_closed_environment(name: str) -> None:
    harness = build(name)
    argv = harness.command(LAUNCH)  # type: ignore[attr-defined]
    env = harness.env(LAUNCH)  # type: ignore[attr-defined]
    assert argv and all(isinstance(a, str) for a in argv)
    assert "PATH" in env and "HOME" not in env  # HOME and TMPDIR are the sandbox's
    assert LAUNCH.api_key in env.values()
    assert isinstance(harness.limits(SandboxLimits()), SandboxLimits)  # type: ignore[attr-defined]
    for rel in harness.home_files(LAUNCH):  # type: ignore[attr-defined]
        assert not rel.startswith("/") and ".." not in rel


def test_demo_harness_reaches_the_model_only_through_the_proxy() -> None:
    harness = HARNESSES["demo"]()
    argv, env = harness.command(LAUNCH), harness.env(LAUNCH)
    assert (
        argv[:3] == [sys.executable, "-m", "harness"]
        and argv[argv.index("--prompt") + 1] == LAUNCH.task.prompt
    )
    assert (env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_API_KEY"]) == (LAUNCH.base_url, LAUNCH.api_key)


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_a_host_sandbox_trusts_the_proxy_through_a_copy_of_the_ca_in_its_home(
    name: str, tmp_path: Path
) -> None:
    """With TLS, the trust variables point at a copy of the CA in HOME, not at the service's TLS directory
    (beside its key, readable by its group only, which a sandbox's uid is not in); a container gets its
    mount instead."""
    tls.issue(tmp_path / "tls", {"runner": []})
    tls.configure(tls.TlsFiles.under(tmp_path / "tls", "runner"))
    try:
        harness = build(name)
        secure = dataclasses.replace(LAUNCH, base_url="https://127.0.0.1:8123")
        env = harness.environment(secure)  # type: ignore[attr-defined]
        files = harness.sandbox_home_files(secure)  # type: ignore[attr-defined]
        assert {env[k] for k in TRUST_ENV} == {"/sandbox/home/.gyre/ca.crt"}, env
        assert files[".gyre/ca.crt"] == (tmp_path / "tls" / "runner" / "ca.crt").read_text()
        assert str(tmp_path) not in " ".join(map(str, harness.reveal()))  # type: ignore[attr-defined]
        inside = dataclasses.replace(secure, inside=True)
        assert {harness.environment(inside)[k] for k in TRUST_ENV} == {CA_INSIDE}  # type: ignore[attr-defined]
        assert ".gyre/ca.crt" not in harness.sandbox_home_files(inside)  # type: ignore[attr-defined]
    finally:
        tls.configure(None)


def test_codex_gets_a_provider_pointing_at_the_proxy() -> None:
    harness = HARNESSES["codex"]()
    config = harness.home_files(LAUNCH)[".codex/config.toml"]
    assert 'base_url = "http://127.0.0.1:8123/v1"' in config and 'wire_api = "responses"' in config
    assert harness.env(LAUNCH)["CODEX_HOME"] == "/sandbox/home/.codex"
    assert harness.limits(SandboxLimits()).memory_mb is None


def test_command_harness_expands_placeholders_and_appends_extra_args() -> None:
    harness = CommandHarness(["run", "{task_id}", "{execution_id}", "--", "{prompt}"], ["--x"])
    assert harness.command(LAUNCH) == ["run", "add/3+5", "e1", "--", LAUNCH.task.prompt, "--x"]


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_every_harness_is_registered_under_its_own_name(name: str) -> None:
    assert HARNESSES[name].name == name
    assert check_harness(RunnerSection(harness=name, command=["true"])) is HARNESSES[name]


def test_the_registry_the_config_docs_and_the_refusal_agree() -> None:
    """HARNESSES is the one list: the field's documentation names each entry, and a name it lacks is refused
    (before anything starts, not when the config is read) with exactly its names."""
    doc = RunnerSection.model_fields["harness"].description or ""
    assert all(f"`{name}`" in doc for name in HARNESSES), doc
    section = load_config(None, environ={}, overrides={"runner": {"harness": "aider"}}).runner
    with pytest.raises(ConfigError) as refused:
        check_harness(section)
    assert str(refused.value) == (
        f"runner.harness: 'aider' is not a registered harness; available: {', '.join(HARNESSES)}"
    )
    with pytest.raises(ConfigError, match="'aider' is not a registered harness"):
        make_harness(section)


def test_runner_config_validates_and_names_the_fix() -> None:
    config = load_config(None, environ={}, overrides={"runner": {"harness": "command", "command": ["true"]}})
    assert isinstance(make_harness(config.runner), CommandHarness)
    with pytest.raises(ConfigError, match=r"needs runner\.command"):
        load_config(None, environ={}, overrides={"runner": {"harness": "command"}})
    with pytest.raises(ConfigError, match="uid_base must be in"):
        load_config(None, environ={}, overrides={"runner": {"sandbox": {"uid_base": 5}}})
    with pytest.raises(ConfigError, match="at least 1, or null"):
        load_config(None, environ={}, overrides={"evaluator": {"sandbox": {"max_processes": 0}}})
    defaults = load_config(None, environ={})
    assert (defaults.runner.sandbox.uid_base, defaults.evaluator.sandbox.uid_base) == (120000, 130000)


def test_harness_env_adds_the_users_settings_but_never_the_routing() -> None:
    config = load_config(
        None,
        environ={},
        overrides={
            "runner": {
                "harness": "claude_code",
                "harness_args": ["--tools", "Bash"],
                "harness_env": {"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "0.6", "DISABLE_TELEMETRY": "0"},
            }
        },
    )
    harness = make_harness(config.runner)
    env = harness.environment(LAUNCH)
    assert env["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] == "0.6"
    assert env["DISABLE_TELEMETRY"] == "1", "the harness's own offline settings win"
    assert harness.command(LAUNCH)[-2:] == ["--tools", "Bash"]
    for key in ("ANTHROPIC_BASE_URL", "OPENAI_API_KEY", "CODEX_HOME"):
        with pytest.raises(ConfigError, match=f"harness_env cannot set {key}"):
            load_config(None, environ={}, overrides={"runner": {"harness_env": {key: "x"}}})
