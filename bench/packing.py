"""`gyre bench packing`: how fast and how tightly the stream packer turns one batch of admitted rows
into micro-steps, against the naive layout (one row per sequence, padded to the longest).

The batch is synthetic but shaped like xLong agent data, scaled to the demo model's 4K context:
B groups × N executions; per execution 1..J_max rows (geometric: most executions have only the main
trajectory, compaction and sub-agents add more); row lengths heavy-tailed — an execution-level
log-normal scale times a row-level log-normal, clipped to [64, max_row_tokens] — so a few executions
are far larger than the budget; about a quarter of the tokens are targets (the rest is prompts and
tool output); 1 in 32 members excluded and 1 in 64 placeholders (no rows).

Reported: `rows_per_s` and `tokens_per_s` of the stream packer (median of repeats, rows in → encoded
micro-steps out is excluded; `codec_*` measures the codec separately), `padding_fraction` (unused
budget of the packed micro-steps; an oversize micro-step counts one budget per chunk),
`padding_fraction_naive` (every row padded to the longest row), `padding_fraction_naive_microbatch`
(rows in arrival order, padded to the longest row of micro-batches under the same budget), and
`padding_fraction_whole_batch` (first-fit decreasing over the whole batch at once, no streaming).
`padding_fraction_within_budget` leaves out the oversize micro-steps: the part first-fit decreasing
controls; the rest is the last, partly filled chunk of each execution larger than the budget.

    gyre bench packing [--groups 32] [--group-size 16] [--token-budget 8192] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from gyre.config import PackerSection
from gyre.rl.advantages import MemberReward, MemberStatus, group_advantages
from gyre.rl.codec import decode_microstep, encode_microstep
from gyre.rl.microstep import MicroStep, row_chunks
from gyre.rl.packing import pack
from gyre.rl.stream import StreamPacker
from gyre.trajectory.row import TrajectoryRow

Group = tuple[list[TrajectoryRow], dict[str, float]]


def synthetic_batch(args: argparse.Namespace, rng: np.random.Generator) -> list[Group]:
    groups: list[Group] = []
    for g in range(args.groups):
        rows: list[TrajectoryRow] = []
        members: list[MemberReward] = []
        for k in range(args.group_size):
            eid = f"g{g}e{k}"
            draw = rng.random()
            if draw < 1 / 32:
                members.append(MemberReward(eid, MemberStatus.EXCLUDED))
                continue
            if draw < 1 / 32 + 1 / 64:
                members.append(MemberReward(eid, MemberStatus.PLACEHOLDER))
                continue
            members.append(MemberReward(eid, MemberStatus.VALID, float(rng.random())))
            scale = rng.lognormal(0.0, args.sigma)
            num_rows = min(int(rng.geometric(0.5)), args.j_max)
            for j in range(num_rows):
                n = int(
                    np.clip(
                        args.median_row_tokens * scale * rng.lognormal(0.0, args.sigma / 2),
                        64,
                        args.max_row_tokens,
                    )
                )
                targets = rng.random(n) < args.target_fraction
                targets[0] = False
                rows.append(
                    TrajectoryRow(
                        execution_id=eid,
                        trajectory_index=j,
                        leaf_class="main" if j == 0 else "sub_agent",
                        token_ids=rng.integers(0, 256, n, dtype=np.int32),
                        target_mask=targets,
                        behaviour_logprobs=np.where(targets, -rng.exponential(1.0, n), 0.0).astype(
                            np.float32
                        ),
                        policy_versions=np.where(targets, 0, -1).astype(np.int32),
                    )
                )
        groups.append((rows, group_advantages(members).advantages))
    return groups


def stream_pack(groups: list[Group], args: argparse.Namespace, num_batch_executions: int) -> list[MicroStep]:
    stream = StreamPacker(
        batch_id="bench",
        step=0,
        num_batch_executions=num_batch_executions,
        token_budget=args.token_budget,
        min_fill=args.min_fill,
    )
    steps: list[MicroStep] = []
    for rows, advantages in groups:
        steps.extend(stream.add(rows, advantages))
    steps.extend(stream.close())
    return steps


def packed_padding(steps: list[MicroStep], budget: int) -> float:
    capacity = sum(budget * max(1, len(row_chunks(s.cu_seqlens, budget))) for s in steps)
    return 1.0 - sum(s.num_tokens for s in steps) / capacity


def naive_microbatch_padding(lengths: list[int], budget: int) -> float:
    """Rows in arrival order; a micro-batch grows while (rows × its longest row) fits the budget."""
    padded = 0
    batch: list[int] = []
    for n in lengths:
        if batch and (len(batch) + 1) * max(*batch, n) > budget:
            padded += len(batch) * max(batch)
            batch = []
        batch.append(n)
    if batch:
        padded += len(batch) * max(batch)
    return 1.0 - sum(lengths) / padded


def main(argv: list[str]) -> None:
    packer = PackerSection()
    context = 4096  # the embedded demo model's max_position_embeddings
    parser = argparse.ArgumentParser(prog="gyre bench packing", description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=32, help="B: groups per batch")
    parser.add_argument("--group-size", type=int, default=16, help="N: executions per group")
    parser.add_argument("--j-max", type=int, default=packer.j_max, help="rows per execution at most")
    parser.add_argument("--token-budget", type=int, default=packer.microstep_tokens)
    parser.add_argument("--max-row-tokens", type=int, default=context)
    parser.add_argument("--median-row-tokens", type=int, default=context // 4)
    parser.add_argument("--sigma", type=float, default=1.0, help="log-normal shape of execution sizes")
    parser.add_argument("--target-fraction", type=float, default=0.25)
    parser.add_argument(
        "--min-fill", type=float, default=0.9, help="stream packer: emit micro-steps this full"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    groups = synthetic_batch(args, np.random.default_rng(args.seed))
    num_batch_executions = args.groups * args.group_size
    all_rows = [r for rows, _ in groups for r in rows]
    lengths = [r.num_tokens for r in all_rows]
    num_tokens = sum(lengths)

    times: list[float] = []
    steps: list[MicroStep] = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        steps = stream_pack(groups, args, num_batch_executions)
        times.append(time.perf_counter() - start)
    pack_s = statistics.median(times)

    blobs = [encode_microstep(s) for s in steps]
    encode_s, decode_s = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        blobs = [encode_microstep(s) for s in steps]
        encode_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        for b in blobs:
            decode_microstep(b)
        decode_s.append(time.perf_counter() - start)
    num_bytes = sum(len(b) for b in blobs)

    all_advantages = {e: a for _, adv in groups for e, a in adv.items()}
    whole = pack(
        all_rows, all_advantages, num_batch_executions=num_batch_executions, token_budget=args.token_budget
    )
    within = [s for s in steps if not s.oversize]
    result = {
        "groups": args.groups,
        "group_size": args.group_size,
        "token_budget": args.token_budget,
        "num_rows": len(all_rows),
        "num_tokens": num_tokens,
        "num_targets": sum(r.num_targets for r in all_rows),
        "row_tokens_p50": int(np.percentile(lengths, 50)),
        "row_tokens_p99": int(np.percentile(lengths, 99)),
        "num_microsteps": len(steps),
        "num_oversize_microsteps": sum(s.oversize for s in steps),
        "rows_per_s": round(len(all_rows) / pack_s, 1),
        "tokens_per_s": round(num_tokens / pack_s),
        "padding_fraction": round(packed_padding(steps, args.token_budget), 4),
        "padding_fraction_within_budget": round(packed_padding(within, args.token_budget), 4)
        if within
        else 0.0,
        "padding_fraction_whole_batch": round(packed_padding(whole, args.token_budget), 4),
        "padding_fraction_naive": round(1.0 - num_tokens / (len(lengths) * max(lengths)), 4),
        "padding_fraction_naive_microbatch": round(naive_microbatch_padding(lengths, args.token_budget), 4),
        "codec_bytes_per_token": round(num_bytes / num_tokens, 3),
        "codec_encode_mb_per_s": round(num_bytes / statistics.median(encode_s) / 1e6, 1),
        "codec_decode_mb_per_s": round(num_bytes / statistics.median(decode_s) / 1e6, 1),
    }
    print(json.dumps(result))
