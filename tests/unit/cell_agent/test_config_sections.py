"""The trainer and cell agent config sections: bad values name the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("yaml_text", "field", "hint"),
    [
        ("cell_agent:\n  trainer:\n    adam_beta2: 1.0\n", "cell_agent.trainer.adam_beta2", "[0, 1)"),
        ("cell_agent:\n  trainer:\n    dist_port: 70000\n", "cell_agent.trainer.dist_port", "in 0..65535"),
        (
            "cell_agent:\n  trainer:\n    chunk_tokens: 0\n",
            "cell_agent.trainer.chunk_tokens",
            "at least 1, or null",
        ),
        (
            "cell_agent:\n  trainer:\n    weight_transport: nccl\n",
            "cell_agent.trainer.weight_transport",
            "mooncake",
        ),
        ("cell_agent:\n  trainer:\n    grad_clip: -1\n", "cell_agent.trainer.grad_clip", "must be >= 0"),
        ("cell_agent:\n  trainer:\n    num_threads: 0\n", "cell_agent.trainer.num_threads", "at least 1"),
        ("cell_agent:\n  publish_timeout_s: 0\n", "cell_agent.publish_timeout_s", "> 0"),
    ],
)
def test_bad_values_name_the_fix(tmp_path: Path, yaml_text: str, field: str, hint: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_config(f, environ={})
    assert field in str(info.value) and hint in str(info.value)


def test_defaults() -> None:
    config = load_config(None, environ={})
    trainer = config.cell_agent.trainer
    assert (trainer.backend, trainer.weight_transport, trainer.dist_backend) == ("torch", "torch", "gloo")
    assert trainer.heartbeat_interval_s < config.redis.heartbeat_timeout_s
