"""CausalLM against transformers' own modeling code: names, packed and paged forwards, RoPE kinds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.model.architectures import ARCHITECTURES
from gyre.model.causal_lm import CausalLM
from gyre.model.init import init_model_dir
from gyre.model.paged import PagedBatch, PagedKVCache
from gyre.model.weights import load_model
from tests.support.models import SMALL, hf_dir, load_small, written_names

ARCHES = tuple(sorted(ARCHITECTURES))


def _hf(path: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def small() -> CausalLM:
    return load_small()


@pytest.mark.parametrize("arch", ARCHES)
def test_parameter_names_are_the_checkpoints_own(arch: str, tmp_path: Path) -> None:
    ours = load_model(hf_dir(arch))
    hf_names = written_names(_hf(hf_dir(arch)), tmp_path / "saved")
    assert {n for n, _ in ours.named_parameters()} == hf_names
    assert set(ours.arch.parameter_shapes()) == hf_names
    assert not any(k.startswith("rotary") for k in ours.state_dict() if "inv_freq" in k)


@pytest.mark.parametrize("arch", ARCHES)
def test_logits_equal_transformers(arch: str) -> None:
    ours, theirs = load_model(hf_dir(arch)), _hf(hf_dir(arch))
    ids = torch.randint(0, ours.arch.vocab_size, (300,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = ours(ids, torch.arange(300), [0, 300]).log_softmax(-1)
        b = theirs(ids[None]).logits[0].log_softmax(-1)
    assert (a - b).abs().max().item() <= 1e-5


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "linear", "factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "beta_fast": 16},
    ],
)
def test_rope_scaling_kinds_equal_transformers(tmp_path: Path, scaling: dict[str, Any]) -> None:
    path = init_model_dir(
        tmp_path / "m",
        arch="llama",
        tokenizer="byte",
        family="chatml",
        overrides={**SMALL, "max_position_embeddings": 8192, "rope_scaling": scaling},
    )
    ours, theirs = load_model(path), _hf(path)
    ids = torch.randint(0, 264, (2500,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a = ours(ids, torch.arange(2500), [0, 2500]).log_softmax(-1)
        b = theirs(ids[None]).logits[0].log_softmax(-1)
    assert (a - b).abs().max().item() <= 1e-5


def _packed(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    cu = [0]
    for r in rows:
        cu.append(cu[-1] + len(r))
    return torch.cat(rows), torch.cat([torch.arange(len(r)) for r in rows]), cu


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=5), seed=st.integers(0, 99)
)
def test_packed_forward_equals_each_row_alone(small: CausalLM, lengths: list[int], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, 264, (n,), generator=gen) for n in lengths]
    ids, positions, cu = _packed(rows)
    with torch.no_grad():
        packed = small(ids, positions, torch.tensor(cu, dtype=torch.int32))
        for row, start in zip(rows, cu, strict=False):
            alone = small(row, torch.arange(len(row)), [0, len(row)])
            assert (alone - packed[start : start + len(row)]).abs().max().item() <= 1e-5


def test_packed_forward_is_differentiable_and_validates(small: CausalLM) -> None:
    ids, positions, cu = _packed([torch.tensor([1, 2, 3]), torch.tensor([4, 5])])
    small.zero_grad()
    small(ids, positions, cu).logsumexp(-1).sum().backward()
    assert small.model.layers[0].self_attn.q_proj.weight.grad is not None
    small.zero_grad()
    with pytest.raises(ValueError, match="1-D"):
        small(ids.view(1, 5), positions.view(1, 5), cu)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        small(torch.tensor([1, 2]), torch.tensor([0, 5000]), [0, 2])


def test_logits_from_gives_the_tail_of_the_logits(small: CausalLM) -> None:
    """What the scored_script source asks for: the logits of a prompt's last token and its continuation."""
    ids = torch.randint(0, 264, (30,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = small(ids, torch.arange(30), [0, 30])
        for start in (0, 1, 29, 30):
            tail = small(ids, torch.arange(30), [0, 30], logits_from=start)
            assert tail.shape == full[start:].shape and torch.allclose(tail, full[start:], rtol=0, atol=1e-5)
    for bad in (-1, 31):
        with pytest.raises(ValueError, match="logits_from"):
            small(ids, torch.arange(30), [0, 30], logits_from=bad)


@pytest.mark.parametrize("arch", ARCHES)
def test_paged_forward_matches_the_packed_forward(arch: str) -> None:
    """Chunked prefill of one row batched with the prefill of another, then batched decode (GQA)."""
    model = load_model(hf_dir(arch))
    bs = 4
    gen = torch.Generator().manual_seed(0)
    long_row = torch.randint(0, model.arch.vocab_size, (30,), generator=gen)
    short_row = torch.randint(0, model.arch.vocab_size, (7,), generator=gen)
    with torch.no_grad():
        ref_long = model(long_row, torch.arange(30), [0, 30])
        ref_short = model(short_row, torch.arange(7), [0, 7])
        cache = PagedKVCache.allocate(model.arch, 64 * bs, bs)
        cache.k.zero_()
        cache.v.zero_()
        table_long, table_short = [9, 3, 17, 5, 11, 30, 31, 40], [20, 21]
        out = model.forward_paged(
            long_row[:13].view(1, -1), cache, PagedBatch.from_block_tables([table_long], [0], [13], bs)
        )
        assert (out[0] - ref_long[:13]).abs().max() <= 1e-5
        ids = torch.zeros(2, 10, dtype=torch.long)
        ids[0], ids[1, :6] = long_row[13:23], short_row[:6]
        batch = PagedBatch.from_block_tables([table_long, table_short], [13, 0], [10, 6], bs)
        out = model.forward_paged(ids, cache, batch, last_index=torch.tensor([9, 5]))
        assert (out[0] - ref_long[22]).abs().max() <= 1e-5
        assert (out[1] - ref_short[5]).abs().max() <= 1e-5
        ids = torch.stack([long_row[23:24], short_row[6:7]])
        batch = PagedBatch.from_block_tables([table_long, table_short], [23, 6], [1, 1], bs)
        out = model.forward_paged(ids, cache, batch, last_index=torch.zeros(2, dtype=torch.long))
        assert (out[0] - ref_long[23]).abs().max() <= 1e-5
        assert (out[1] - ref_short[6]).abs().max() <= 1e-5


def test_paged_batch_masks_padding() -> None:
    batch = PagedBatch.from_block_tables([[1, 2], [3]], [5, 0], [2, 1], 4)
    assert batch.positions.tolist() == [[5, 6], [0, 0]]
    assert batch.write_slots.tolist() == [[9, 10], [12, 0]]
    mask = batch.mask[:, 0]
    assert mask[0, 0].tolist() == [True] * 6 + [False]
    assert mask[0, 1].tolist() == [True] * 7
    assert mask[1, 0].tolist() == [True] + [False] * 6
    assert mask[1, 1].tolist() == [True] + [False] * 6  # padding query: key 0 only, never all-masked


def test_init_is_deterministic(tmp_path: Path) -> None:
    a = init_model_dir(
        tmp_path / "a", arch="llama", tokenizer="byte", family="chatml", seed=3, overrides=SMALL
    )
    b = init_model_dir(
        tmp_path / "b", arch="llama", tokenizer="byte", family="chatml", seed=3, overrides=SMALL
    )
    c = init_model_dir(
        tmp_path / "c", arch="llama", tokenizer="byte", family="chatml", seed=4, overrides=SMALL
    )
    pa, pb, pc = (dict(load_model(p).named_parameters()) for p in (a, b, c))
    assert all(torch.equal(pa[n], pb[n]) for n in pa)
    assert not torch.equal(pa["model.embed_tokens.weight"], pc["model.embed_tokens.weight"])
