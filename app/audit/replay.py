"""Training replay: the run's weights recomputed from its initial weights and its recorded micro-steps.

    result = replay_training(data)          # data: app.audit.data.RunData

With the run's own trainer backend (`create_trainer` of the run's `cell_agent.trainer` section: the same
model code, objective, clipping, AdamW and LoRA as the cells), for every recorded step in order: each cell
of the reduction zeroes its gradient and accumulates its micro-steps in the order it recorded; the cells'
gradients are summed as the run's reduction summed them; one optimizer step. The weights are then compared with every weights
file the run kept for that version — the per-step record (`archive/weights/`), the checkpoints still on
disk (weights and optimizer state, read with the backend's own `load_checkpoint`) and the publications —
and the step's gradient norm with the one the core reported.

**The cells' sum** is added in the order the run's reduction added it (`reduction.py`: bit-exact so).

**Difference.** For two weight sets, each parameter tensor's ‖a − b‖₂ / ‖b‖₂; a step's difference is the
largest over the tensors (`max_rel_diff`). **Tolerance** (`TOLERANCE` = 1e-6): measured 0.0 (bit-exact) at
every step of a 12-step `make demo` run and of runs whose steps were reduced over three cells; 1e-6 leaves
room for a platform whose kernels are not deterministic, and sits at least 100 times below what one
micro-step applied twice or skipped does to a step (3.5e-4 at the least on that demo run).

**Sensitivity.** So that the tolerance means something, every step is also taken twice more on a copy of
the state, with its smallest micro-step's gradient added once more (a micro-step applied twice) and taken
out (skipped). Their differences from the true step are what one such defect does to the weights; the
audit requires the smallest of them to be at least `MARGIN` (100) times the tolerance, and reports them.

**The objective**, which the replay takes on trust: at every step each micro-step's gradient from the trainer
is also compared with the audit's own objective's (`gradients.py`). A replay that cannot run
(`not_replayable`) is a defect; only `--no-replay` (`replay=False`) leaves it out without one.

Record checks (named defects, before any arithmetic): a micro-step in two cells' lists or twice in one
(applied twice), a micro-step of an earlier step again, a list that differs from the step record's done
set, a payload of another batch or step, a gap in the steps.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from app.audit.corrections import border_log
from app.audit.data import AuditInputError, RunData
from app.audit.gradients import GRADIENT_DTYPE, GradientCheck, check_gradients
from app.audit.microsteps import ObjectiveResult
from app.audit.objective import ObjectiveSpec
from app.audit.reduction import gloo_reduce_sum
from gyre.model.arch import ModelError
from gyre.model.files import check_model_dir
from gyre.model.model_dir import ModelDir
from gyre.model.weights import load_state_dict
from gyre.rl.codec import decode_microstep
from gyre.rl.loss import ObjectiveParams
from gyre.rl.microstep import MicroStep
from gyre.store.step_archive import StepRecordFile, archived_weights, load_weights
from gyre.trainer.backends import TrainerBackend, TrainerSpec, create_trainer, trainer_class
from gyre.trainer.checkpoint import PUBLISHED_DIR, read_trainer_info

TOLERANCE = 1e-6
"""Largest `max_rel_diff` a replayed step (weights, or a checkpoint's optimizer state) may have from the
run's (see the module docstring for what was measured)."""
MARGIN = 100.0
"""The smallest sensitivity (one micro-step applied twice or skipped) must be this many tolerances."""

Weights = dict[str, torch.Tensor]


@dataclass(frozen=True, slots=True)
class Diff:
    max_rel_diff: float
    """max over tensors of ‖a − b‖₂ / ‖b‖₂."""
    tensor: str
    """The tensor where it is largest."""
    max_abs_diff: float


def weights_diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> Diff:
    """How far `a` is from `b` (same names and shapes; a KeyError / ValueError otherwise)."""
    if set(a) != set(b):
        missing, extra = sorted(set(b) - set(a))[:3], sorted(set(a) - set(b))[:3]
        raise ValueError(f"the weight sets differ in names: missing {missing}, unexpected {extra}")
    worst, worst_name, max_abs = 0.0, "", 0.0
    for name in sorted(b):
        x, y = a[name].detach().double().cpu(), b[name].detach().double().cpu()
        if x.shape != y.shape:
            raise ValueError(f"{name}: shape {tuple(x.shape)} against {tuple(y.shape)}")
        delta = float(torch.linalg.vector_norm(x - y))
        scale = float(torch.linalg.vector_norm(y))
        rel = delta / scale if scale > 0 else (0.0 if delta == 0 else float("inf"))
        if rel > worst or not worst_name:
            worst, worst_name = rel, name
        max_abs = max(max_abs, float((x - y).abs().max()) if x.numel() else 0.0)
    return Diff(worst, worst_name, max_abs)


@dataclass(slots=True)
class StepReplay:
    step: int
    version: int
    microsteps: int
    cells: tuple[int, ...]
    compared: dict[str, float] = field(default_factory=dict)
    """Reference ("archive", "checkpoint", "published") → max_rel_diff of the weights."""
    optimizer_diff: float | None = None
    """max_rel_diff of the checkpoint's optimizer state, when a checkpoint of this version exists."""
    grad_norm_run: float = 0.0
    grad_norm_replay: float = 0.0
    doubled_effect: float | None = None
    """max_rel_diff of the step with its smallest micro-step applied twice, from the true step."""
    skipped_effect: float | None = None
    seconds: float = 0.0

    @property
    def max_rel_diff(self) -> float | None:
        return max(self.compared.values()) if self.compared else None

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "version": self.version,
            "microsteps": self.microsteps,
            "cells": list(self.cells),
            "max_rel_diff": self.max_rel_diff,
            "compared": self.compared,
            "optimizer_max_rel_diff": self.optimizer_diff,
            "grad_norm_run": self.grad_norm_run,
            "grad_norm_replay": self.grad_norm_replay,
            "doubled_microstep_effect": self.doubled_effect,
            "skipped_microstep_effect": self.skipped_effect,
            "seconds": round(self.seconds, 2),
        }


