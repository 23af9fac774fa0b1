"""Dispatch: turn the policy's DispatchGroups into groups of executions (Redis records, the d
counter, GroupDispatched events) and StartExecutions into start commands for the runners.

Queries are drawn from the run's task set (the `tasks:` config section: gyre/tasks/taskset.py) in a
seeded, weighted, interleaved cycle (gyre/tasks/sampling.py); a group is N executions of one query.

Everything is a function of the policy's counters, so executing an action twice (a scheduler killed
mid-action executes it again after its restart) writes the same thing twice: the k-th group of the run
(0-based) is `g<k+1>` and runs the cycle's k-th query; executions start in dispatch order, so the p-th
execution started is the p-th dispatched one, `g<p // N + 1>-e<p % N>`. Records, the counter (by group
token), events (by event id) and start commands (by event id, and the runner's claim) are idempotent.
"""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from gyre import ids
from gyre.bus import EventBus
from gyre.store import Counters, ExecutionRecord, GroupRecord, Keys, Records
from gyre.tasks import TaskSet
from gyre.v1 import common_pb2 as common
from gyre.v1 import events_pb2 as ev


class QuerySource:
    """An endless, seeded, weighted cycle over the task set's queries, with each task's limits."""

    def __init__(self, tasks: TaskSet, seed: int) -> None:
        self.tasks = tasks
        self._seed = seed
        self._cycle = tasks.cycle(seed)
        self._drawn = 0
        """Draws taken from `_cycle`."""

    def next(self) -> str:
        self._drawn += 1
        return self._cycle.next()

    def at(self, index: int) -> str:
        """The cycle's `index`-th draw (0-based), whatever was drawn before."""
        if index < 0:
            raise ValueError(f"draw index must be >= 0; got {index}")
        if index < self._drawn:
            self._cycle, self._drawn = self.tasks.cycle(self._seed), 0
        while self._drawn < index:
            self.next()
        return self.next()

    def limits(self, task_id: str) -> tuple[float, float]:
        task = self.tasks.registry.get(task_id)
        return float(task.harness_timeout_s), float(task.overall_budget_s)


class Dispatcher:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        bus: EventBus,
        profile: str,
        queries: QuerySource,
        group_size: int,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._bus = bus
        self._records = Records(redis, keys)
        self._counters = Counters(redis, keys)
        self.queries = queries
        self._profile = profile
        self.group_size = group_size
        """N: executions per group (fixed for a run: execution ids follow from it)."""

    async def dispatch(
        self, num_groups: int, group_size: int, policy_version: int, burst: int, first_group: int = 0
    ) -> list[str]:
        """Create the groups `first_group` .. `first_group + num_groups − 1` of the run; returns their ids."""
        if group_size != self.group_size:
            raise ValueError(f"groups of {group_size} asked for; this run's groups have {self.group_size}")
        group_ids: list[str] = []
        for index in range(first_group, first_group + num_groups):
            group_id = ids.group_id(index + 1)
            task_id = self.queries.at(index)
            harness_timeout_s, budget_s = self.queries.limits(task_id)
            executions = [
                ExecutionRecord(
                    execution_id=ids.execution_id(group_id, i),
                    group_id=group_id,
                    index_in_group=i,
                    query_id=task_id,
                    task_id=task_id,
                    harness_timeout_s=harness_timeout_s,
                    overall_budget_s=budget_s,
                    profile=self._profile,
                )
                for i in range(group_size)
            ]
            group = GroupRecord(
                group_id=group_id,
                query_id=task_id,
                task_id=task_id,
                execution_ids=tuple(e.execution_id for e in executions),
                policy_version=policy_version,
                burst=burst,
                dispatched_at_ms=int(time.time() * 1000),
            )
            await self._records.put_group(group, executions)
            await self._counters.add("dispatched", group_size, token=group_id)
            await self._bus.publish(
                ev.GroupDispatched(
                    group_id=group_id,
                    query_id=task_id,
                    execution_ids=list(group.execution_ids),
                    policy_version=policy_version,
                    burst=burst,
                ),
                event_id=f"group.dispatched:{group_id}",
            )
            group_ids.append(group_id)
        return group_ids

    async def start(self, engine_id: str, count: int, first: int = 0) -> list[str]:
        """Send start commands for the executions `first` .. `first + count − 1` in dispatch order (the
        oldest queued ones), routed to `engine_id`."""
        started: list[str] = []
        for position in range(first, first + count):
            execution_id = ids.execution_id(
                ids.group_id(position // self.group_size + 1), position % self.group_size
            )
            record = await self._records.get_execution(execution_id)
            if record is None:
                raise AssertionError(
                    f"the policy started execution {execution_id}, which was never dispatched"
                )
            await self._bus.publish(
                ev.ExecutionStartRequested(
                    execution=common.ExecutionRef(
                        execution_id=execution_id,
                        group_id=record.group_id,
                        index_in_group=record.index_in_group,
                        query_id=record.query_id,
                    ),
                    task_id=record.task_id,
                    engine_id=engine_id,
                    harness_timeout_s=record.harness_timeout_s,
                    overall_budget_s=record.overall_budget_s,
                    profile=record.profile,
                ),
                event_id=f"exec.start:{execution_id}",
            )
            started.append(execution_id)
        return started
