"""The whole system for 2 optimizer steps in elastic mode: NATS, Redis, the six services, K = 3
cell agents, the demo harness in sandboxes, real model calls through the proxy.

The run is shaped so that elasticity is exercised: groups become ready at different times (seeded
heavy-tailed tool sleeps), the core joins training while executions are live, and a satellite joins
a batch the core is already in. Asserted from the run's stored events; every listener of the run is
polled meanwhile (loopback only, at every moment). The models: the demo's warm
start (sampled), a tiny random Qwen3-MoE made by `gyre model init` whose engines emit a scripted
write_file call with the model's own log-probs (`scored_script`), its published weights then loaded by
`transformers`, and the same on a tiny Qwen3 training a LoRA adapter: satellites pull the adapter and
`peft` loads its publication.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import peft
import pytest
import torch
import transformers

from app.demo.config import demo_config
from app.demo.run import DemoRun
from gyre.metrics.steps import scalars
from gyre.model.files import check_model_dir
from gyre.model.init import init_model_dir
from gyre.model.weights import load_model
from gyre.trainer.checkpoint import latest_checkpoint, read_adapter_checkpoint
from gyre.trajectory.archive import archived_trees, load_archived_tree
from tests.support.audit import assert_audited
from tests.support.listeners import polling_listeners
from tests.support.tensorboard import read_scalars

pytestmark = pytest.mark.slow

GYRE = [sys.executable, "-c", "from app.cli import main; main()"]
WRITE_8 = (
    '<tool_call>\n{"name": "write_file", "arguments": {"path": "answer.txt", "content": "8"}}\n</tool_call>'
)
"""The tiny model's scripted call, in Qwen3's Hermes format (every `add/` task asks for answer.txt)."""


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


SHAPE: dict[str, Any] = {
    "scheduler": {
        "num_cells": 3,
        "group_size": 2,
        "batch_groups": 3,
        "phi": 1 / 3,
        "mu": 2,
        "rho_min": 1 / 3,
        "tau_s": 0.2,
        "cell_capacity": 10,
    },
    "tasks": {"queries": ["add"]},
    "runner": {"harness_args": ["--tool-latency-s", "6", "--tool-latency-max-s", "40"]},
}


def test_two_elastic_steps_with_a_satellite_joining_mid_batch(tmp_path: Path) -> None:
    """Also: nothing of the embedded default listens outside loopback at any moment of the run — every
    listener of this process's tree is polled while the core trains and a satellite joins it, pulling
    the core's snapshot (servers, services, engines, the rendezvous store, the torch weight transport)."""
    config = demo_config(None, {"run": {"id": "e2e", "dir": str(tmp_path / "runs")}, **SHAPE})
    with polling_listeners(os.getpid()) as poll:
        summary, events = _run_with_status(config, tmp_path)
    _assert_elastic(summary, events)
    assert_audited(config.run.path, steps=2)
    assert poll.bad == [], f"listening outside loopback: {sorted(set(poll.bad))}"
    assert len(poll.seen) >= 10, poll.seen  # servers, services, engines, the rendezvous store were all seen
    joins = [
        e["time_s"]
        for e in events
        if e["type"] == "gyre.v1.RoleTransitionCompleted"
        and e["event"].get("cell", 0) > 0
        and e["event"].get("toRole") == "CELL_ROLE_TRAINING"
    ]
    steps = [e["time_s"] for e in events if e["type"] == "gyre.v1.StepCompleted"]
    # Polls ran while a satellite had just pulled the snapshot and the cells trained towards the next step.
    assert any(joins[0] - 1.0 <= t <= max(steps) for t in poll.polls)


def _tiny_config(tmp_path: Path, run_id: str, model_dir: Path, trainer: dict[str, Any] | None = None) -> Any:
    """A run on a tiny model made by `gyre model init` whose engines emit a scripted write_file call with
    the model's own log-probs (`scored_script`)."""
    script = tmp_path / "script.jsonl"
    script.write_text("\n".join(json.dumps({"text": t}) for t in (WRITE_8, "Done.")) + "\n")
    return demo_config(
        None,
        {
            "run": {"id": run_id, "dir": str(tmp_path / "runs")},
            "model": {"path": str(model_dir)},
            "cell_agent": {
                "engine": {
                    "output_source": "scored_script",
                    "script_file": str(script),
                    "script_repeat": True,
                },
                "trainer": trainer or {},
            },
            **SHAPE,
        },
    )