@dataclass(slots=True)
class ReplayResult:
    steps: list[StepReplay] = field(default_factory=list)
    defects: list[str] = field(default_factory=list)
    skipped: str = ""
    """Why no replay ran (empty when it did)."""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        diffs = [s.max_rel_diff for s in self.steps if s.max_rel_diff is not None]
        effects = [
            e for s in self.steps for e in (s.doubled_effect, s.skipped_effect) if e is not None and e > 0
        ]
        return {
            "tolerance": TOLERANCE,
            "margin": MARGIN,
            "steps": len(self.steps),
            "max_rel_diff": max(diffs) if diffs else None,
            "max_rel_diff_by_step": [s.max_rel_diff for s in self.steps],
            "smallest_microstep_effect": min(effects) if effects else None,
            "by_step": [s.to_json() for s in self.steps],
            "skipped": self.skipped,
            "seconds": round(self.seconds, 1),
        }


class _State:
    """A copy of what the trainer keeps between steps (weights, gradients, optimizer state, version), to try
    a step, or read a checkpoint, and undo it. A torch optimizer's state is kept as its state dict (an
    optimizer's first step creates its state, so the set of its tensors changes); another backend's as the
    tensors of `state_tensors`."""

    def __init__(self, trainer: TrainerBackend) -> None:
        self.params = trainer.flat_params.detach().clone()
        self.grads = trainer.flat_grads.detach().clone()
        optimizer = getattr(trainer, "optimizer", None)
        self.optimizer = optimizer if isinstance(optimizer, torch.optim.Optimizer) else None
        self.optimizer_state = copy.deepcopy(self.optimizer.state_dict()) if self.optimizer else None
        self.tensors = [] if self.optimizer else [t.detach().clone() for t in trainer.state_tensors()]
        self.version = trainer.version

    def restore(self, trainer: TrainerBackend) -> None:
        with torch.no_grad():
            trainer.flat_params.copy_(self.params)
            trainer.flat_grads.copy_(self.grads)
            if self.optimizer is not None:
                self.optimizer.state.clear()
                self.optimizer.load_state_dict(copy.deepcopy(self.optimizer_state))
            else:
                for dst, src in zip(trainer.state_tensors(), self.tensors, strict=True):
                    dst.copy_(src)
        trainer.version = self.version


def _named_copy(trainer: TrainerBackend) -> Weights:
    return {k: v.detach().clone() for k, v in trainer.named_weights().items()}


