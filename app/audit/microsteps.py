"""The recorded micro-steps against what the packer must have made of the trained groups (`recompute.py`),
and the report's `objective` part.

    result = check_microsteps(data, ledger.group_step)      # ObjectiveResult; the replay adds its gradients

A micro-step carries the tokens, target mask, behaviour log-probs, coefficients and advantages the cells
trained on, and the replay takes them as recorded; here each is recomputed from the evaluator's records,
each member's trajectory tree and the run's config (`packer.j_max`, `row_layout`, `normalize_std`,
`scheduler.seed`, `batch_groups` × `group_size` = B·N), and compared field by field:

- every execution of a micro-step: its advantage (within 1e-12), L_i (`execution_num_targets`), its
  coefficient 1/(L_i·B·N) at every target, and its rows one by one — count, length, `input_ids`,
  `target_mask` (a target the engine did not sample is named as such), `behaviour_logprobs` and
  `behaviour_versions` at the targets, and the layout (the token whose logits predict each token);
- every valid member of a trained group with admitted targets is in a micro-step of its group's step
  (the ledger names one trained twice or in another step), and no excluded member or placeholder is;
- the group outcome's reward of each member equals the evaluator's own (first) evaluation, which the
  advantages are recomputed from.

Each difference is a defect naming the step, the micro-step, the execution and its group, and the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.audit.data import GroupData, RunData
from app.audit.recompute import ExpectedRow, admit_paths, expected_rows, recompute_advantages
from gyre.rl.codec import decode_microstep
from gyre.rl.microstep import MicroStep
from services.packer.rows import admission_seed

ADVANTAGE_TOLERANCE = 1e-12
"""|recorded − recomputed| an advantage may have (relative above 1): the same float operations give the same
bits, this only absorbs a platform's libm."""


@dataclass(slots=True)
class ExpectedMember:
    """One member of a trained group as the packer must have packed it."""

    group_id: str
    step: int
    status: str
    advantage: float | None
    rows: list[ExpectedRow]

    @property
    def num_targets(self) -> int:
        return sum(r.num_targets for r in self.rows)


@dataclass(slots=True)
class ObjectiveResult:
    """The packer's work and the trainer's objective, recomputed (see also `gradients.py`)."""

    groups: int = 0
    executions: int = 0
    """Executions of the trained groups compared with the micro-steps."""
    microsteps: int = 0
    gradient_diff_by_step: list[float | None] = field(default_factory=list)
    """Per replayed step, the largest ‖g_trainer − g_audit‖ / ‖g_audit‖ over its micro-steps (None: none
    had a gradient)."""
    gradients_compared: int = 0
    mismatch_by_step: list[dict[str, Any]] = field(default_factory=list)
    """Per replayed step, the train/inference mismatch of its on-policy targets (`objective.Mismatch`)."""
    corrections_by_step: list[dict[str, Any]] = field(default_factory=list)
    """Per replayed step, each correction's clip and mask fractions and the trainer's logged ones
    (`corrections.StepCorrections`)."""
    skipped: str = ""
    """Why the gradients were not compared (empty when they were)."""
    defects: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        diffs = [d for d in self.gradient_diff_by_step if d is not None]
        return {
            "groups": self.groups,
            "executions": self.executions,
            "microsteps": self.microsteps,
            "gradients_compared": self.gradients_compared,
            "max_gradient_rel_diff": max(diffs) if diffs else None,
            "gradient_rel_diff_by_step": self.gradient_diff_by_step,
            "mismatch_by_step": self.mismatch_by_step,
            "mismatch_max_abs": max(
                (m["max_abs"] for m in self.mismatch_by_step if m["max_abs"] is not None), default=None
            ),
            "corrections_by_step": self.corrections_by_step,
            "corrections_logged_compared": sum(
                1 for c in self.corrections_by_step if c["logged"] is not None
            ),
            "skipped": self.skipped,
        }


