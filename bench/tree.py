"""`gyre bench tree`: trajectory-tree insert cost against history length, storage, admission speed.

    gyre bench tree [--repeats 40] [--quick]

Insert = `prepare` + `commit` of one model call whose history already lies in the tree plus one
new message (a ~1,700-token tool result) and a ~300-token output, with the demo model's template (byte tokens, compact ChatML)
(byte-level: one token per byte). Measured at 10k and 1M history tokens; the goal is that the 1M
insert costs at most twice the 10k one (cost ∝ new content, plus one dictionary step per history
message). The history echoes each output the way Claude Code does (tool input re-serialized, so
every call restores one tool call). Requests are built from persistent `Message` objects, as the
proxy's converter would hand them over (conversion is not part of the insert). Building the prompt ids for the
engine is O(history) by nature and is reported apart (`input_ids_us_p50_at_1m`).

Storage: `bytes_per_unique_token` is the encoded size of all nodes (the Redis form) per unique
token; `memory_bytes_per_unique_token` the in-memory arrays. Admission: an execution shaped like
the paper's Appendix C case (main agent and sub-agent each compacting, retries, ~10 leaves);
`admission_tokens_per_s` = tokens of the admitted rows per second of `admit` + `materialize`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

import numpy as np

from gyre.trajectory import (
    CallMeta,
    Message,
    ModelRequest,
    TrajectoryTree,
    admit,
    encode_node,
    get_profile,
    materialize,
    template_for_family,
)
from gyre.trajectory.messages import Api, TextBlock, ToolResultBlock, ToolSpec, ToolUseBlock
from gyre.trajectory.stats import tree_stats

IM_END, CALL_START, CALL_END = 258, 259, 260
TOOLS = (
    ToolSpec(
        "Bash", "Run a shell command.", {"type": "object", "properties": {"command": {"type": "string"}}}
    ),
)
RESULT_TOKENS = 1700
OUTPUT_TOKENS = 300


class Session:
    """One agent's conversation, recorded call by call in a tree."""

    def __init__(
        self, tree: TrajectoryTree, system: str, rng: random.Random, headers: dict[str, str] | None = None
    ):
        self.tree, self.system, self.rng, self.headers = tree, system, rng, headers or {}
        self.messages: list[Message] = [Message.text("user", "Task: " + _text(rng, 200))]
        self.history_tokens = 0

    def request(self, extra: list[Message] | None = None) -> ModelRequest:
        messages = tuple(self.messages + (extra or []))
        return ModelRequest(Api.ANTHROPIC, (self.system,), messages, TOOLS, headers=self.headers)

    def call(self, extra: list[Message] | None = None, keep: bool = True) -> float:
        """One model call; returns its insert time in µs; with `keep` the harness continues from it."""
        request = self.request(extra)
        ids = _output_ids(self.rng)
        logprobs = np.full(len(ids), -0.1, dtype=np.float32)
        start = time.perf_counter()
        prepared = self.tree.prepare(request)
        result = self.tree.commit(prepared, ids, logprobs, CallMeta(request_id="b", policy_version=1))
        elapsed_us = (time.perf_counter() - start) * 1e6
        if keep:
            assert result.output is not None
            self.messages += [*(extra or []), _echo(result.output.to_message())]
            call_id = result.output.tool_calls[0].id
            self.messages.append(Message("user", (ToolResultBlock(call_id, _text(self.rng, RESULT_TOKENS)),)))
            self.history_tokens = len(prepared.input_ids) + len(ids)
        return elapsed_us

    def compact(self) -> None:
        last = self.messages[-1]
        summary = last.replace_blocks(
            (*last.blocks, TextBlock("CRITICAL: Respond with TEXT ONLY. Summarize."))
        )
        self.messages[-1] = summary
        self.call(keep=False)
        self.messages = [
            Message.text("user", "This session is being continued from a previous conversation. ")
        ]


def _echo(message: Message) -> Message:
    """The output as Claude Code echoes it: tool input re-serialized (keys reordered), raw payload gone."""
    blocks = tuple(
        ToolUseBlock(b.id, b.name, dict(reversed(list(b.input.items()))))
        if isinstance(b, ToolUseBlock)
        else b
        for b in message.blocks
    )
    return message.replace_blocks(blocks)


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz     \n") for _ in range(n))


def _output_ids(rng: random.Random) -> list[int]:
    arguments = {
        "description": _text(rng, 20).replace("\n", " "),
        "command": _text(rng, 40).replace("\n", " "),
    }
    payload = json.dumps({"name": "Bash", "arguments": arguments})
    text = _text(rng, OUTPUT_TOKENS - len(payload) - 3)
    return [*text.encode(), CALL_START, *payload.encode(), CALL_END, IM_END]


