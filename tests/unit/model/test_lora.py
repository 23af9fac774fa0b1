"""LoRA against `peft` + transformers: the adapter's logits, PEFT directories both ways, the targets a
setting selects, and per-row adapters in the paged (serving) forward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import peft
import pytest
import torch
import transformers

from gyre.model.lora import LoraAdapter, LoraBank, read_adapter_dir, write_adapter_dir
from gyre.model.lora_spec import AdapterError, LoraSpec, resolve_targets
from gyre.model.paged import PagedBatch, PagedKVCache
from gyre.model.weights import load_model
from tests.support.models import hf_dir


def _hf(path: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _adapter(arch: Any, seed: int, **spec: Any) -> LoraAdapter:
    """An adapter with B ≠ 0 (a trained one), so the delta is not trivially zero."""
    adapter = LoraAdapter(arch, LoraSpec(**{"rank": 4, "alpha": 8.0, **spec})).init_weights(seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for b in adapter.lora_B:
            b.copy_(torch.randn(b.shape, generator=gen) * 0.05)
    return adapter


def _peft(path: Path, adapter_dir: Path) -> Any:
    return peft.PeftModel.from_pretrained(_hf(path), str(adapter_dir)).eval()


@pytest.mark.parametrize(
    ("arch", "targets", "rslora"),
    [
        ("qwen3", ("q_proj", "v_proj"), False),
        ("llama", ("all-linear",), True),
        ("qwen3_moe", ("o_proj",), False),
    ],
)
def test_logits_with_an_adapter_equal_peft(
    tmp_path: Path, arch: str, targets: tuple[str, ...], rslora: bool
) -> None:
    path = hf_dir(arch)
    model = load_model(path)
    adapter = _adapter(model.arch, 1, target_modules=targets, use_rslora=rslora)
    out = write_adapter_dir(tmp_path / "adapter", adapter, base_model=path)
    theirs = _peft(path, out)
    ids = torch.randint(0, model.arch.vocab_size, (120,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours = model(ids, torch.arange(120), [0, 120], lora=adapter)
        ref = theirs(input_ids=ids[None]).logits[0]
        base = model(ids, torch.arange(120), [0, 120])
    assert (ours - ref).abs().max().item() <= 1e-5
    assert (ours - base).abs().max().item() > 1e-3, "the adapter changes the logits"


def test_an_adapter_peft_wrote_reads_back_exactly(tmp_path: Path) -> None:
    path = hf_dir("qwen3")
    hf = _hf(path)
    torch.manual_seed(0)
    wrapped = peft.get_peft_model(
        hf,
        peft.LoraConfig(r=6, lora_alpha=12, target_modules=["k_proj", "down_proj"], init_lora_weights=False),
    )
    wrapped.save_pretrained(tmp_path / "theirs")
    adapter = read_adapter_dir(tmp_path / "theirs", load_model(path).arch)
    assert adapter.spec.rank == 6 and adapter.scaling == 2.0
    assert {t.module for t in adapter.targets} == {"k_proj", "down_proj"}
    theirs = {n.replace(".default", ""): p for n, p in wrapped.named_parameters() if "lora_" in n}
    assert set(adapter.tensors()) == set(theirs)
    assert all(torch.equal(adapter.tensors()[n], theirs[n]) for n in theirs)


def test_init_gives_the_base_model_and_targets_are_resolved(tmp_path: Path) -> None:
    arch = load_model(hf_dir("qwen3")).arch
    adapter = LoraAdapter(arch, LoraSpec(rank=2, alpha=4, target_modules=("self_attn.q_proj", "up_proj")))
    adapter.init_weights(0)
    assert all(float(b.detach().abs().max()) == 0.0 for b in adapter.lora_B)
    assert all(float(a.detach().abs().max()) > 0.0 for a in adapter.lora_A)
    assert {(t.module, t.layer) for t in adapter.targets} == {
        (m, i) for m in ("q_proj", "up_proj") for i in range(arch.num_layers)
    }
    assert len(resolve_targets(arch, ["all-linear"])) == 7 * arch.num_layers


@pytest.mark.parametrize(
    ("arch", "targets", "message"),
    [
        ("qwen3", ["lm_head"], "'lm_head' matches no module of Qwen3ForCausalLM"),
        ("qwen3", ["qproj"], "'qproj' matches no module"),
        ("qwen3_moe", ["gate_proj"], "'gate_proj' matches no module of Qwen3MoeForCausalLM"),
        ("qwen3", [], "is empty"),
    ],
)
def test_targets_that_match_nothing_are_refused(arch: str, targets: list[str], message: str) -> None:
    with pytest.raises(AdapterError, match=message) as caught:
        resolve_targets(load_model(hf_dir(arch)).arch, targets, "cell_agent.trainer.lora.target_modules")
    assert "cell_agent.trainer.lora.target_modules" in str(caught.value) and "\n" not in str(caught.value)


def test_paged_rows_each_use_their_own_adapter() -> None:
    """Three rows in one batch — adapter a, none, adapter b (another rank) — each equal to its own
    packed forward; the row without an adapter equals the base model exactly."""
    model = load_model(hf_dir("qwen3"))
    a = _adapter(model.arch, 1, target_modules=("q_proj", "v_proj", "down_proj"))
    b = _adapter(model.arch, 2, rank=8, alpha=4.0, target_modules=("o_proj",))
    bank = LoraBank(model.arch)
    bank.load("a", a)
    bank.load("b", b)
    gen = torch.Generator().manual_seed(3)
    rows = [torch.randint(0, model.arch.vocab_size, (9,), generator=gen) for _ in range(3)]
    bs = 4
    cache = PagedKVCache.allocate(model.arch, 64 * bs, bs)
    tables = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    batch = PagedBatch.from_block_tables(tables, [0, 0, 0], [9, 9, 9], bs)
    with torch.no_grad():
        paged = model.forward_paged(torch.stack(rows), cache, batch, lora=bank.rows(["a", None, "b"]))
        for row, key, out in zip(rows, (a, None, b), paged, strict=True):
            ref = model(row, torch.arange(9), [0, 9], lora=key)
            assert (out - ref).abs().max().item() <= 1e-5
        base = model.forward_paged(torch.stack(rows), cache, batch)
    assert torch.equal(paged[1], base[1])
    assert bank.rows([None, None]) is None