def test_two_elastic_steps_on_a_tiny_qwen3_moe_and_its_publication_loads_in_transformers(
    tmp_path: Path,
) -> None:
    """Full fine-tuning of a mixture-of-experts model (Qwen3's attention, every layer sparse: this run
    stands for dense Qwen3 too, whose MLP the unit tests compare with transformers), with routing replay
    on: the engines return each token's experts, the trees keep them (archived with them), micro-steps
    carry them and the trainer replays them (a micro-step without them would fail its step), and the
    audit's replay of the gradients routes as the trainer did."""
    model_dir = init_model_dir(tmp_path / "qwen3-moe-tiny", arch="qwen3_moe", size="tiny", seed=0)
    config = _tiny_config(tmp_path, "e2emoe", model_dir, {"routing_replay": True})
    assert config.proxy.record_routed_experts
    summary, events = _run_with_status(config, tmp_path)
    _assert_elastic(summary, events)
    assert_audited(config.run.path, steps=2)
    trees = [load_archived_tree(path) for path in archived_trees(config.run.path).values()]
    outputs = [n for t in trees for n in t.nodes.values() if n.num_sampled]
    assert outputs and all(n.routed_experts is not None for n in outputs)
    published = config.run.path / "checkpoints" / "published" / "v00000002"
    assert check_model_dir(published).policy_version == 2
    checkpoint = latest_checkpoint(config.run.path / "checkpoints")
    assert checkpoint is not None and checkpoint.name == "step-00000002"
    trainer = load_model(checkpoint)  # the core's own weights after step 2
    hf = transformers.AutoModelForCausalLM.from_pretrained(published, dtype=torch.float32).eval()
    assert type(hf).__name__ == trainer.arch.architecture
    ids = torch.arange(100, 164)
    with torch.no_grad():
        ours = trainer(ids, torch.arange(64), [0, 64])
        theirs = hf(ids[None]).logits[0]
    assert float((ours - theirs).abs().max()) <= 1e-5
    initial = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        assert float((initial(ids[None]).logits[0] - theirs).abs().max()) > 1e-6, (
            "two steps changed the weights"
        )