def measure_insert(history_tokens: int, repeats: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    tree = TrajectoryTree("bench", template_for_family("chatml"), get_profile("generic"))
    session = Session(tree, "You are a coding agent. " + _text(rng, 2000), rng)
    while session.history_tokens < history_tokens:
        session.call()
    times, id_times = [], []
    for _ in range(repeats):
        extra = [Message.text("user", _text(rng, RESULT_TOKENS))]
        times.append(session.call(extra, keep=False))
        prepared = tree.prepare(session.request(extra))
        start = time.perf_counter()
        _ = prepared.input_ids
        id_times.append((time.perf_counter() - start) * 1e6)
    nodes = list(tree.nodes.values())
    stats = tree_stats(tree)
    encoded = sum(len(encode_node(n)) for n in nodes)
    memory = sum(
        n.token_ids.nbytes + (n.sampled.nbytes if n.sampled is not None else 0) + n.logprobs.nbytes
        for n in nodes
    )
    return {
        "history_tokens": session.history_tokens,
        "history_messages": len(session.messages),
        "insert_us_p50": statistics.median(times),
        "input_ids_us_p50": statistics.median(id_times),
        "bytes_per_unique_token": encoded / stats.unique_tokens,
        "memory_bytes_per_unique_token": memory / stats.unique_tokens,
    }


def appendix_c_tree(seed: int) -> TrajectoryTree:
    """Main agent and a sub-agent, each compacting once, with retries: ~10 leaves, ~600 requests."""
    rng = random.Random(seed)
    tree = TrajectoryTree("appendix-c", template_for_family("chatml"), get_profile("generic"))
    main = Session(tree, "You are the main agent.", rng)
    sub = Session(tree, "You are a sub-agent.", rng, {"x-gyre-agent": "sub"})
    for i in range(330):
        if i in (40, 120, 200, 290):
            main.call(keep=False)  # a retried call: its first output stays a leaf
        main.call()
        if i == 168:
            main.compact()
        if 60 <= i < 320:
            if i in (100, 250):
                sub.call(keep=False)
            sub.call()
            if i == 60 + 193:
                sub.compact()
    return tree


def measure_admission(seed: int, repeats: int) -> dict[str, Any]:
    tree = appendix_c_tree(seed)
    stats = tree_stats(tree)
    admit_s, rows_s, tokens = [], [], 0
    for r in range(repeats):
        start = time.perf_counter()
        admitted = admit(tree, j_max=5, seed=r)
        mid = time.perf_counter()
        rows = materialize(tree, admitted)
        end = time.perf_counter()
        admit_s.append(mid - start)
        rows_s.append(end - mid)
        tokens = sum(row.num_tokens for row in rows)
    total = statistics.median(admit_s) + statistics.median(rows_s)
    return {
        "appendix_c_nodes": stats.num_nodes,
        "appendix_c_leaves": sum(stats.leaves_by_class.values()),
        "appendix_c_unique_tokens": stats.unique_tokens,
        "appendix_c_expanded_tokens": stats.expanded_tokens,
        "admit_ms_p50": statistics.median(admit_s) * 1e3,
        "materialize_ms_p50": statistics.median(rows_s) * 1e3,
        "admitted_row_tokens": tokens,
        "admission_tokens_per_s": tokens / total,
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gyre bench tree")
    parser.add_argument("--repeats", type=int, default=40, help="inserts measured per history size")
    parser.add_argument("--quick", action="store_true", help="100k instead of 1M history tokens (smoke run)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    large = 100_000 if args.quick else 1_000_000
    small = measure_insert(10_000, args.repeats, args.seed)
    big = measure_insert(large, args.repeats, args.seed)
    admission = measure_admission(args.seed, repeats=5)
    print(
        json.dumps(
            {
                "insert_us_p50_at_10k": round(small["insert_us_p50"], 1),
                "insert_us_p50_at_1m": round(big["insert_us_p50"], 1),
                "insert_cost_ratio_1m_vs_10k": round(big["insert_us_p50"] / small["insert_us_p50"], 3),
                "bytes_per_unique_token": round(big["bytes_per_unique_token"], 3),
                "admission_tokens_per_s": round(admission["admission_tokens_per_s"]),
                "history_tokens_small": small["history_tokens"],
                "history_tokens_large": big["history_tokens"],
                "history_messages_large": big["history_messages"],
                "input_ids_us_p50_at_1m": round(big["input_ids_us_p50"], 1),
                "memory_bytes_per_unique_token": round(big["memory_bytes_per_unique_token"], 3),
                **{
                    k: round(v, 3) if isinstance(v, float) else v
                    for k, v in admission.items()
                    if k != "admission_tokens_per_s"
                },
                "repeats": args.repeats,
            }
        )
    )
