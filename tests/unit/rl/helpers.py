"""Test-local pieces for the objective tests: a tiny causal LM with the packed-model signature
`model(input_ids, position_ids, cu_seqlens, tree=None) -> logits` (`packed_attention`: causal path
rows, ancestor-only tree rows), and builders of rows and batches. Tests do not depend on the
embedded model."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from gyre.model.attention import packed_attention
from gyre.model.tree_layout import TreeLayout
from gyre.rl.advantages import MemberReward, MemberStatus, group_advantages
from gyre.trajectory import admit, materialize
from gyre.trajectory.materialize import RowLayout
from gyre.trajectory.row import TrajectoryRow
from tests.unit.trajectory.harness_sim import run_script

VOCAB = 24


class TinyLM(nn.Module):
    """Two pre-norm transformer blocks over learned positions; deterministic (no dropout)."""

    def __init__(
        self,
        *,
        d_model: int = 16,
        num_heads: int = 2,
        num_layers: int = 2,
        max_positions: int = 256,
        vocab_size: int = VOCAB,
        dtype: torch.dtype = torch.float64,
        seed: int = 0,
    ) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.num_heads = num_heads
        self.embed = nn.Embedding(vocab_size, d_model, dtype=dtype)
        self.positions = nn.Embedding(max_positions, d_model, dtype=dtype)
        self.blocks = nn.ModuleList()
        for _ in range(num_layers):
            block = nn.ModuleDict(
                {
                    "norm1": nn.LayerNorm(d_model, dtype=dtype),
                    "qkv": nn.Linear(d_model, 3 * d_model, dtype=dtype),
                    "out": nn.Linear(d_model, d_model, dtype=dtype),
                    "norm2": nn.LayerNorm(d_model, dtype=dtype),
                    "up": nn.Linear(d_model, 2 * d_model, dtype=dtype),
                    "down": nn.Linear(2 * d_model, d_model, dtype=dtype),
                }
            )
            self.blocks.append(block)
        self.norm = nn.LayerNorm(d_model, dtype=dtype)
        self.head = nn.Linear(d_model, vocab_size, dtype=dtype)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen, dtype=dtype) * 0.3)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        tree: TreeLayout | None = None,
    ) -> torch.Tensor:
        x = self.embed(input_ids) + self.positions(position_ids)
        t, d = x.shape
        for block in self.blocks:
            q, k, v = block["qkv"](block["norm1"](x)).split(d, dim=-1)
            heads = [y.view(t, self.num_heads, d // self.num_heads) for y in (q, k, v)]
            x = x + block["out"](packed_attention(*heads, cu_seqlens, tree).reshape(t, d))
            x = x + block["down"](torch.nn.functional.gelu(block["up"](block["norm2"](x))))
        return self.head(self.norm(x))


def logprobs_alone(model: TinyLM, tokens: np.ndarray) -> np.ndarray:
    """log π(token_t | tokens_<t) for t >= 1 (0.0 at t = 0), the row run by itself."""
    ids = torch.as_tensor(tokens, dtype=torch.int64)
    with torch.no_grad():
        logits = model(ids, torch.arange(len(ids)), torch.tensor([0, len(ids)], dtype=torch.int32))
        lp = torch.log_softmax(logits.double(), dim=-1)[:-1].gather(1, ids[1:, None]).squeeze(1)
    return np.concatenate([[0.0], lp.numpy()])


def make_row(
    execution_id: str, index: int, tokens: np.ndarray, targets: np.ndarray, behaviour: np.ndarray
) -> TrajectoryRow:
    return TrajectoryRow(
        execution_id=execution_id,
        trajectory_index=index,
        leaf_class="main",
        token_ids=np.asarray(tokens, dtype=np.int32),
        target_mask=np.asarray(targets, dtype=np.bool_),
        behaviour_logprobs=np.where(targets, behaviour, 0.0).astype(np.float32),
        policy_versions=np.where(targets, 0, -1).astype(np.int32),
    )


def execution_rows(
    rng: np.random.Generator,
    model: TinyLM,
    execution_id: str,
    *,
    max_rows: int = 3,
    max_len: int = 30,
    noise: float = 0.02,
) -> list[TrajectoryRow]:
    """Rows of one execution shaped like admitted paths of a tree: later rows share a prefix of the
    first and carry targets only after it (a shared target is trained once)."""
    first = rng.integers(0, VOCAB, size=int(rng.integers(4, max_len + 1)))
    rows = []
    for j in range(int(rng.integers(1, max_rows + 1))):
        if j == 0:
            tokens, shared = first, 1
        else:
            shared = int(rng.integers(1, len(first)))
            tokens = np.concatenate(
                [first[:shared], rng.integers(0, VOCAB, size=int(rng.integers(2, max_len)))]
            )
        targets = rng.random(len(tokens)) < 0.6
        targets[:shared] = False
        targets[0] = False
        behaviour = logprobs_alone(model, tokens) + rng.normal(0.0, noise, size=len(tokens))
        rows.append(make_row(execution_id, j, tokens, targets, behaviour))
    return rows


def random_batch(
    rng: np.random.Generator,
    model: TinyLM,
    *,
    num_groups: int = 3,
    group_size: int = 4,
    max_rows: int = 3,
    max_len: int = 30,
) -> tuple[list[TrajectoryRow], dict[str, float], int]:
    """(rows, advantages, B·N) of a batch with valid, placeholder and excluded members."""
    rows: list[TrajectoryRow] = []
    advantages: dict[str, float] = {}
    for g in range(num_groups):
        members = []
        for k in range(group_size):
            eid = f"g{g}e{k}"
            kind = rng.choice(["valid"] * 6 + ["placeholder", "excluded"])
            status = MemberStatus(kind)
            members.append(MemberReward(eid, status, float(rng.normal())))
            if status is MemberStatus.VALID:
                rows.extend(execution_rows(rng, model, eid, max_rows=max_rows, max_len=max_len))
        advantages.update(group_advantages(members).advantages)
    return rows, advantages, num_groups * group_size


BRANCHING = ["step", "retry", "sub", "step", "sub", "retry", "compact", "step", "sub_compact", "sub", "retry"]
"""A harness script with retries, compaction and a sub-agent (`tests.unit.trajectory.harness_sim`)."""


def simulated_rows(
    layout: RowLayout, seeds: tuple[int, ...] = (0, 1, 2), j_max: int | None = None
) -> tuple[list[TrajectoryRow], dict[str, float]]:
    """Rows (path or tree) of simulated branching executions, and their advantages."""
    rows: list[TrajectoryRow] = []
    advantages: dict[str, float] = {}
    for seed in seeds:
        tree = run_script(seed, BRANCHING).tree
        rows += materialize(tree, admit(tree, j_max=j_max, seed=seed), layout)
        advantages[tree.execution_id] = 0.5 - (seed % 3) * 0.4
    return rows, advantages