def _optimizer_copy(trainer: TrainerBackend) -> Weights:
    tensors = trainer.state_tensors()[2:]  # after flat_params and flat_grads: the optimizer's own
    return {f"optimizer.{i}": t.detach().clone() for i, t in enumerate(tensors)}


def _ensure_world(needs_world: bool) -> None:
    """A backend that resolves its groups through torch.distributed gets a world of this process alone."""
    import torch.distributed as dist

    if needs_world and not dist.is_initialized():
        from gyre.trainer.collectives import host_store

        hosted = host_store(bind_host="127.0.0.1", port=0, world_size=1, timeout_s=60)
        dist.init_process_group("gloo", store=hosted.store, rank=0, world_size=1)


def build_trainer(data: RunData, *, dtype: str | None = None) -> TrainerBackend:
    """The run's trainer backend at its initial weights (version 0), as the core built it; with `dtype`, a
    copy in that dtype without an optimizer (the gradient check's, `gradients.py`)."""
    cfg = data.config
    section = cfg.cell_agent.trainer
    if dtype is not None:
        section = section.model_copy(update={"dtype": dtype})
    torch.set_num_threads(section.num_threads)
    _ensure_world(trainer_class(section.backend).needs_world)
    model = ModelDir.open(cfg.model).path
    objective = ObjectiveParams(**cfg.objective.model_dump())
    spec = TrainerSpec(section, model, objective, with_optimizer=dtype is None)
    return create_trainer(section.backend, spec)


def not_replayable(data: RunData) -> str:
    """Why this run's training cannot be recomputed exactly ('' when it can)."""
    lora = getattr(data.config.cell_agent.trainer, "lora", None)
    if lora is not None and float(getattr(lora, "dropout", 0.0)) > 0:
        return "cell_agent.trainer.lora.dropout > 0: the run drew dropout masks it did not record"
    if not data.config.archive.steps:
        return "archive.steps is false: the run kept no record of its micro-steps"
    return ""


def check_records(data: RunData) -> list[str]:
    """The named defects of the step records alone (no arithmetic)."""
    defects: list[str] = []
    seen: dict[str, int] = {}
    steps = [r.step for r in data.steps]
    expected = list(range(len(data.batches)))
    if steps != expected and data.config.archive.steps:
        defects.append(f"steps recorded {steps} are not the trained batches' steps {expected}")
    for r in data.steps:
        where: dict[str, list[int]] = {}
        for cell, ids in r.accumulated.items():
            for i in ids:
                where.setdefault(i, []).append(cell)
        for mid, cells in sorted(where.items()):
            if len(cells) > 1:
                defects.append(
                    f"step {r.step}: micro-step {mid} applied twice (accumulated by cells {sorted(cells)})"
                )
            if mid in seen:
                defects.append(f"step {r.step}: micro-step {mid} applied twice (already in step {seen[mid]})")
        for mid in where:
            seen.setdefault(mid, r.step)
        if set(where) != set(r.applied):
            defects.append(
                f"step {r.step}: the cells' gradients hold {sorted(set(where) - set(r.applied))} beyond the "
                f"step record's finished micro-steps, and miss {sorted(set(r.applied) - set(where))}"
            )
        missing = sorted(set(where) - set(r.payloads))
        if missing:
            defects.append(f"step {r.step}: no payload recorded for micro-steps {missing}")
        for mid, blob in sorted(r.payloads.items()):
            ms = decode_microstep(blob)
            if ms.batch_id != r.batch_id or ms.step != r.step:
                defects.append(
                    f"step {r.step}: micro-step {mid} belongs to batch {ms.batch_id!r} step {ms.step}"
                )
    return defects


def _references(data: RunData) -> tuple[dict[int, Path], dict[int, Path], dict[int, Path]]:
    """Version → archived weights file, checkpoint directory, publication directory."""
    section = data.config.cell_agent.trainer
    root = Path(section.checkpoint_dir or data.run_dir / "checkpoints")
    checkpoints: dict[int, Path] = {}
    published: dict[int, Path] = {}
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith("step-") and (p / "trainer.json").is_file():
                checkpoints[int(read_trainer_info(p)["policy_version"])] = p
        pub = root / PUBLISHED_DIR
        if pub.is_dir():
            for p in pub.iterdir():
                if p.name.startswith("v") and p.name[1:].isdigit():
                    published[int(p.name[1:])] = p
    return archived_weights(data.archive_dir), checkpoints, published


