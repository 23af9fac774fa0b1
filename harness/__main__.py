"""The demo harness: `python -m harness --prompt "3+5=? Write the answer to answer.txt."` in a workspace.

Reaches the model only through `ANTHROPIC_BASE_URL` + `ANTHROPIC_API_KEY` with the official
`anthropic` SDK. Works in the current directory. Prints one JSON report line on stdout at the end
(turns, calls, retries, compactions, sub-agents, final text). Exit status: 0 when the agent
finished (answered or ran out of turns), 3 when a model call failed for good, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from harness.agent import Agent
from harness.client import ModelCallError, ModelClient
from harness.latency import ToolLatency
from harness.tools import DEFAULT_TOOLS


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__.splitlines()[0])
    p.add_argument("--task", default="", help="task id, for the report (the prompt comes with --prompt)")
    p.add_argument("--prompt", default=None, help="the task prompt (required)")
    p.add_argument("--workspace", type=Path, default=Path("."), help="directory the tools act in")
    p.add_argument("--model", default="gyre-embedded", help="model name sent in requests")
    p.add_argument("--max-tokens", type=int, default=512, help="max_tokens of a call")
    p.add_argument("--max-turns", type=int, default=16, help="calls per agent before it stops")
    p.add_argument("--context-budget", type=int, default=16_000, help="tokens before compaction")
    p.add_argument("--tools", default=None, help="comma-separated tool names (default: the task's, else all)")
    p.add_argument("--retries", type=int, default=4, help="retries of a failed call")
    p.add_argument("--backoff-s", type=float, default=0.5, help="first retry delay (doubles)")
    p.add_argument("--no-stream", action="store_true", help="non-streaming calls")
    p.add_argument("--tool-latency-s", type=float, default=0.0, help="median tool sleep (0 = off)")
    p.add_argument("--tool-latency-alpha", type=float, default=1.5, help="Pareto shape of tool sleeps")
    p.add_argument("--tool-latency-max-s", type=float, default=600.0, help="cap of one tool sleep")
    p.add_argument("--seed", type=int, default=0, help="seed of retry jitter and tool sleeps")
    return p.parse_args(argv)


def resolve_task(args: argparse.Namespace) -> tuple[str, tuple[str, ...]]:
    """The prompt and the tools the agent gets (the runner passes both; the task id only labels the
    report: the harness knows nothing of Gyre's tasks)."""
    tools = tuple(t for t in args.tools.split(",") if t) if args.tools is not None else None
    if args.prompt is None:
        raise ValueError("give --prompt (the runner passes the task's prompt)")
    return str(args.prompt), tools or DEFAULT_TOOLS


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        prompt, tools = resolve_task(args)
        client = ModelClient(
            model=args.model,
            max_tokens=args.max_tokens,
            stream=not args.no_stream,
            max_retries=args.retries,
            backoff_s=args.backoff_s,
            seed=args.seed,
        )
        latency = ToolLatency(
            args.tool_latency_s, args.tool_latency_alpha, args.tool_latency_max_s, args.seed
        )
        agent = Agent(
            client,
            args.workspace,
            tools=tools,
            context_budget_tokens=args.context_budget,
            max_turns=args.max_turns,
            latency=latency,
        )
    except (ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if "ANTHROPIC_BASE_URL" not in os.environ:
        print(
            "warning: ANTHROPIC_BASE_URL is not set; the SDK will call its default endpoint", file=sys.stderr
        )
    try:
        report = agent.run(prompt)
        status = 0
    except ModelCallError as e:
        print(f"error: {e}", file=sys.stderr)
        report, status = agent.report, 3
    out = {**asdict(report), **asdict(client.stats), "tool_sleep_s": round(latency.total_s, 3)}
    print(json.dumps(out))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
