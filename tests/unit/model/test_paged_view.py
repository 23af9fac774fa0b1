"""The decode view of `PagedKVCache` (`gyre.model.paged`): what a decode step attends through it equals,
at every position a row attends, a fresh gather from the pool, across row changes, block crossings,
prefills, copy-on-write, imports and block reuse; and it is used, not bypassed."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch

from gyre.model.arch import ModelArch, arch_from_config
from gyre.model.paged import PagedBatch, PagedKVCache

LAYERS, HEADS, DIM, BS, SLOTS = 2, 2, 4, 4, 2048


@dataclass
class _Row:
    key: str
    blocks: list[int]
    length: int = 0


@dataclass
class _World:
    """Two pools fed the same writes: `view` steps with row keys, `ref` without (always a gather)."""

    rng: random.Random
    view: PagedKVCache
    ref: PagedKVCache
    free: list[int] = field(default_factory=lambda: list(range(SLOTS // BS - 1, 0, -1)))
    rows: list[_Row] = field(default_factory=list)
    serial: int = 0
    continued: int = 0  # decode steps the view continued from the previous one

    def fresh_block(self) -> int:
        block = self.free.pop()
        for cache in (self.view, self.ref):
            cache.zero_block(block, BS)
        return block

    def join(self) -> None:
        """A new row: its prompt written as a prefill (the pool's generic write), sometimes after a
        copy-on-write of another row's first slots, or imported."""
        self.serial += 1
        length = self.rng.randint(1, 3 * BS)
        row = _Row(f"r{self.serial}", [self.fresh_block() for _ in range(-(-(length + 1) // BS))], length)
        slots = torch.tensor([row.blocks[p // BS] * BS + p % BS for p in range(length)])
        kind = self.rng.random()
        if kind < 0.2 and self.rows:
            donor = self.rng.choice(self.rows)
            n = min(BS, donor.length)
            for cache in (self.view, self.ref):
                cache.copy_slots(row.blocks[0] * BS, donor.blocks[0] * BS, n)
        if kind > 0.8:
            k, v = torch.randn(LAYERS, length, HEADS, DIM), torch.randn(LAYERS, length, HEADS, DIM)
            for cache in (self.view, self.ref):
                cache.put_slots(slots, k, v)
        else:
            for layer in range(LAYERS):
                k, v = torch.randn(length, HEADS, DIM), torch.randn(length, HEADS, DIM)
                for cache in (self.view, self.ref):
                    cache.write(layer, slots, k, v)
        self.rows.insert(self.rng.randrange(len(self.rows) + 1), row)

    def overwrite(self) -> None:
        """Some live row's slots change through each of the pool's writers in turn (a prefill write,
        zeroing, copy-on-write, an import): the next step must see it, though its rows are the same."""
        row = self.rng.choice(self.rows)
        block = self.rng.choice(row.blocks)
        slots = torch.arange(block * BS, (block + 1) * BS)
        k, v = torch.randn(LAYERS, BS, HEADS, DIM), torch.randn(LAYERS, BS, HEADS, DIM)
        writer = self.rng.randrange(4)
        source = self.rng.choice(self.rng.choice(self.rows).blocks)
        for cache in (self.view, self.ref):
            if writer == 0:
                for layer in range(LAYERS):
                    cache.write(layer, slots, k[layer], v[layer])
            elif writer == 1:
                cache.zero_block(block, BS)
            elif writer == 2:
                cache.copy_slots(block * BS, source * BS, BS)
            else:
                cache.put_slots(slots, k, v)

    def finish(self) -> None:
        row = self.rows.pop(self.rng.randrange(len(self.rows)))
        self.free.extend(reversed(row.blocks))  # last freed, first reused: block ids come back

    def decode(self) -> None:
        for row in self.rows:
            if row.length // BS >= len(row.blocks):
                row.blocks.append(self.fresh_block())
        tables = [r.blocks for r in self.rows]
        starts = [r.length for r in self.rows]
        ones = [1] * len(self.rows)
        keyed = PagedBatch.from_block_tables(tables, starts, ones, BS, row_keys=[r.key for r in self.rows])
        plain = PagedBatch.from_block_tables(tables, starts, ones, BS)
        for layer in range(LAYERS):
            k = torch.randn(len(self.rows), 1, HEADS, DIM)
            v = torch.randn(len(self.rows), 1, HEADS, DIM)
            got_k, got_v = self.view.attend(layer, keyed, k, v)
            want_k, want_v = self.ref.attend(layer, plain, k, v)
            assert got_k.shape == want_k.shape
            for b, row in enumerate(self.rows):
                end = row.length + 1
                assert torch.equal(got_k[b, :, :end], want_k[b, :, :end]), (layer, b, keyed.view_from)
                assert torch.equal(got_v[b, :, :end], want_v[b, :, :end]), (layer, b, keyed.view_from)
                assert torch.isfinite(got_k[b]).all() and torch.isfinite(got_v[b]).all()
        self.continued += keyed.view_from > 0
        view = self.view._view
        if view is not None and keyed.view_from >= 0:  # poison the capacity it does not hold yet
            held = keyed.read_blocks.shape[1] * BS
            view.k[:, :, :, held:] = float("nan")
            view.v[:, :, :, held:] = float("nan")
        for row in self.rows:
            row.length += 1


def _arch() -> ModelArch:
    return arch_from_config(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": HEADS * DIM,
            "intermediate_size": 16,
            "num_attention_heads": HEADS,
            "num_key_value_heads": HEADS,
            "num_hidden_layers": LAYERS,
            "vocab_size": 32,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6,
        }
    )


@pytest.mark.parametrize("seed", range(8))
def test_the_decode_view_equals_a_fresh_gather(seed: int) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    world = _World(rng, PagedKVCache.allocate(_arch(), SLOTS, BS), PagedKVCache.allocate(_arch(), SLOTS, BS))
    for _ in range(3):
        world.join()
    for _ in range(160):
        action = rng.random()
        if action < 0.06 and len(world.rows) < 6:
            world.join()
        elif action < 0.1 and len(world.rows) > 1:
            world.finish()
        elif action < 0.16:
            world.overwrite()
        else:
            world.decode()
    assert world.continued > 60  # the view carried most steps; a bypassed view would pass the rest alone


def test_a_view_over_budget_is_not_built() -> None:
    cache = PagedKVCache.allocate(_arch(), SLOTS, BS)
    cache.view_budget_bytes = 0
    batch = PagedBatch.from_block_tables([[1]], [0], [1], BS, row_keys=["a"])
    keys, _ = cache.attend(0, batch, torch.ones(1, 1, HEADS, DIM), torch.ones(1, 1, HEADS, DIM))
    assert batch.view_from == -1 and torch.equal(keys[0, :, 0], torch.ones(HEADS, DIM))
