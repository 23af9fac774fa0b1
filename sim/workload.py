"""The rollout workload: how long each execution runs, how it ends, and how many tokens it trains.

A query has a difficulty that scales all N executions of its group (executions of one query are
correlated). Difficulty is a lognormal body plus a *hard* component: a fraction of queries whose
executions run `hard_query_factor` times longer, so that most of them reach the harness timeout. The
reported NL2RepoBench statistics need that second mode — with one lognormal, 9.51% of queries past
4 h and a mean query of 2.96 h cannot hold together (see sim/README.md).

    natural duration  D = median · q · exp(σ_e·Z),   q = exp(σ_q·Z_q) · (H if hard else 1)
    D ≥ harness timeout T_h  →  stopped at T_h and still scored (harness timeout), or, for a share
                                r_o of them, killed at the overall budget T_o with no valid reward
    group ready       = max over members of (end + evaluation latency)
    trained tokens    = min(cap, tokens_per_hour · run hours); 0 for an overall timeout (excluded)

Sampling is deterministic per group: group g always draws the same values for a given seed, however
the groups are dispatched, so configurations compared under one seed see the same workload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

COMPLETED = 0
HARNESS_TIMEOUT = 1
OVERALL_TIMEOUT = 2
OUTCOME_NAMES = ("completed", "harness_timeout", "overall_timeout")

_BLOCK_GROUPS = 256
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class WorkloadModel:
    median_execution_h: float
    """Median natural duration of an execution of an ordinary query (hours)."""
    sigma_query: float
    """Lognormal spread of query difficulty among ordinary queries."""
    sigma_execution: float
    """Lognormal spread of one query's executions around its difficulty."""
    hard_query_fraction: float
    """Share of queries in the hard mode."""
    hard_query_factor: float
    """How much longer a hard query's executions run."""
    harness_timeout_h: float
    """T_h: the harness is stopped here; the workspace is preserved and scored."""
    overall_budget_h: float
    """T_o: the hard limit of an execution's overall budget (> T_h)."""
    overall_timeout_share: float
    """r_o: share of executions past T_h that are only stopped at T_o and yield no valid reward."""
    mean_evaluation_min: float
    """Mean evaluator latency after termination (exponential), minutes."""
    train_tokens_per_hour: float
    """Trained tokens (admitted trajectories, context included) per hour of execution."""
    max_train_tokens: float
    """Cap on one execution's trained tokens (J_max trajectories of at most the context window)."""

    def __post_init__(self) -> None:
        if self.overall_budget_h <= self.harness_timeout_h:
            raise ValueError("overall_budget_h must exceed harness_timeout_h")
        for name in ("hard_query_fraction", "overall_timeout_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1]; got {getattr(self, name)}")

    def sample_block(
        self, rng: np.random.Generator, num_groups: int, group_size: int, first_group: int = 0
    ) -> GroupBlock:
        """Draw `num_groups` groups (vectorized); the draw order is fixed so blocks are reproducible.
        Every group is alike here, so `first_group` (the index of the block's first group) is unused."""
        z_query = rng.standard_normal(num_groups)
        u_hard = rng.random(num_groups)
        z_exec = rng.standard_normal((num_groups, group_size))
        u_over = rng.random((num_groups, group_size))
        e_eval = rng.exponential(1.0, (num_groups, group_size))
        difficulty = np.exp(self.sigma_query * z_query) * np.where(
            u_hard < self.hard_query_fraction, self.hard_query_factor, 1.0
        )
        natural_h = self.median_execution_h * difficulty[:, None] * np.exp(self.sigma_execution * z_exec)
        long = natural_h >= self.harness_timeout_h
        over = long & (u_over < self.overall_timeout_share)
        run_h = np.where(long, np.where(over, self.overall_budget_h, self.harness_timeout_h), natural_h)
        outcome = np.where(over, OVERALL_TIMEOUT, np.where(long, HARNESS_TIMEOUT, COMPLETED))
        eval_h = np.where(over, 0.0, e_eval * self.mean_evaluation_min / 60.0)
        tokens = np.where(over, 0.0, np.minimum(self.max_train_tokens, self.train_tokens_per_hour * run_h))
        return GroupBlock(run_h=run_h, outcome=outcome, eval_h=eval_h, tokens=tokens)


class GroupSampler(Protocol):
    """What the simulator draws groups from: `WorkloadModel` (a paper preset's statistics) or
    `sim.local.MeasuredWorkload` (executions measured on this machine)."""

    def sample_block(
        self, rng: np.random.Generator, num_groups: int, group_size: int, first_group: int = 0
    ) -> GroupBlock:
        """Groups first_group .. first_group + num_groups - 1, drawn from `rng`."""
        ...


@dataclass(frozen=True, slots=True)
class GroupBlock:
    """Arrays of shape (groups, N)."""

    run_h: FloatArray
    outcome: npt.NDArray[np.int64]
    eval_h: FloatArray
    tokens: FloatArray


@dataclass(frozen=True, slots=True)
class GroupDraw:
    """One group's executions, as plain lists (seconds and token counts)."""

    run_s: list[float]
    outcome: list[int]
    eval_s: list[float]
    tokens: list[float]


class WorkloadStream:
    """Group g's draw, deterministic in (seed, g): block g // 256 comes from its own generator."""

    def __init__(self, model: GroupSampler, group_size: int, seed: int) -> None:
        self._model = model
        self._group_size = group_size
        self._seed = seed
        self._block_index = -1
        self._block: list[GroupDraw] = []

    def group(self, index: int) -> GroupDraw:
        block_index, offset = divmod(index, _BLOCK_GROUPS)
        if block_index != self._block_index:
            rng = np.random.default_rng([self._seed, block_index])
            b = self._model.sample_block(rng, _BLOCK_GROUPS, self._group_size, block_index * _BLOCK_GROUPS)
            run_s, eval_s = (b.run_h * 3600.0).tolist(), (b.eval_h * 3600.0).tolist()
            outcome, tokens = b.outcome.tolist(), b.tokens.tolist()
            self._block = [
                GroupDraw(run_s[i], outcome[i], eval_s[i], tokens[i]) for i in range(_BLOCK_GROUPS)
            ]
            self._block_index = block_index
        return self._block[offset]


@dataclass(frozen=True, slots=True)
class WorkloadStatistics:
    """The statistics the paper reports, measured on a sample of the model."""

    mean_execution_h: float
    harness_timeout_rate: float
    overall_timeout_rate: float
    mean_query_h: float
    query_over_4h: float
    longest_overall_timeout_rate: float
    """Share of queries whose longest execution ends in an overall timeout."""


def workload_statistics(
    model: WorkloadModel, group_size: int, *, num_groups: int, seed: int
) -> WorkloadStatistics:
    """Sample `num_groups` queries; a query's duration is its group's time to ready if all start together."""
    b = model.sample_block(np.random.default_rng(seed), num_groups, group_size)
    query_h = (b.run_h + b.eval_h).max(axis=1)
    longest = np.take_along_axis(b.outcome, b.run_h.argmax(axis=1)[:, None], axis=1)[:, 0]
    return WorkloadStatistics(
        mean_execution_h=float(b.run_h.mean()),
        harness_timeout_rate=float((b.outcome == HARNESS_TIMEOUT).mean()),
        overall_timeout_rate=float((b.outcome == OVERALL_TIMEOUT).mean()),
        mean_query_h=float(query_h.mean()),
        query_over_4h=float((query_h > 4.0).mean()),
        longest_overall_timeout_rate=float((longest == OVERALL_TIMEOUT).mean()),
    )
