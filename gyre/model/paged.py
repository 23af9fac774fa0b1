"""The paged KV layout the engine serves from: one slot-addressed pool per layer plus a batch descriptor.

A *slot* holds the rotated key and the value of one token for every head; the engine hands out slots
in fixed-size blocks (block `b` owns slots `b*block_size ... b*block_size + block_size - 1`) and
describes one forward step with a `PagedBatch` (built from per-row block tables):

- `positions [B, Lq]`: the position of each new token (padding queries get 0);
- `write_slots [B, Lq]`: where the K/V of each new token goes (padding writes go to the scratch slot);
- `read_blocks [B, nb]`: the blocks a row's keys live in, in position order (padded with the scratch
  block); a step reads whole blocks (one copy per block, not per token) and attends the first
  `num_keys` slots of them;
- `mask [B, 1, Lq, num_keys]` (bool): True where query i of row b may attend key j; None when every
  query attends every key (decode rows of one length), which takes SDPA's unmasked kernel.

Block 0 is scratch: never handed to a request; it pads the block lists of shorter rows, and slot
0 takes the writes of padding queries. It always holds finite values, so a masked key contributes
exactly zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gyre.model.arch import ModelArch

SCRATCH_SLOT = 0


@dataclass(slots=True)
class PagedKVCache:
    """K and V of every layer: `k[layer, slot, kv_head, dim]` (keys are stored after rotary)."""

    k: torch.Tensor
    v: torch.Tensor
    # Reused gather outputs: a fresh multi-MiB tensor per layer and step would be mmap'ed and
    # page-faulted by the allocator every time, which costs more than the attention itself on CPU.
    _gather_k: torch.Tensor | None = None
    _gather_v: torch.Tensor | None = None

    @classmethod
    def allocate(
        cls, arch: ModelArch, num_slots: int, block_size: int, dtype: torch.dtype = torch.float32
    ) -> PagedKVCache:
        shape = (arch.num_layers, num_slots, arch.num_kv_heads, arch.head_dim)
        # empty: pages are touched only when a slot is first written, so an idle pool costs no RSS.
        k = torch.empty(shape, dtype=dtype)
        v = torch.empty(shape, dtype=dtype)
        return cls(k=k, v=v).zero_block(0, block_size)

    @property
    def num_slots(self) -> int:
        return int(self.k.shape[1])

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the K/V [N, H, D] of N tokens at `slots` [N]."""
        if k.dtype != self.k.dtype:  # a cast is a dispatch even when it changes nothing
            k, v = k.to(self.k.dtype), v.to(self.v.dtype)
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    def gather(
        self, layer: int, blocks: torch.Tensor, block_size: int, num_keys: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the first `num_keys` slots of `blocks` [B, nb] (in order) as [B, num_keys, H, D]:
        one copy per block. The tensors are views of buffers reused by the next call: consume them
        before gathering again."""
        num_slots, num_heads, head_dim = self.k.shape[1:]
        width = block_size * num_heads * head_dim
        n = blocks.numel()
        if self._gather_k is None or self._gather_k.shape[0] < n or self._gather_k.shape[1] != width:
            self._gather_k = torch.empty((n, width), dtype=self.k.dtype)
            self._gather_v = torch.empty((n, width), dtype=self.v.dtype)
        assert self._gather_v is not None
        flat = blocks.reshape(-1)
        pool_k = self.k[layer].view(num_slots // block_size, width)
        pool_v = self.v[layer].view(num_slots // block_size, width)
        keys = torch.index_select(pool_k, 0, flat, out=self._gather_k[:n])
        values = torch.index_select(pool_v, 0, flat, out=self._gather_v[:n])
        shape = (blocks.shape[0], blocks.shape[1] * block_size, num_heads, head_dim)
        return keys.view(shape)[:, :num_keys], values.view(shape)[:, :num_keys]

    def zero_block(self, block: int, block_size: int) -> PagedKVCache:
        self.k[:, block * block_size : (block + 1) * block_size].zero_()
        self.v[:, block * block_size : (block + 1) * block_size].zero_()
        return self

    def nbytes(self) -> int:
        return self.k.nelement() * self.k.element_size() * 2


@dataclass(slots=True)
class PagedBatch:
    """One forward step over B rows of Lq new tokens each, attending `num_keys` cached keys."""

    positions: torch.Tensor
    write_slots: torch.Tensor
    read_blocks: torch.Tensor
    num_keys: int
    block_size: int
    mask: torch.Tensor | None

    @classmethod
    def from_block_tables(
        cls,
        block_tables: list[list[int]],
        starts: list[int],
        counts: list[int],
        block_size: int,
    ) -> PagedBatch:
        """Row b computes `counts[b]` new tokens at positions `starts[b] ...` and attends positions
        `0 .. starts[b] + counts[b] - 1`; its KV lives in the blocks `block_tables[b]` (position p is
        slot `block_tables[b][p // block_size] * block_size + p % block_size`)."""
        num_rows = len(block_tables)
        assert num_rows == len(starts) == len(counts) and num_rows > 0
        ends = [s + c for s, c in zip(starts, counts, strict=True)]
        lq, lk = max(counts), max(ends)
        num_blocks = -(-lk // block_size)
        rows = []
        for blocks, end, count in zip(block_tables, ends, counts, strict=True):
            assert end <= len(blocks) * block_size and count >= 1
            used = blocks[:num_blocks]
            rows.append(used + [0] * (num_blocks - len(used)))
        read = torch.tensor(rows, dtype=torch.long)
        if lq == 1:
            # Decode: positions, slots and the mask in Python (a handful of ops, not ~20 tensor ops).
            positions = torch.tensor([[s] for s in starts], dtype=torch.long)
            write = torch.tensor(
                [
                    [t[s // block_size] * block_size + s % block_size]
                    for t, s in zip(rows, starts, strict=True)
                ],
                dtype=torch.long,
            )
            mask = None
            if min(ends) != lk:
                mask = (torch.arange(lk).view(1, lk) < torch.tensor(ends).view(num_rows, 1)).view(
                    num_rows, 1, 1, lk
                )
            return cls(positions, write, read, lk, block_size, mask)
        start = torch.tensor(starts, dtype=torch.long).view(num_rows, 1)
        count = torch.tensor(counts, dtype=torch.long).view(num_rows, 1)
        i = torch.arange(lq).view(1, lq)
        j = torch.arange(lk)
        valid_q = i < count
        positions = torch.where(valid_q, start + i, 0)
        write = read.gather(1, (positions // block_size).clamp(max=num_blocks - 1)) * block_size
        write = torch.where(valid_q, write + positions % block_size, SCRATCH_SLOT)
        attend = (j.view(1, 1, lk) <= (start + i).unsqueeze(-1)) & valid_q.unsqueeze(-1)
        # A padding query attends key 0 only, so its softmax is finite (its output is discarded).
        attend |= (~valid_q).unsqueeze(-1) & (j.view(1, 1, lk) == 0)
        return cls(positions, write, read, lk, block_size, attend.unsqueeze(1))
