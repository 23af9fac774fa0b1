"""`gyre bench faults`: the full fault matrix on one elastic run, and the invariants after each fault.

During one run of `--steps` steps (the demo tasks through the demo harness, K = 3 cells), one fault after
another, each once the previous one recovered: SIGKILL of scheduler, proxy, packer, evaluator, runner, a
satellite, the core (while it trains), nats-server and redis-server (the stack's supervisor restarts each),
a satellite SIGSTOPped for 10 s, and a verifier process stopped for good (the evaluator's timeout must
settle its execution). tests/faults runs a reduced matrix with the same code (app/demo/faults.py).

Last line: {"faults": {NAME: {"completed", "lost", "double_trained", "double_applied", "harness_errors",
"recovery_s", "injected"}}, "run": {the whole run's invariants from its events}, "audit": {"ok", "defects",
...: `gyre audit` of the run, from primary data}, "wall_s", ...}. A violation or harness error
belongs to the fault injected last before it; `recovery_s` is injection → the process serves again.
`redis_used_memory_by_step` / `redis_used_memory_ratio_last_vs_4`: Redis memory after each step and the
bounded-state ratio (goal ≤ 1.1; app/demo/memory.py); `redis_dataset_bytes_by_step` / `redis_keys_by_step`:
the keys and values alone, and their count, at the same samples. `--steps 12` for the 12-step figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

RUNNER_UIDS = 194000
"""Sandbox uids of their own (a runner kills every process of the uids it takes)."""


def matrix() -> list[Any]:
    from app.demo.faults import Fault

    return [
        Fault("scheduler", at_step=0),
        Fault("proxy", at_step=0),
        Fault("packer", at_step=0),
        Fault("evaluator", at_step=1),
        Fault("runner", at_step=1),
        Fault("satellite", at_step=1, when="any"),
        Fault("core", at_step=2, when="training"),
        Fault("nats", at_step=3),
        Fault("redis", at_step=3),
        Fault("satellite", at_step=4, when="any", action="stop", stop_s=10.0),
        Fault("evaluator", at_step=4, when="any", action="hang_verifier", name="verifier-hang"),
    ]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gyre bench faults", description=__doc__)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--only", default="", help="comma-separated fault names (default: all)")
    parser.add_argument("--tool-latency-s", type=float, default=3.0, help="median tool sleep of the harness")
    parser.add_argument("--tool-latency-max-s", type=float, default=10.0, help="cap of one tool sleep")
    parser.add_argument(
        "--uid-base",
        type=int,
        default=RUNNER_UIDS,
        help="first sandbox uid of the runner (the verifier's: +1000); another stack on the machine must not share them",
    )
    args = parser.parse_args(argv)
    runner_uids, verifier_uids = args.uid_base, args.uid_base + 1000

    from app.audit import audit_run
    from app.demo.config import demo_config
    from app.demo.faults import FaultInjector, fault_report
    from app.demo.ledger import read_event_lines
    from app.demo.run import DemoRun

    faults = [f for f in matrix() if not args.only or f.label() in args.only.split(",")]
    config = demo_config(
        None,
        {
            "run": {"id": time.strftime("bench-faults-%Y%m%d-%H%M%S")},
            "scheduler": {
                "num_cells": 3,
                "group_size": 2,
                "batch_groups": 2,
                "phi": 0.5,
                "mu": 2,
                "rho_min": 0.5,
                "tau_s": 0.2,
                "cell_capacity": 6,
            },
            "tasks": {"queries": ["add"]},
            "runner": {
                "harness_args": [
                    "--tool-latency-s",
                    str(args.tool_latency_s),
                    "--tool-latency-max-s",
                    str(args.tool_latency_max_s),
                ],
                "sandbox": {"uid_base": runner_uids},
            },
            # the built-in verifier times out after 30 s: the hung one is then retried or excluded
            "evaluator": {"sandbox": {"uid_base": verifier_uids}},
            # a checkpoint every other step: a core killed after an odd step replays it from its micro-steps
            "cell_agent": {"trainer": {"checkpoint_every_steps": 2}},
        },
    )
    injector = FaultInjector(
        config.run.path, faults, verifier_uids=range(verifier_uids, verifier_uids + 2000)
    )

    def progress(state: Any, elapsed_s: float) -> None:
        print(
            f"[faults {elapsed_s:5.0f}s] step {state.steps}/{args.steps} injected "
            f"{sum(bool(i.at_s) for i in injector.done)}/{len(faults)}",
            file=sys.stderr,
        )
        injector.progress(state, elapsed_s)

    t0 = time.monotonic()
    try:
        summary = DemoRun(config, steps=args.steps).execute(progress=progress)
    finally:
        injector.stop()
    report = fault_report(
        read_event_lines(Path(summary["run_dir"]) / "events.jsonl"), injector.done, args.steps
    )
    wall_s = time.monotonic() - t0
    audited = audit_run(Path(summary["run_dir"]), probe=False)
    print(
        json.dumps(
            {
                **report,
                "audit": {
                    "ok": audited.ok,
                    "defects": audited.defects,
                    "replay_max_rel_diff": audited.replay.to_json()["max_rel_diff"],
                    "accounting": audited.accounting.to_json(),
                },
                "wall_s": round(wall_s, 1),
                "steps": args.steps,
                "executions": summary["executions"],
                **{k: v for k, v in summary.items() if k.startswith("redis_")},  # RedisMemory.report
                "run_dir": str(Path(summary["run_dir"]).resolve()),
            }
        )
    )
