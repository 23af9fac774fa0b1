"""Cell-agent metrics on `/metrics` (`gyre_cell_agent_*`, every series labelled with its `cell`): the role,
role switches and their seconds, the cell's part in each optimizer step, micro-steps and training tokens/s,
snapshot pulls (satellites) and weight publications (the core). A cell hosting the embedded engine also
serves the engine's `gyre_engine_*` series (services/cell_agent/engine/metrics.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gyre.metrics.registry import SECONDS_BUCKETS, Family, ScrapeCollector, series

ROLES = ("rollout", "draining", "training")


class CellAgentMetrics:
    def __init__(self, registry: CollectorRegistry, cell: int) -> None:
        s, c, labels = "cell_agent", str(cell), ["cell"]
        self.cell = c
        self._step_seconds = Histogram(
            series(s, "step_seconds"),
            "Seconds of this cell's part in an optimizer step it trained in (JoinBatch to its end).",
            labels,
            buckets=SECONDS_BUCKETS,
            registry=registry,
        ).labels(c)
        self._steps = Counter(
            series(s, "steps"), "Optimizer steps this cell's gradients went into.", labels, registry=registry
        ).labels(c)
        self._microstep_seconds = Histogram(
            series(s, "microstep_seconds"),
            "Seconds of forward + backward of one micro-step.",
            labels,
            buckets=SECONDS_BUCKETS,
            registry=registry,
        ).labels(c)
        self._microsteps = Counter(
            series(s, "microsteps"), "Micro-steps computed and kept.", labels, registry=registry
        ).labels(c)
        self._trained_tokens = Counter(
            series(s, "trained_tokens"), "Tokens of the micro-steps computed.", labels, registry=registry
        ).labels(c)
        self._tokens_per_second = Gauge(
            series(s, "training_tokens_per_second"),
            "Tokens per second of the last micro-step.",
            labels,
            registry=registry,
        ).labels(c)
        self._switch_seconds = Histogram(
            series(s, "switch_seconds"),
            "Seconds of a role switch, by the role switched to.",
            [*labels, "to_role"],
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self._pulls = Counter(
            series(s, "snapshot_pulls"),
            "Snapshot pulls of the core's weights (satellites), by "
            "outcome (pulled, stale: the core had moved on).",
            [*labels, "outcome"],
            registry=registry,
        )
        self._pull_seconds = Histogram(
            series(s, "snapshot_pull_seconds"),
            "Seconds of a snapshot pull.",
            labels,
            buckets=SECONDS_BUCKETS,
            registry=registry,
        ).labels(c)
        self._publish_seconds = Histogram(
            series(s, "weight_publish_seconds"),
            "Seconds of a weight publication to the rollout engines (the core).",
            labels,
            buckets=SECONDS_BUCKETS,
            registry=registry,
        ).labels(c)
        for to_role in ("training", "rollout"):  # every label from the first scrape on, at 0
            self._switch_seconds.labels(c, to_role)
        for outcome in ("pulled", "stale"):
            self._pulls.labels(c, outcome)
        self._masked = Gauge(
            series(s, "step_masked_ratio"),
            "The last step's share dropped by each mask of the objective (the core): `clip` executions "
            "(sequence-ratio clip), `sequence` executions (geometric-mean mask), `token` targets "
            "(token correction).",
            [*labels, "mask"],
            registry=registry,
        )
        self._mismatch_kl = Gauge(
            series(s, "step_mismatch_kl_nats"),
            "The last step's train/inference mismatch (the core): mean k3 = rho - 1 - log rho per target "
            "sampled at the trainer's own version.",
            labels,
            registry=registry,
        ).labels(c)
        self._mismatch_abs = Gauge(
            series(s, "step_mismatch_abs_log_ratio"),
            "The last step's |log pi_train - log p_roll| over those targets (the core), by `stat` (mean, max).",
            [*labels, "stat"],
            registry=registry,
        )
        self.role: Callable[[], str] = lambda: "rollout"
        """The cell's current role (set by the agent)."""
        self.policy_version: Callable[[], int | None] = lambda: None
        """The policy version of the cell's trainer (set by the agent)."""
        ScrapeCollector(self._read, registry)

    def step(self, seconds: float) -> None:
        self._steps.inc()
        self._step_seconds.observe(seconds)

    def microstep(self, seconds: float, num_tokens: int) -> None:
        self._microsteps.inc()
        self._microstep_seconds.observe(seconds)
        self._trained_tokens.inc(num_tokens)
        if seconds > 0:
            self._tokens_per_second.set(num_tokens / seconds)

    def switched(self, to_role: str, seconds: float) -> None:
        self._switch_seconds.labels(self.cell, to_role).observe(seconds)

    def snapshot_pull(self, pulled: bool, seconds: float) -> None:
        self._pulls.labels(self.cell, "pulled" if pulled else "stale").inc()
        if pulled:
            self._pull_seconds.observe(seconds)

    def published(self, seconds: float) -> None:
        self._publish_seconds.observe(seconds)

    def step_objective(self, clip_fraction: float, fields: Mapping[str, float]) -> None:
        """The core's step: its mask fractions and mismatch (`step_runner.correction_fields`)."""
        self._masked.labels(self.cell, "clip").set(clip_fraction)
        self._masked.labels(self.cell, "sequence").set(fields["sequence_mask_fraction"])
        self._masked.labels(self.cell, "token").set(fields["token_mask_fraction"])
        if fields["num_mismatch_targets"]:
            self._mismatch_kl.set(fields["mismatch_kl"])
            self._mismatch_abs.labels(self.cell, "mean").set(fields["mismatch_abs_log_ratio_mean"])
            self._mismatch_abs.labels(self.cell, "max").set(fields["mismatch_abs_log_ratio_max"])

    def _read(self) -> Iterable[Family]:
        role = Family(
            series("cell_agent", "role"), "1 for the cell's current role.", label_names=("cell", "role")
        )
        current = self.role()
        for r in ROLES:
            role.add(int(r == current), self.cell, r)
        out = [role]
        version = self.policy_version()
        if version is not None:
            v = Family(
                series("cell_agent", "policy_version"),
                "Policy version of the cell's trainer.",
                label_names=("cell",),
            )
            v.add(version, self.cell)
            out.append(v)
        return out
