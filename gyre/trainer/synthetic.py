"""Synthetic batches of micro-steps for benchmarks and tests of the training path.

Rows look like admitted agent trajectories of a small model: random token ids, 1..3 rows per
execution sharing a prefix, about half of each row's suffix as targets, behaviour log-probs equal to
the model's own log-probs plus a little noise (so token ratios sit near 1 and the sequence clip
sometimes fires), and group-relative advantages. The micro-steps come out of the real packer
(`gyre.rl.stream.StreamPacker`), so they have exactly the coefficients 1/(L_i·B·N) a live run has.

    steps = synthetic_microsteps(model, batch_id="b0", step=0, num_groups=4, group_size=4, token_budget=512)
"""

from __future__ import annotations

import numpy as np
import torch

from gyre.model.causal_lm import CausalLM
from gyre.rl.advantages import MemberReward, MemberStatus, group_advantages
from gyre.rl.microstep import MicroStep
from gyre.rl.stream import StreamPacker
from gyre.trajectory.row import TrajectoryRow


def _row_logprobs(model: CausalLM, tokens: np.ndarray) -> np.ndarray:
    ids = torch.as_tensor(tokens, dtype=torch.int64)
    with torch.no_grad():
        logits = model(ids, torch.arange(len(ids)), [0, len(ids)]).double()
        lp = torch.log_softmax(logits, dim=-1)[:-1].gather(1, ids[1:, None]).squeeze(1)
    return np.concatenate([[0.0], lp.numpy()])


def _execution_rows(
    rng: np.random.Generator, model: CausalLM, execution_id: str, min_len: int, max_len: int, noise: float
) -> list[TrajectoryRow]:
    vocab = min(model.arch.vocab_size, 256)
    first = rng.integers(0, vocab, size=int(rng.integers(min_len, max_len + 1)))
    rows: list[TrajectoryRow] = []
    for j in range(int(rng.integers(1, 4))):
        if j == 0:
            tokens, shared = first, max(1, len(first) // 3)
        else:
            shared = int(rng.integers(1, len(first)))
            tokens = np.concatenate(
                [first[:shared], rng.integers(0, vocab, size=int(rng.integers(2, max_len // 2 + 3)))]
            )
        targets = rng.random(len(tokens)) < 0.5
        targets[:shared] = False
        targets[0] = False
        behaviour = _row_logprobs(model, tokens) + rng.normal(0.0, noise, size=len(tokens))
        rows.append(
            TrajectoryRow(
                execution_id=execution_id,
                trajectory_index=j,
                leaf_class="main" if j == 0 else "sub_agent",
                token_ids=tokens.astype(np.int32),
                target_mask=targets,
                behaviour_logprobs=np.where(targets, behaviour, 0.0).astype(np.float32),
                policy_versions=np.where(targets, 0, -1).astype(np.int32),
            )
        )
    return rows


def synthetic_microsteps(
    model: CausalLM,
    *,
    batch_id: str,
    step: int,
    num_groups: int = 4,
    group_size: int = 4,
    token_budget: int = 512,
    min_row_tokens: int = 16,
    max_row_tokens: int = 160,
    noise: float = 0.01,
    seed: int = 0,
) -> list[MicroStep]:
    """The micro-steps of one batch of `num_groups` × `group_size` executions, in stream order."""
    if max_row_tokens > model.max_positions:
        raise ValueError(
            f"max_row_tokens {max_row_tokens} exceeds the model's max_position_embeddings {model.max_positions}"
        )
    rng = np.random.default_rng(seed)
    stream = StreamPacker(
        batch_id=batch_id, step=step, num_batch_executions=num_groups * group_size, token_budget=token_budget
    )
    steps: list[MicroStep] = []
    for g in range(num_groups):
        members = [
            MemberReward(f"g{g}e{k}", MemberStatus.VALID, float(rng.random())) for k in range(group_size)
        ]
        advantages = group_advantages(members).advantages
        rows = [
            row
            for m in members
            for row in _execution_rows(rng, model, m.execution_id, min_row_tokens, max_row_tokens, noise)
        ]
        steps.extend(stream.add(rows, advantages))
    steps.extend(stream.close())
    return steps
