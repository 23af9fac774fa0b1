"""The config tree: defaults, YAML, GYRE_* overrides, one-line errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre.config import ConfigError, GyreConfig, load_config


def test_defaults_validate() -> None:
    config = load_config(None, environ={})
    assert isinstance(config, GyreConfig)
    assert config.run.host == "127.0.0.1"


def test_yaml_then_env_then_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("scheduler:\n  phi: 1.0\n  mu: 3\n")
    config = load_config(f, environ={"GYRE_SCHEDULER__PHI": "1.5"}, overrides={"scheduler": {"mu": 4}})
    assert (config.scheduler.phi, config.scheduler.mu) == (1.5, 4)


@pytest.mark.parametrize(
    ("yaml_text", "field", "hint"),
    [
        ("scheduler:\n  rho_min: 1.5\n", "scheduler.rho_min", "(0, 1]"),
        ("run:\n  id: 'a.b'\n", "run.id", "NATS subject token"),
        ("model:\n  num_heads: 3\n", "model.num_heads", "Extra inputs"),  # shapes come from config.json
        ("scheduler:\n  no_such_field: 1\n", "scheduler.no_such_field", "Extra inputs"),
        ("packer:\n  j_max: 0\n", "packer.j_max", "at least 1"),
        ("nats:\n  monitor_port: 70000\n", "nats.monitor_port", "in 0..65535"),
        ("proxy:\n  engine_timeout_s: -1\n", "proxy.engine_timeout_s", "must be >= 0; got -1.0"),
        ("cell_agent:\n  trainer:\n    lr: 0\n", "cell_agent.trainer.lr", "must be > 0; got 0.0"),
        ("evaluator:\n  sandbox:\n    cpu_s: 0\n", "evaluator.sandbox.cpu_s", "at least 1, or null; got 0"),
        ("proxy:\n  template: loose\n", "proxy.template", "'auto', 'strict' or 'shipped'"),
        ("proxy:\n  template_strict: false\n", "proxy.template_strict", "write `template: shipped` instead"),
        ("cell_agent:\n  ports: [1, 70000]\n", "cell_agent.ports.1", "in 0..65535"),
        (
            "cell_agent:\n  trainer:\n    publication: disk\n",
            "cell_agent",
            "set published_weights: shared",
        ),
        (
            "cell_agent:\n  trainer:\n    backend: megatron\n    routing_replay: true\n",
            "cell_agent.trainer",
            "does not replay MoE routing; use backend: torch",
        ),
    ],
)
def test_bad_values_name_the_field(tmp_path: Path, yaml_text: str, field: str, hint: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_config(f, environ={})
    message = str(info.value)
    assert field in message and hint in message
    assert "\n" not in message


def test_routing_replay_records_routing_in_the_proxy() -> None:
    config = load_config(None, environ={}, overrides={"cell_agent": {"trainer": {"routing_replay": True}}})
    assert config.proxy.record_routed_experts and config.cell_agent.engine.return_routed_experts
    assert not load_config(None, environ={}).proxy.record_routed_experts
    on_sglang_cpu = {
        "trainer": {"routing_replay": True},
        "engine": {"backend": "sglang", "sglang_device": "cpu"},
    }
    with pytest.raises(ConfigError) as info:
        load_config(None, environ={}, overrides={"cell_agent": on_sglang_cpu})
    assert "cell_agent.trainer.routing_replay: SGLang's CPU path cannot return routed experts" in str(
        info.value
    )


def test_not_yaml_and_not_a_mapping(tmp_path: Path) -> None:
    f = tmp_path / "x.yaml"
    f.write_text("scheduler: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(f, environ={})
    f.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(f, environ={})


def test_every_field_is_documented() -> None:
    def walk(model: type) -> list[str]:
        missing = []
        for name, info in model.model_fields.items():  # type: ignore[attr-defined]
            if not info.description:
                missing.append(f"{model.__name__}.{name}")
            ann = info.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                missing += walk(ann)
        return missing

    assert walk(GyreConfig) == []


def test_a_relative_sglang_python_is_the_checkouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make setup` puts SGLang's interpreter in the checkout: `.venv-sglang/bin/python` names it from any
    working directory; a bare name is still looked up on PATH, and an absolute path stays as it is."""
    from gyre.paths import REPO_ROOT

    def resolved(python: str) -> str:
        engine = {"cell_agent": {"engine": {"sglang_python": python}}}
        return load_config(overrides=engine).cell_agent.engine.sglang_python

    monkeypatch.chdir(tmp_path)
    assert resolved(".venv-sglang/bin/python") == str(REPO_ROOT / ".venv-sglang" / "bin" / "python")
    assert resolved("python3") == "python3"
    assert resolved("/opt/sglang/bin/python") == "/opt/sglang/bin/python"