def _published_weights(trainer: TrainerBackend, path: Path) -> Weights:
    adapter = getattr(trainer, "adapter", None)
    dtype = trainer.flat_params.dtype
    if adapter is not None:
        from gyre.model.lora import read_adapter_dir

        return read_adapter_dir(path, trainer.arch, dtype).tensors()
    return load_state_dict(check_model_dir(path), dtype)


def _checkpoint_weights(trainer: TrainerBackend, path: Path) -> tuple[Weights, Weights]:
    """(weights, optimizer state) of a checkpoint, read by the backend's own `load_checkpoint`."""
    saved = _State(trainer)
    try:
        trainer.load_checkpoint(path)
        return _named_copy(trainer), _optimizer_copy(trainer)
    finally:
        saved.restore(trainer)


def _accumulate(trainer: TrainerBackend, steps: list[MicroStep]) -> torch.Tensor:
    trainer.zero_grads()
    for ms in steps:
        trainer.accumulate(ms)
    return trainer.flat_grads.detach().clone()


def _probe_gradient(trainer: TrainerBackend, decoded: dict[str, MicroStep]) -> torch.Tensor | None:
    """The gradient of the step's smallest micro-step (fewest tokens) whose gradient is not zero (one whose
    gradient is zero, e.g. every advantage 0, changes nothing applied twice or skipped); None if none."""
    for mid in sorted(decoded, key=lambda i: (decoded[i].num_tokens, i)):
        grads = _accumulate(trainer, [decoded[mid]])
        if bool(grads.any()):
            return grads
    return None


def _step_with(trainer: TrainerBackend, grads: torch.Tensor) -> float:
    with torch.no_grad():
        trainer.flat_grads.copy_(grads)
    return trainer.optimizer_step()


def replay_training(
    data: RunData,
    *,
    probe: bool = True,
    progress: Callable[[str], None] | None = None,
    objective: ObjectiveResult | None = None,
) -> ReplayResult:
    """Replay every recorded step (see the module docstring); defects name what does not match. With
    `objective`, each micro-step's gradient is also compared with the audit's objective's (its defects go
    there)."""
    t0 = time.monotonic()
    result = ReplayResult(defects=check_records(data))
    reason = not_replayable(data)
    if reason:
        result.skipped = reason
        result.defects.append(f"the training could not be replayed: {reason}")
        if objective is not None:
            objective.skipped = "no replay"
        return result
    if not data.steps:
        result.skipped = "the run recorded no optimizer step"
        return result
    import torch.distributed as dist

    world_before = dist.is_initialized()
    try:
        return _replay_steps(data, result, probe, progress, t0, objective)
    finally:  # a world this replay started (gloo, megatron's groups) ends with it: the caller's process goes on
        if not world_before and dist.is_initialized():
            dist.destroy_process_group()


def _replay_steps(
    data: RunData,
    result: ReplayResult,
    probe: bool,
    progress: Callable[[str], None] | None,
    t0: float,
    objective: ObjectiveResult | None,
) -> ReplayResult:
    try:
        trainer = build_trainer(data)
    except ModelError as e:
        raise AuditInputError(f"the run's initial weights do not load: {e}") from None
    gloo = data.config.cell_agent.trainer.dist_backend == "gloo"
    check = None
    if objective is not None:
        spec = ObjectiveSpec.of(data.config.objective)
        checker = build_trainer(data, dtype=GRADIENT_DTYPE)
        check = partial(
            check_gradients,
            checker,
            spec=spec,
            tolerance=TOLERANCE,
            result=objective,
            border=border_log(data.config.cell_agent.trainer.dtype),
            logged=data.step_metrics,
        )
    archived, checkpoints, published = _references(data)
    previous: Weights = _named_copy(trainer)
    for record in data.steps:
        if trainer.version != record.step:
            result.defects.append(
                f"step {record.step}: the replay holds version {trainer.version} (a step is missing before it)"
            )
            break
        began = time.monotonic()
        row = _replay_step(
            trainer, gloo, record, previous, probe, archived, checkpoints, published, result.defects, check
        )
        row.seconds = time.monotonic() - began
        result.steps.append(row)
        previous = _named_copy(trainer)
        if progress is not None:
            progress(
                f"step {record.step}: max_rel_diff {row.max_rel_diff} "
                f"(doubled {row.doubled_effect}, skipped {row.skipped_effect}) in {row.seconds:.1f} s"
            )
    for version in sorted(set(checkpoints) | set(published) | set(archived)):
        if version > len(result.steps) and not result.skipped:
            result.defects.append(
                f"weights of version {version} exist, but only {len(result.steps)} steps were recorded"
            )
    effects = [e for s in result.steps for e in (s.doubled_effect, s.skipped_effect) if e]
    if effects and min(effects) < MARGIN * TOLERANCE:
        result.defects.append(
            f"the smallest effect of one micro-step applied twice or skipped ({min(effects):.3g}) is under "
            f"{MARGIN:g} × the tolerance {TOLERANCE:g}: the replay could not tell such a defect from noise"
        )
    result.seconds = time.monotonic() - t0
    return result