def check_microsteps(data: RunData, group_step: dict[str, int]) -> ObjectiveResult:
    result = ObjectiveResult()
    expected = _expected(data, group_step, result)
    cfg = data.config.scheduler
    num_batch_executions = cfg.batch_groups * cfg.group_size
    found: dict[str, str] = {}
    for record in data.steps:
        for mid in sorted(record.payloads):
            ms = decode_microstep(record.payloads[mid])
            result.microsteps += 1
            for i, eid in enumerate(ms.execution_ids):
                member = expected.get(eid)
                if member is None or member.step != record.step:
                    continue  # the ledger names an execution of another step's group or of none
                found.setdefault(eid, mid)
                where = f"step {record.step} micro-step {mid}: execution {eid} (group {member.group_id})"
                result.defects.extend(
                    f"{where}: {d}" for d in compare_execution(ms, i, member, num_batch_executions)
                )
    for eid, member in expected.items():
        if member.status == "valid" and member.num_targets and eid not in found:
            result.defects.append(
                f"group {member.group_id} (step {member.step}): valid member {eid} ({member.num_targets} "
                "targets admitted) is in no micro-step"
            )
    result.executions = len(expected)
    return result


def _expected(
    data: RunData, group_step: dict[str, int], result: ObjectiveResult
) -> dict[str, ExpectedMember]:
    """Every member of the trained groups as the packer must have packed it."""
    packer = data.config.packer
    expected: dict[str, ExpectedMember] = {}
    for gid, step in sorted(group_step.items()):
        g = data.groups.get(gid)
        if g is None:
            continue  # the ledger names a trained group without a dispatch record
        result.groups += 1
        members = _resolved(g, result.defects)
        advantages = recompute_advantages(members, normalize_std=packer.normalize_std)
        for eid, (status, _) in members.items():
            rows = _admitted_rows(data, g, eid, result.defects) if status == "valid" else []
            expected[eid] = ExpectedMember(gid, step, status, advantages.get(eid), rows)
    return expected


def _admitted_rows(data: RunData, g: GroupData, eid: str, defects: list[str]) -> list[ExpectedRow]:
    """The rows of a valid member: its tree admitted and materialized (none when it has no tree)."""
    try:
        tree = data.tree(eid)
    except ValueError as e:
        defects.append(f"group {g.group_id}: the tree of {eid} does not read: {e}")
        return []
    if tree is None:
        if g.trees.get(eid):
            defects.append(f"group {g.group_id}: the run stored a tree for {eid}, and it is gone")
        return []
    packer = data.config.packer
    seed = admission_seed(data.config.scheduler.seed, eid)
    admitted = admit_paths(tree, j_max=packer.j_max, seed=seed)
    return expected_rows(tree, admitted, row_layout=packer.row_layout)


def _resolved(g: GroupData, defects: list[str]) -> dict[str, tuple[str, float]]:
    """Execution → (status, reward) of every resolved member: the reward of the evaluator's first evaluation
    (the one it resolved into the group), checked against the group outcome's."""
    members: dict[str, tuple[str, float]] = {}
    for eid in g.execution_ids:
        status = g.outcome.get(eid)
        if status is None:
            continue  # the accounting names a member of a trained group never resolved
        evaluations = g.evaluations.get(eid) or []
        reward = float(evaluations[0].get("reward", 0.0)) if evaluations else g.rewards.get(eid, 0.0)
        if eid in g.rewards and g.rewards[eid] != reward:
            defects.append(
                f"group {g.group_id}: member {eid}: the group outcome says reward {g.rewards[eid]!r}, the "
                f"evaluator's evaluation {reward!r}"
            )
        members[eid] = (status, reward)
    return members


