"""GyreLM: the parameter-name contract, the packed training forward and the paged serving forward."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.config.model import ModelSection
from gyre.model.config import ModelConfig
from gyre.model.paged import PagedBatch, PagedKVCache
from gyre.model.transformer import GyreLM, build_model

SMALL = ModelConfig(num_layers=2, d_model=32, num_heads=2, ffn_hidden=64, vocab_size=272, max_seq_len=256)


@pytest.fixture(scope="module")
def model() -> GyreLM:
    return build_model(SMALL, seed=0)


def test_parameter_names_are_the_contract() -> None:
    names = dict(build_model(ModelConfig(), seed=0).named_parameters())
    expected = {"embed.weight", "norm.weight", "lm_head.weight"}
    for i in range(4):
        expected |= {f"layers.{i}.attn_norm.weight", f"layers.{i}.mlp_norm.weight"}
        expected |= {f"layers.{i}.attn.{p}_proj.weight" for p in "qkvo"}
        expected |= {f"layers.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    assert set(names) == expected
    assert names["layers.0.mlp.down_proj.weight"].shape == (128, 384)
    assert names["embed.weight"].shape == (272, 128)
    assert not any(name.startswith("rotary") for name in build_model(ModelConfig()).state_dict())


def test_default_config_mirrors_the_model_section() -> None:
    assert ModelConfig.from_section(ModelSection()) == ModelConfig()
    assert ModelConfig().vocab_size >= 264


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"d_model": 30, "num_heads": 4}, "num_heads must divide"), ({"vocab_size": 100}, "vocab_size")],
)
def test_config_rejects_bad_shapes(kwargs: dict[str, int], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        ModelConfig(**kwargs)


def test_init_is_deterministic() -> None:
    a, b = build_model(SMALL, seed=3), build_model(SMALL, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.embed.weight, build_model(SMALL, seed=4).embed.weight)


def _packed(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    ids = torch.cat(rows)
    positions = torch.cat([torch.arange(len(r)) for r in rows])
    cu = [0]
    for r in rows:
        cu.append(cu[-1] + len(r))
    return ids, positions, cu


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=5), seed=st.integers(0, 99)
)
def test_packed_forward_equals_each_row_alone(model: GyreLM, lengths: list[int], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, 264, (n,), generator=gen) for n in lengths]
    ids, positions, cu = _packed(rows)
    with torch.no_grad():
        packed = model(ids, positions, torch.tensor(cu, dtype=torch.int32))
        for row, start in zip(rows, cu, strict=False):
            alone = model(row, torch.arange(len(row)), [0, len(row)])
            assert (alone - packed[start : start + len(row)]).abs().max().item() <= 1e-5


def test_packed_forward_is_differentiable(model: GyreLM) -> None:
    ids, positions, cu = _packed([torch.tensor([1, 2, 3]), torch.tensor([4, 5])])
    model.zero_grad()
    model(ids, positions, cu).logsumexp(-1).sum().backward()
    assert model.layers[0].attn.q_proj.weight.grad is not None
    model.zero_grad()


def test_packed_forward_validates_its_inputs(model: GyreLM) -> None:
    ids = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="cu_seqlens"):
        model(ids, torch.arange(3), [0, 2])
    with pytest.raises(ValueError, match="1-D"):
        model(ids.view(1, 3), torch.arange(3).view(1, 3), [0, 3])
    with pytest.raises(ValueError, match="max_seq_len"):
        model(ids, torch.tensor([0, 1, SMALL.max_seq_len]), [0, 3])


def test_paged_forward_matches_the_packed_forward(model: GyreLM) -> None:
    """Chunked prefill of one row batched with the prefill of another, then batched decode."""
    bs = 4
    gen = torch.Generator().manual_seed(0)
    long_row, short_row = (
        torch.randint(0, 264, (30,), generator=gen),
        torch.randint(0, 264, (7,), generator=gen),
    )
    with torch.no_grad():
        ref_long = model(long_row, torch.arange(30), [0, 30])
        ref_short = model(short_row, torch.arange(7), [0, 7])
        cache = PagedKVCache.allocate(SMALL, 64 * bs, bs)
        cache.k.zero_()
        cache.v.zero_()
        table_long, table_short = [9, 3, 17, 5, 11, 30, 31, 40], [20, 21]
        # step 1: first 13 tokens of the long row alone
        batch = PagedBatch.from_block_tables([table_long], [0], [13], bs)
        out = model.forward_paged(long_row[:13].view(1, -1), cache, batch)
        assert (out[0] - ref_long[:13]).abs().max() <= 1e-5
        # step 2: the next 10 of the long row with all 6 but the last of the short row
        ids = torch.zeros(2, 10, dtype=torch.long)
        ids[0], ids[1, :6] = long_row[13:23], short_row[:6]
        batch = PagedBatch.from_block_tables([table_long, table_short], [13, 0], [10, 6], bs)
        last = torch.tensor([9, 5])
        out = model.forward_paged(ids, cache, batch, last_index=last)
        assert (out[0] - ref_long[22]).abs().max() <= 1e-5
        assert (out[1] - ref_short[5]).abs().max() <= 1e-5
        # decode: one token per row, rows of different lengths
        ids = torch.stack([long_row[23:24], short_row[6:7]])
        batch = PagedBatch.from_block_tables([table_long, table_short], [23, 6], [1, 1], bs)
        out = model.forward_paged(ids, cache, batch, last_index=torch.zeros(2, dtype=torch.long))
        assert (out[0] - ref_long[23]).abs().max() <= 1e-5
        assert (out[1] - ref_short[6]).abs().max() <= 1e-5
        for p in range(24, 30):
            batch = PagedBatch.from_block_tables([table_long], [p], [1], bs)
            out = model.forward_paged(long_row[p : p + 1].view(1, 1), cache, batch)
            assert (out[0, 0] - ref_long[p]).abs().max() <= 1e-5


def test_paged_batch_masks_padding() -> None:
    batch = PagedBatch.from_block_tables([[1, 2], [3]], [5, 0], [2, 1], 4)
    assert batch.positions.tolist() == [[5, 6], [0, 0]]
    assert batch.write_slots.tolist() == [[9, 10], [12, 0]]
    mask = batch.mask[:, 0]
    assert mask[0, 0].tolist() == [True] * 6 + [False]
    assert mask[0, 1].tolist() == [True] * 7
    assert mask[1, 0].tolist() == [True] + [False] * 6
    assert mask[1, 1].tolist() == [True] + [False] * 6  # padding query: key 0 only, never all-masked


def test_padding_ids_past_the_tokenizer_are_never_predicted() -> None:
    from gyre.model.config import ModelConfig
    from gyre.model.tokenizer import ByteTokenizer
    from gyre.model.transformer import build_model

    model = build_model(ModelConfig(num_layers=1, d_model=32, num_heads=2, ffn_hidden=64, vocab_size=272))
    ids = torch.tensor([1, 2, 3, 4])
    logits = model(ids, torch.arange(4), [0, 4])
    probs = torch.softmax(logits.float(), dim=-1)
    assert probs[:, ByteTokenizer().vocab_size :].max().item() == 0.0
    assert torch.isfinite(torch.log_softmax(logits, -1)[:, : ByteTokenizer().vocab_size]).all()