def _replay_step(
    trainer: TrainerBackend,
    gloo: bool,
    record: StepRecordFile,
    previous: Weights,
    probe: bool,
    archived: dict[int, Path],
    checkpoints: dict[int, Path],
    published: dict[int, Path],
    defects: list[str],
    check: GradientCheck | None = None,
) -> StepReplay:
    decoded = {mid: decode_microstep(blob) for mid, blob in record.payloads.items()}
    row = StepReplay(record.step, record.version, len(decoded), record.cells, grad_norm_run=record.grad_norm)
    per_cell = [
        _accumulate(trainer, [decoded[i] for i in record.accumulated.get(cell, []) if i in decoded])
        for cell in record.cells
    ]
    total = gloo_reduce_sum(per_cell) if gloo else sum(per_cell[1:], per_cell[0])
    if check is not None:
        check(trainer.named_weights(), record, decoded)
    extra = _probe_gradient(trainer, decoded) if probe else None
    if extra is not None:
        before = _State(trainer)
        variants: dict[str, Weights] = {}
        for name, grads in (("doubled", total + extra), ("skipped", total - extra)):
            _step_with(trainer, grads)
            variants[name] = _named_copy(trainer)
            before.restore(trainer)
    row.grad_norm_replay = _step_with(trainer, total)
    now = trainer.named_weights()
    if extra is not None:
        row.doubled_effect = weights_diff(variants["doubled"], now).max_rel_diff
        row.skipped_effect = weights_diff(variants["skipped"], now).max_rel_diff
    version = record.version
    scale = max(abs(record.grad_norm), 1e-30)
    if abs(row.grad_norm_replay - record.grad_norm) / scale > 1e-3:
        defects.append(
            f"step {record.step}: gradient norm {row.grad_norm_replay:.6g} replayed, {record.grad_norm:.6g} "
            "reported by the core"
        )
    references: list[tuple[str, Callable[[], tuple[Weights, Weights | None]]]] = []
    if version in archived:
        references.append(("archive", lambda: (load_weights(archived[version]), None)))
    if version in checkpoints:
        references.append(("checkpoint", lambda: _checkpoint_weights(trainer, checkpoints[version])))
    if version in published:
        references.append(("published", lambda: (_published_weights(trainer, published[version]), None)))
    for name, read in references:
        weights, optimizer = read()
        diff = weights_diff(now, weights)
        row.compared[name] = diff.max_rel_diff
        if diff.max_rel_diff > TOLERANCE:
            stale = weights_diff(previous, weights).max_rel_diff <= TOLERANCE
            what = {
                "archive": "the step record's weights",
                "checkpoint": "the checkpoint",
                "published": "the publication",
            }[name]
            defects.append(
                f"step {record.step}: {what} of version {version} differs from the replay "
                f"(max_rel_diff {diff.max_rel_diff:.3g} in {diff.tensor}, tolerance {TOLERANCE:g})"
                + (
                    f"; it holds the weights of version {version - 1}: a {name} from the wrong step"
                    if stale
                    else ""
                )
            )
        if optimizer is not None:
            opt = weights_diff(_optimizer_copy(trainer), optimizer)
            row.optimizer_diff = opt.max_rel_diff
            if opt.max_rel_diff > TOLERANCE:
                defects.append(
                    f"step {record.step}: the checkpoint's optimizer state of version {version} differs from "
                    f"the replay's (max_rel_diff {opt.max_rel_diff:.3g}, tolerance {TOLERANCE:g})"
                )
    if not references:
        row.compared = {}
    return row
