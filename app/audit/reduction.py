"""The cells' gradients summed in the order the run's reduction summed them (app/audit/replay.py).

    total = gloo_reduce_sum(per_cell)       # dist_backend gloo; otherwise per_cell[0] + per_cell[1] + …

A float sum depends on the order of its additions, so the audit's replay adds the cells'
gradients in the order the run's reduction did. gloo's `reduce` (the embedded default's `dist_backend`) is
a ring reduce-scatter followed by a gather to the core: the buffer is cut into one chunk per cell (segments
of at most 1 MiB, `ReduceOptions::kMaxSegmentSize`, two or more per chunk), and chunk k of n cells comes
out as g_k + (g_k+1 + (… + (g_k−2 + g_k−1))) (indices mod n; `gloo_reduce_sum`). With that order the
replay of the embedded default is bit-exact; summed left to right instead, a step reduced over three cells
was 1.9e-9 off and the difference grew to 4.8e-7 two steps later. `dist_backend: tls` (Gyre's TLS star,
`gyre.trainer.star`) adds them in cell order, left to right, which is what the replay does for every
backend but gloo: bit-exact too. NCCL keeps its order to itself, and the tolerance has to absorb it.
"""

from __future__ import annotations

import torch

GLOO_MAX_SEGMENT_BYTES = 1024 * 1024
"""gloo's `ReduceOptions::kMaxSegmentSize`: the largest segment its ring reduce sends at once."""


def gloo_reduce_sum(
    grads: list[torch.Tensor], max_segment_bytes: int = GLOO_MAX_SEGMENT_BYTES
) -> torch.Tensor:
    """The sum of the cells' flat gradients (cell order) as gloo's ring `reduce` adds them (see the module
    docstring): the same chunks, each summed in the order its partial sums travel round the ring."""
    n = len(grads)
    if n == 1:
        return grads[0].clone()
    element = grads[0].element_size()
    numel = grads[0].numel()
    total = numel * element
    max_segment = element * max(1, max_segment_bytes // element)
    segment = -(-min(-(-total // (2 * n)), max_segment) // element) * element
    segments = max(-(-total // segment), 2 * n)
    segments = -(-segments // n) * n
    chunk = segments // n * segment // element
    out = torch.empty_like(grads[0])
    for k in range(n):
        lo, hi = k * chunk, min((k + 1) * chunk, numel)
        if lo >= hi:
            continue
        ring = [(k + j) % n for j in range(n)]
        acc = grads[ring[-2]][lo:hi] + grads[ring[-1]][lo:hi]
        for cell in reversed(ring[:-2]):
            acc = grads[cell][lo:hi] + acc
        out[lo:hi] = acc
    return out