def compare_execution(ms: MicroStep, i: int, member: ExpectedMember, num_batch_executions: int) -> list[str]:
    """What differs between execution `i` of `ms` and the member's recomputed rows (one line per field)."""
    if member.status != "valid":
        return [f"it is resolved {member.status}: it has no trainable rows, yet the micro-step trains it"]
    out: list[str] = []
    recorded, advantage = float(ms.advantages[i]), member.advantage
    if advantage is None or abs(recorded - advantage) > ADVANTAGE_TOLERANCE * max(1.0, abs(advantage)):
        out.append(
            f"advantages: {recorded!r} recorded, {advantage!r} recomputed from the evaluator's rewards"
        )
    num_targets = member.num_targets
    if int(ms.execution_num_targets[i]) != num_targets:
        out.append(
            f"execution_num_targets: {int(ms.execution_num_targets[i])} recorded, {num_targets} admitted"
        )
    targets = ms.target_mask & (ms.execution_index == i)
    coefficient = 1.0 / (num_targets * num_batch_executions) if num_targets else 0.0
    wrong = np.flatnonzero(targets & (ms.coefficients != coefficient))
    if len(wrong):
        out.append(
            f"coefficients: {float(ms.coefficients[wrong[0]])!r} at token {int(wrong[0])}, "
            f"1/(L_i·B·N) = 1/({num_targets}·{num_batch_executions}) = {coefficient!r} recomputed"
        )
    rows = [r for r in range(ms.num_rows) if int(ms.row_execution[r]) == i]
    if len(rows) != len(member.rows):
        return [*out, f"rows: {len(rows)} recorded, {len(member.rows)} admitted"]
    predecessors = ms.layout.predecessors()
    for k, (r, want) in enumerate(zip(rows, member.rows, strict=True)):
        a, b = int(ms.cu_seqlens[r]), int(ms.cu_seqlens[r + 1])
        found = [f"row {k}: {d}" for d in _compare_row(ms, a, b, predecessors, want)]
        out.extend(found)
        if found:
            break  # the rows after a differing one would repeat it
    return out


def _compare_row(ms: MicroStep, a: int, b: int, predecessors: np.ndarray, want: ExpectedRow) -> list[str]:
    if b - a != len(want.token_ids):
        return [f"length: {b - a} tokens recorded, {len(want.token_ids)} in the admitted paths"]
    out: list[str] = []
    if not np.array_equal(ms.input_ids[a:b], want.token_ids):
        out.append(
            f"input_ids: differ from the tree's at token {_first(ms.input_ids[a:b] != want.token_ids)}"
        )
        return out  # with other tokens, the masks and log-probs compare nothing meaningful
    mask = ms.target_mask[a:b]
    unsampled = mask & ~want.sampled
    if unsampled.any():
        out.append(
            f"target_mask: admits {int(unsampled.sum())} token(s) the engine did not sample (prompt or tool "
            f"tokens; first at token {_first(unsampled)})"
        )
    extra = mask & want.sampled & ~want.target_mask
    if extra.any():
        out.append(
            f"target_mask: admits {int(extra.sum())} sampled token(s) admission did not (first at token "
            f"{_first(extra)})"
        )
    missing = want.target_mask & ~mask
    if missing.any():
        out.append(
            f"target_mask: leaves out {int(missing.sum())} admitted target(s) (first at token "
            f"{_first(missing)})"
        )
    both = mask & want.target_mask
    logprobs = ms.behaviour_logprobs[a:b]
    if not np.array_equal(logprobs[both], want.behaviour_logprobs[both]):
        out.append(
            "behaviour_logprobs: differ from the tree's at token "
            f"{_first(both & (logprobs != want.behaviour_logprobs))}"
        )
    if ms.behaviour_versions is not None:
        versions = ms.behaviour_versions[a:b]
        if not np.array_equal(versions[both], want.versions[both]):
            out.append(
                "behaviour_versions: differ from the tree's at token "
                f"{_first(both & (versions != want.versions))}"
            )
    relative = np.where(predecessors[a:b] >= 0, predecessors[a:b] - a, -1)
    if not np.array_equal(relative, want.predecessors):
        out.append(
            f"layout: token {_first(relative != want.predecessors)} is predicted from another token than on "
            "its path"
        )
    return out


def _first(flags: Sequence[bool] | np.ndarray) -> int:
    return int(np.flatnonzero(np.asarray(flags))[0])
