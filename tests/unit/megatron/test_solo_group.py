"""The trainer's group of one (`solo_group`) takes the collectives megatron-core issues on it.

megatron-core's DDP reduces a bucket group's gradients under torch's `_coalescing_manager`, which ends by
calling the group's coalesced collective (`reduce_scatter_tensor_coalesced` / `_single_coalesced`, by torch
version). Only a `ProcessGroup` has those; the bare `ProcessGroupNCCL` the CUDA path used to hand out failed
there on the first GPU run (`gyre bench gpu`, AttributeError). The same call on CPU with a bare
`ProcessGroupGloo` fails the same way, so this test catches the defect without a GPU."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager

from gyre.trainer.backends.megatron.model import ensure_world, solo_group


def test_solo_group_is_a_process_group_that_takes_coalesced_collectives() -> None:
    device = torch.device("cpu")
    ensure_world(device)
    group = solo_group(device)
    assert isinstance(group, dist.ProcessGroup) and (group.rank(), group.size()) == (0, 1)

    grads = [torch.arange(6, dtype=torch.float32), torch.arange(4, dtype=torch.float32) * 2]
    shards = [torch.empty_like(g) for g in grads]
    with _coalescing_manager(group, async_ops=False):
        for shard, grad in zip(shards, grads, strict=True):
            dist.reduce_scatter_tensor(shard, grad, group=group)
    assert all(torch.equal(s, g) for s, g in zip(shards, grads, strict=True))

    gathered = [torch.empty_like(g) for g in grads]
    with _coalescing_manager(group, async_ops=False):
        for out, shard in zip(gathered, shards, strict=True):
            dist.all_gather_into_tensor(out, shard, group=group)
    assert all(torch.equal(o, g) for o, g in zip(gathered, grads, strict=True))
