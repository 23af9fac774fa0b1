"""Scheduler metrics on `/metrics`: the control plane as `gyre status` shows it, read from the policy's
snapshot at scrape time (waterlevel, C_R, cell roles, counters d/p/f, versions, staleness, transitions),
plus the staleness of each packed group as a histogram and the driver's applied/rejected events."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Histogram

from gyre.metrics.registry import Family, ScrapeCollector, series
from services.scheduler.driver import Driver
from services.scheduler.policy import Role
from services.scheduler.policy.state import PolicySnapshot

STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16)


class SchedulerMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        snapshot: Callable[[], PolicySnapshot | None],
        driver: Callable[[], Driver | None],
    ) -> None:
        self._snapshot = snapshot
        self._driver = driver
        self.group_staleness = Histogram(
            series("scheduler", "group_staleness_steps"),
            "Staleness v_t - v_d of each group when packed.",
            buckets=STALENESS_BUCKETS,
            registry=registry,
        )
        ScrapeCollector(self._read, registry)

    def _read(self) -> Iterable[Family]:
        snap = self._snapshot()
        if snap is None:
            return []
        s = "scheduler"
        gauges = {
            "waterlevel_executions": ("Waterlevel w = d - f (dispatched, not finished).", snap.waterlevel),
            "rollout_capacity_executions": (
                "Rollout capacity C_R = C_s + (K - k) C_e.",
                snap.rollout_capacity,
            ),
            "queued_executions": ("Executions dispatched, not started (d - p).", snap.queued),
            "running_executions": ("Executions started, not finished (p - f).", snap.running),
            "training_cells": ("Cells in the training role (k).", snap.training_cells),
            "policy_version": ("Policy version v (optimizer steps taken).", snap.version),
            "published_version": ("Policy version the rollout engines serve.", snap.published_version),
            "ready_groups": ("Ready groups no training cell has claimed.", snap.ready_unclaimed),
            "mean_staleness_steps": (
                "Mean staleness of the groups consumed so far.",
                snap.mean_staleness or 0.0,
            ),
        }
        families = []
        for name, (doc, value) in gauges.items():
            f = Family(series(s, name), doc)
            f.add(value)
            families.append(f)
        counters = {
            "dispatched_executions_total": ("Executions dispatched (d).", snap.dispatched),
            "started_executions_total": ("Executions started (p).", snap.started),
            "finished_executions_total": ("Executions finished, for any reason (f).", snap.finished),
            "transitions_total": ("Role transitions completed.", snap.transitions_completed),
            "bursts_total": ("Bursts completed (weight publications).", snap.burst),
            "consumed_groups_total": ("Groups consumed by optimizer steps.", snap.consumed_groups),
        }
        for name, (doc, value) in counters.items():
            f = Family(series(s, name), doc, kind="counter")
            f.add(value)
            families.append(f)
        cells = Family(series(s, "cells"), "Cells by role.", label_names=("role",))
        for role in Role:
            cells.add(sum(1 for r in snap.roles if r is role), role.value)
        role_of = Family(
            series(s, "cell_role"), "1 for each cell's current role.", label_names=("cell", "role")
        )
        for cell, role in enumerate(snap.roles):
            role_of.add(1, str(cell), role.value)
        families += [cells, role_of]
        driver = self._driver()
        if driver is not None:
            applied = Family(
                series(s, "policy_events_total"),
                "Events the policy applied or rejected.",
                kind="counter",
                label_names=("outcome",),
            )
            applied.add(driver.num_applied, "applied")
            applied.add(driver.num_rejected, "rejected")
            families.append(applied)
        return families
