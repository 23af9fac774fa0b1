"""Qwen3-MoE against transformers' own `Qwen3MoeForCausalLM`: the checkpoint's names, the router's top-k
and its normalization, dense and sparse layers mixed, gradients, and the config fields Gyre refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from safetensors import safe_open

from gyre.model.arch import ModelError, read_arch
from gyre.model.causal_lm import SparseMoeBlock
from gyre.model.init import init_model_dir
from gyre.model.weights import load_model

MIXED: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_experts": 6,
    "num_experts_per_tok": 3,
    "decoder_sparse_step": 2,
    "mlp_only_layers": [3],
}
"""Layers 0 and 2 dense by decoder_sparse_step, 3 dense by mlp_only_layers, 1 sparse."""


def _model_dir(tmp_path: Path, **overrides: Any) -> Path:
    return init_model_dir(
        tmp_path / "moe", arch="qwen3_moe", tokenizer="byte", family="qwen3", seed=5, overrides=overrides
    )


def _hf(path: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_logits_and_routing_equal_transformers(tmp_path: Path, norm_topk_prob: bool) -> None:
    path = _model_dir(tmp_path, **MIXED, norm_topk_prob=norm_topk_prob)
    ours, theirs = load_model(path), _hf(path)
    assert [isinstance(layer.mlp, SparseMoeBlock) for layer in ours.model.layers] == [
        False,
        True,
        False,
        False,
    ]
    ids = torch.randint(0, ours.arch.vocab_size, (200,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = ours(ids, torch.arange(200), [0, 200]).log_softmax(-1)
        b = theirs(ids[None]).logits[0].log_softmax(-1)
        h = torch.randn(50, 64, generator=torch.Generator().manual_seed(4))
        weights, experts = ours.model.layers[1].mlp.route(h)
        _, ref_weights, ref_experts = theirs.model.layers[1].mlp.gate(h)
    assert (a - b).abs().max().item() <= 1e-5
    assert torch.equal(experts, ref_experts)
    assert (weights - ref_weights).abs().max().item() <= 1e-7
    assert torch.allclose(weights.sum(-1), torch.ones(50)) == norm_topk_prob


def test_parameter_names_are_the_checkpoints_transformers_writes(tmp_path: Path) -> None:
    path = _model_dir(tmp_path, **MIXED)
    _hf(path).save_pretrained(tmp_path / "saved")
    with safe_open(str(tmp_path / "saved" / "model.safetensors"), framework="pt") as f:
        written = set(f.keys())
    ours = load_model(path)
    assert {n for n, _ in ours.named_parameters()} == written == set(ours.arch.parameter_shapes())
    assert "model.layers.1.mlp.experts.5.down_proj.weight" in written


def test_a_directory_transformers_wrote_loads_and_agrees(tmp_path: Path) -> None:
    config = transformers.Qwen3MoeConfig(
        vocab_size=300, **{k: v for k, v in MIXED.items()}, norm_topk_prob=True, tie_word_embeddings=False
    )
    torch.manual_seed(0)
    hf = transformers.Qwen3MoeForCausalLM(config).eval()
    hf.save_pretrained(tmp_path / "hf")
    source = _model_dir(tmp_path, **MIXED)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "hf" / name).write_bytes((source / name).read_bytes())
    raw = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert "num_local_experts" in raw and "num_experts" not in raw  # transformers 5's spelling
    ours = load_model(tmp_path / "hf")
    ids = torch.randint(0, 300, (64,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = ours(ids, torch.arange(64), [0, 64]) - hf(ids[None]).logits[0]
    assert diff.abs().max().item() <= 1e-5


def test_gradients_equal_transformers(tmp_path: Path) -> None:
    path = _model_dir(tmp_path, **MIXED)
    ours, theirs = load_model(path).train(), _hf(path).train()
    ids = torch.randint(0, ours.arch.vocab_size, (40,), generator=torch.Generator().manual_seed(2))
    ours(ids, torch.arange(40), [0, 40]).log_softmax(-1)[:, 7].sum().backward()
    theirs(ids[None]).logits[0].log_softmax(-1)[:, 7].sum().backward()
    layer, ref = ours.model.layers[1].mlp, theirs.model.layers[1].mlp
    assert (layer.gate.weight.grad - ref.gate.weight.grad).abs().max().item() <= 1e-6
    inter = MIXED["moe_intermediate_size"]
    for e in range(MIXED["num_experts"]):
        expert = layer.experts[e]
        gate_up = ref.experts.gate_up_proj.grad[e]
        assert (expert.gate_proj.weight.grad - gate_up[:inter]).abs().max().item() <= 1e-6
        assert (expert.up_proj.weight.grad - gate_up[inter:]).abs().max().item() <= 1e-6
        assert (expert.down_proj.weight.grad - ref.experts.down_proj.grad[e]).abs().max().item() <= 1e-6


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("output_router_logits", True, "load-balancing loss"),
        ("shared_expert_intermediate_size", 64, "shared experts"),
        ("num_experts_per_tok", 9, "more than num_experts"),
        ("mlp_only_layers", [7], "layer indices"),
        ("norm_topk_prob", "yes", "true or false"),
    ],
)
def test_config_fields_gyre_does_not_implement_are_refused(
    tmp_path: Path, field: str, value: Any, message: str
) -> None:
    path = _model_dir(tmp_path, **MIXED)
    config = json.loads((path / "config.json").read_text())
    config[field] = value
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=message) as caught:
        read_arch(path)
    assert caught.value.field == field and str(path / "config.json") in str(caught.value)
    assert "\n" not in str(caught.value)
