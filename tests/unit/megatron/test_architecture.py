"""Models and layouts megatron-core cannot build are refused with the field named, before any process
group exists (pure Python: no megatron import), and at `gyre up` / service start through
`check_trainer`; and the RoPE the backend applies is transformers' own for every rope kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from gyre.config.training import TrainerSection
from gyre.model.arch import ModelArch, ModelError, arch_from_config
from gyre.model.files import check_model_dir
from gyre.model.rope import inv_freq_and_scaling
from gyre.trainer.backends import check_trainer
from gyre.trainer.backends.megatron import LayoutError, check_megatron_layout
from tests.unit.megatron.helpers import family_dir, hf_reference


def _arch(family: str = "qwen3", **overrides: Any) -> ModelArch:
    return arch_from_config({**check_model_dir(family_dir(family)).arch.raw, **overrides})


@pytest.mark.parametrize(
    ("overrides", "tp", "field"),
    [
        ({"num_attention_heads": 6, "num_key_value_heads": 6}, 4, "num_attention_heads: 6 is not divisible"),
        ({}, 4, "num_key_value_heads: 2 is not divisible"),
        ({"vocab_size": 511}, 2, "vocab_size: 511 is not divisible"),
        ({"intermediate_size": 130, "num_key_value_heads": 4}, 4, "intermediate_size: 130 is not divisible"),
    ],
)
def test_layouts_megatron_cannot_split_name_the_field(overrides: dict[str, Any], tp: int, field: str) -> None:
    with pytest.raises(
        LayoutError, match=rf"{field} by cell_agent\.trainer\.megatron\.tensor_parallel_size {tp}"
    ):
        check_megatron_layout(_arch(**overrides), tensor_parallel_size=tp)
    check_megatron_layout(_arch(), tensor_parallel_size=2)
    assert not dist.is_initialized()


@pytest.mark.parametrize("field", ["attention_bias", "mlp_bias"])
def test_llama_biases_megatron_cannot_express_are_refused(field: str) -> None:
    with pytest.raises(LayoutError, match=f"{field}: true is not supported by the megatron backend"):
        check_megatron_layout(_arch("llama", **{field: True}), tensor_parallel_size=1)


def _write_config(tmp_path: Path, **overrides: Any) -> Path:
    source = family_dir("qwen3")
    for item in source.iterdir():
        (tmp_path / item.name).write_bytes(item.read_bytes())
    import json

    config = json.loads((source / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **overrides}))
    return tmp_path


def test_check_trainer_refuses_before_anything_starts(tmp_path: Path) -> None:
    """What `gyre up` and the cell agent's start run: a ModelError (exit 2) naming both fields."""
    megatron = TrainerSection(backend="megatron", megatron={"tensor_parallel_size": 4})
    with pytest.raises(
        ModelError, match=r"config\.json: num_key_value_heads: 2 is not divisible by cell_agent"
    ):
        check_trainer(megatron, family_dir("qwen3"))
    with pytest.raises(ModelError, match=r"tensor_parallel_size: 2: a cell agent runs one trainer process"):
        check_trainer(
            TrainerSection(backend="megatron", megatron={"tensor_parallel_size": 2}), family_dir("qwen3")
        )
    with pytest.raises(ModelError, match=r"rope_parameters\.rope_type: 'dynamic' is not supported"):
        check_trainer(
            TrainerSection(backend="megatron"),
            _write_config(
                tmp_path, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
            ),
        )
    check_trainer(TrainerSection(backend="megatron"), family_dir("qwen3"))
    check_trainer(TrainerSection(), family_dir("qwen3"))
    assert not dist.is_initialized()


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen3_yarn"])
def test_rope_is_transformers_own(family: str) -> None:
    """The backend's RoPE is `gyre.model.rope` (the torch backend's): inverse frequencies and attention
    factor equal transformers' for the family's rope kind."""
    model = hf_reference(family_dir(family))
    arch = check_model_dir(family_dir(family)).arch
    kind = arch.rope.kind
    want, factor = (
        ROPE_INIT_FUNCTIONS[kind](model.config, torch.device("cpu"))
        if kind != "default"
        else (model.model.rotary_emb.inv_freq, 1.0)
    )
    mine, scaling = inv_freq_and_scaling(arch.rope, arch.head_dim)
    torch.testing.assert_close(mine, want.float(), rtol=1e-6, atol=0.0)
    assert scaling == pytest.approx(factor, rel=1e-12)
