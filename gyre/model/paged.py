"""The paged KV layout the engine serves from: one slot-addressed pool per layer plus a batch descriptor.

A *slot* holds the rotated key and the value of one token for every head; the engine hands out slots
in fixed-size blocks (block `b` owns slots `b*block_size ... b*block_size + block_size - 1`) and
describes one forward step with a `PagedBatch` (built from per-row block tables):

- `positions [B, Lq]`: the position of each new token (padding queries get 0);
- `write_slots [B, Lq]`: where the K/V of each new token goes (padding writes go to the scratch slot);
- `read_slots [B, Lk]`: the slots of every key a row attends, in position order (padded with the
  scratch slot);
- `mask [B, 1, Lq, Lk]`: True where query i of row b may attend key j.

Block 0 is scratch: never handed to a request; its slots pad the read lists of shorter rows, and slot
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
        self.k[layer].index_copy_(0, slots, k.to(self.k.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.v.dtype))

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at `slots` [B, Lk] as [B, Lk, H, D]. The tensors are views of buffers reused by the
        next call: consume them before gathering again."""
        num_slots, num_heads, head_dim = self.k.shape[1:]
        n = slots.numel()
        if self._gather_k is None or self._gather_k.shape[0] < n:
            self._gather_k = torch.empty((n, num_heads * head_dim), dtype=self.k.dtype)
            self._gather_v = torch.empty((n, num_heads * head_dim), dtype=self.v.dtype)
        assert self._gather_v is not None
        flat = slots.reshape(-1)
        keys = torch.index_select(self.k[layer].view(num_slots, -1), 0, flat, out=self._gather_k[:n])
        values = torch.index_select(self.v[layer].view(num_slots, -1), 0, flat, out=self._gather_v[:n])
        shape = (*slots.shape, num_heads, head_dim)
        return keys.view(shape), values.view(shape)

    def zero_block(self, block: int, block_size: int) -> PagedKVCache:
        self.k[:, block * block_size : (block + 1) * block_size].zero_()
        self.v[:, block * block_size : (block + 1) * block_size].zero_()
        return self

    def nbytes(self) -> int:
        return self.k.nelement() * self.k.element_size() * 2


@dataclass(slots=True)
class PagedBatch:
    """One forward step over B rows of Lq new tokens each, attending Lk cached keys."""

    positions: torch.Tensor
    write_slots: torch.Tensor
    read_slots: torch.Tensor
    mask: torch.Tensor

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
        num_blocks = max(len(t) for t in block_tables)
        table = torch.zeros((num_rows, num_blocks), dtype=torch.long)
        for b, blocks in enumerate(block_tables):
            assert (starts[b] + counts[b]) <= len(blocks) * block_size and counts[b] >= 1
            table[b, : len(blocks)] = torch.tensor(blocks, dtype=torch.long)
        start = torch.tensor(starts, dtype=torch.long).view(num_rows, 1)
        count = torch.tensor(counts, dtype=torch.long).view(num_rows, 1)
        lq, lk = max(counts), max(s + c for s, c in zip(starts, counts, strict=True))
        i = torch.arange(lq).view(1, lq)
        j = torch.arange(lk)
        valid_q = i < count
        positions = torch.where(valid_q, start + i, 0)
        write = table.gather(1, (positions // block_size).clamp(max=num_blocks - 1)) * block_size
        write = torch.where(valid_q, write + positions % block_size, SCRATCH_SLOT)
        read_block = (j // block_size).clamp(max=num_blocks - 1).expand(num_rows, lk)
        read = table.gather(1, read_block) * block_size + j % block_size
        attend = (j.view(1, 1, lk) <= (start + i).unsqueeze(-1)) & valid_q.unsqueeze(-1)
        # A padding query attends key 0 only, so its softmax is finite (its output is discarded).
        attend |= (~valid_q).unsqueeze(-1) & (j.view(1, 1, lk) == 0)
        return cls(positions=positions, write_slots=write, read_slots=read, mask=attend.unsqueeze(1))