def test_two_elastic_steps_training_a_lora_adapter_on_a_tiny_qwen3(tmp_path: Path) -> None:
    """LoRA: satellites pull the adapter alone (its bytes, not the model's), and the published PEFT
    directory, loaded by peft on transformers, gives the trainer's logits. (Which engines load version 2
    depends on where the cells are when the burst ends; engines serving a publication by name:
    tests/unit/cell_agent/test_publication.py, tests/unit/proxy/test_lora_routing.py.)"""
    model_dir = init_model_dir(tmp_path / "qwen3-tiny", arch="qwen3", size="tiny", seed=0)
    lora = {"rank": 8, "alpha": 16.0, "target_modules": ["all-linear"]}
    config = _tiny_config(tmp_path, "e2elora", model_dir, {"lora": lora, "lr": 1e-3})
    summary, events = _run_with_status(config, tmp_path)
    _assert_elastic(summary, events)
    assert_audited(config.run.path, steps=2)  # the adapter's steps replayed with the run's own trainer
    published = config.run.path / "checkpoints" / "published" / "v00000002"
    assert sorted(p.name for p in published.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    checkpoint = latest_checkpoint(config.run.path / "checkpoints")
    assert checkpoint is not None and checkpoint.name == "step-00000002"
    base = load_model(model_dir)
    adapter, optimizer, version = read_adapter_checkpoint(checkpoint, base.arch)
    assert version == 2 and optimizer is not None and adapter.spec.rank == 8
    adapter_bytes = adapter.num_bytes()
    pulls = [
        line
        for path in (config.run.path / "logs").glob("cell_agent*")
        for line in map(json.loads, path.read_text().splitlines())
        if line.get("event") == "snapshot_pulled"
    ]
    assert pulls and all(p["nbytes"] == adapter_bytes for p in pulls), pulls
    assert adapter_bytes * 10 < base.arch.num_parameters() * 4, "a pull is the adapter, not the model"

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    theirs_model = peft.PeftModel.from_pretrained(hf, str(published)).eval()
    ids = torch.arange(100, 164)
    with torch.no_grad():
        ours = base(ids, torch.arange(64), [0, 64], lora=adapter)
        theirs = theirs_model(input_ids=ids[None]).logits[0]
        initial = base(ids, torch.arange(64), [0, 64])
    assert float((ours - theirs).abs().max()) <= 1e-5
    assert float((initial - theirs).abs().max()) > 1e-6, "two steps changed the adapter"


def _run_with_status(config: Any, tmp_path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    status_file = tmp_path / "status.yaml"
    status_file.write_text(f"run:\n  id: {config.run.id}\n  dir: {tmp_path / 'runs'}\n")
    status_outputs: list[str] = []

    def progress(state: Any, elapsed_s: float) -> None:
        if not status_outputs and state.counters.started > state.counters.finished:
            out = subprocess.run(
                [*GYRE, "status", "--config", str(status_file)], capture_output=True, text=True, timeout=60
            )
            status_outputs.append(out.stdout)

    summary = DemoRun(config, steps=2).execute(progress=progress)
    # `gyre status` during the run shows roles, waterlevel and counters.
    # (The roles are whatever they are at that moment: the first burst may have begun already.)
    assert status_outputs and "waterlevel" in status_outputs[0], status_outputs
    role = "(rollout|draining|training)"  # a cell caught mid-switch is draining (seen in CI)
    cells = [line for line in status_outputs[0].splitlines() if line.startswith("cells")]
    assert cells and re.fullmatch(rf"cells +0:{role} 1:{role} 2:{role}", cells[0]), cells or status_outputs
    assert "dispatched" in status_outputs[0] and "SERVING" in status_outputs[0]
    assert "history mismatches" in status_outputs[0] and "recorded calls" in status_outputs[0]
    _assert_step_metrics(config.run.path, num_groups=config.scheduler.batch_groups)
    return summary, _events(config.run.path)


STEP_FIELDS = (
    "reward_mean",
    "reward_std",
    "loss",
    "clip_fraction",
    "token_ratio_min",
    "token_ratio_mean",
    "token_ratio_max",
    "sequence_ratio_min",
    "sequence_ratio_mean",
    "sequence_ratio_max",
    "grad_norm",
    "num_tokens",
    "num_target_tokens",
    "admitted_trajectories",
    "admitted_target_tokens",
    "staleness_mean",
    "staleness_max",
    "step_s",
    "groups",
)


def _assert_step_metrics(run_dir: Path, num_groups: int) -> None:
    """`metrics.jsonl` has one row per optimizer step with every training metric, and the TensorBoard event
    files hold the same scalars (read back)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert set(STEP_FIELDS) <= set(r), set(STEP_FIELDS) - set(r)
        assert r["num_tokens"] >= r["num_target_tokens"] >= 0 and r["step_s"] > 0 and r["grad_norm"] >= 0
        assert 0 <= r["clip_fraction"] <= 1 and 0 <= r["reward_mean"] <= 1 and r["reward_std"] >= 0
        assert sum(r["admitted_target_tokens"].values()) == r["num_target_tokens"]
        if r["num_target_tokens"]:  # ratios exist only for a step that trained targets
            for kind in ("token", "sequence"):
                assert 0 < r[f"{kind}_ratio_min"] <= r[f"{kind}_ratio_mean"] <= r[f"{kind}_ratio_max"]
        else:
            assert r["token_ratio_mean"] is None and r["sequence_ratio_mean"] is None
        assert len(r["groups"]) == num_groups and all(0 <= g["reward_mean"] <= 1 for g in r["groups"])
        assert all(
            {"reward_mean", "reward_std", "staleness", "num_trajectories"} <= set(g) for g in r["groups"]
        )
        assert r["staleness_max"] == max(g["staleness"] for g in r["groups"])
    tensorboard = read_scalars(run_dir / "tensorboard")
    for r in rows:
        expected = scalars(r)
        assert {"loss", "reward_mean", "grad_norm", "clip_fraction"} <= set(expected)
        for tag, value in expected.items():
            assert tensorboard[tag][r["step"]] == pytest.approx(value, rel=1e-6, abs=1e-6), tag


def _assert_elastic(summary: dict[str, Any], events: list[dict[str, Any]]) -> None:
    assert summary["steps"] == 2
    ex = summary["executions"]
    assert ex["trained"] >= 2 * 3 * 2 - ex["excluded"] - ex["placeholder"]
    assert summary["harness_errors_during_transitions"] == 0
    terminated = [e["event"] for e in events if e["type"] == "gyre.v1.ExecutionTerminated"]
    assert terminated and all(
        t.get("reason") in ("TERMINATION_REASON_COMPLETED", "TERMINATION_REASON_CANCELLED")
        for t in terminated
    )

    # A role switch while executions were live: some harness was running when the core began to drain.
    running, live_switches = 0, 0
    for e in events:
        if e["type"] == "gyre.v1.ExecutionStarted":
            running += 1
        elif e["type"] == "gyre.v1.ExecutionTerminated":
            running -= 1
        elif e["type"] == "gyre.v1.RoleTransitionBegun" and e["event"].get("toRole") == "CELL_ROLE_TRAINING":
            live_switches += running > 0
    assert live_switches >= 1

    # A satellite joined a batch mid-way: its switch to training completed after the batch had
    # started packing, and it took part in that batch's step.
    first_packed: dict[str, float] = {}
    for e in events:
        if e["type"] == "gyre.v1.GroupPacked":
            first_packed.setdefault(e["event"]["batchId"], e["time_s"])
    steps = {e["event"]["batchId"]: e for e in events if e["type"] == "gyre.v1.StepCompleted"}
    joined = [
        e
        for e in events
        if e["type"] == "gyre.v1.RoleTransitionCompleted"
        and e["event"].get("cell", 0) > 0
        and e["event"].get("toRole") == "CELL_ROLE_TRAINING"
    ]
    mid_batch = [
        (j["event"]["cell"], batch)
        for j in joined
        for batch, step in steps.items()
        if first_packed.get(batch, float("inf")) < j["time_s"] < step["time_s"]
        and j["event"]["cell"] in step["event"].get("cells", [])
    ]
    assert mid_batch, f"no satellite joined a batch in flight; joins at {[j['time_s'] for j in joined]}"
    assert summary["transitions"]["count"] >= 2
