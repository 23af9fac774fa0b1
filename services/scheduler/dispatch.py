"""Dispatch: turn the policy's DispatchGroups into groups of executions (Redis records, the d
counter, GroupDispatched events) and StartExecutions into start commands for the runners.

Queries are drawn from the run's task set (the `tasks:` config section: gyre/tasks/taskset.py) in a
seeded, weighted, interleaved cycle (gyre/tasks/sampling.py); a group is N executions of one query.
Executions wait in a FIFO (a Redis list) between dispatch and start.
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
        self._cycle = tasks.cycle(seed)

    def next(self) -> str:
        return self._cycle.next()

    def limits(self, task_id: str) -> tuple[float, float]:
        task = self.tasks.registry.get(task_id)
        return float(task.harness_timeout_s), float(task.overall_budget_s)


class Dispatcher:
    def __init__(self, redis: aioredis.Redis, keys: Keys, bus: EventBus, profile: str, queries: QuerySource) -> None:
        self._redis = redis
        self._keys = keys
        self._bus = bus
        self._records = Records(redis, keys)
        self._counters = Counters(redis, keys)
        self.queries = queries
        self._profile = profile
        self._fifo = keys.queue("exec_fifo", "list")
        self._seq = keys.queue("exec_fifo", "group_seq")

    async def dispatch(self, num_groups: int, group_size: int, policy_version: int, burst: int) -> list[str]:
        """Create `num_groups` groups; returns their ids in dispatch order."""
        group_ids: list[str] = []
        for _ in range(num_groups):
            seq = int(await self._redis.incr(self._seq))
            group_id = ids.group_id(seq)
            task_id = self.queries.next()
            harness_timeout_s, budget_s = self.queries.limits(task_id)
            executions = [
                ExecutionRecord(
                    execution_id=ids.execution_id(group_id, i), group_id=group_id, index_in_group=i, query_id=task_id,
                    task_id=task_id, harness_timeout_s=harness_timeout_s, overall_budget_s=budget_s,
                    profile=self._profile,
                )
                for i in range(group_size)
            ]
            group = GroupRecord(
                group_id=group_id, query_id=task_id, task_id=task_id,
                execution_ids=tuple(e.execution_id for e in executions), policy_version=policy_version,
                burst=burst, dispatched_at_ms=int(time.time() * 1000),
            )
            await self._records.put_group(group, executions)
            await self._counters.add("dispatched", group_size, token=group_id)
            await self._redis.rpush(self._fifo, *group.execution_ids)
            await self._bus.publish(
                ev.GroupDispatched(
                    group_id=group_id, query_id=task_id, execution_ids=list(group.execution_ids),
                    policy_version=policy_version, burst=burst,
                ),
                event_id=f"group.dispatched:{group_id}",
            )
            group_ids.append(group_id)
        return group_ids

    async def start(self, engine_id: str, count: int) -> list[str]:
        """Send start commands for the `count` oldest queued executions, routed to `engine_id`."""
        started: list[str] = []
        for _ in range(count):
            raw = await self._redis.lpop(self._fifo)
            if raw is None:
                raise AssertionError("the policy started more executions than were dispatched")
            execution_id = raw.decode()
            record = await self._records.get_execution(execution_id)
            assert record is not None, f"execution {execution_id} has no dispatch record"
            await self._bus.publish(
                ev.ExecutionStartRequested(
                    execution=common.ExecutionRef(
                        execution_id=execution_id, group_id=record.group_id,
                        index_in_group=record.index_in_group, query_id=record.query_id,
                    ),
                    task_id=record.task_id, engine_id=engine_id, harness_timeout_s=record.harness_timeout_s,
                    overall_budget_s=record.overall_budget_s, profile=record.profile,
                ),
                event_id=f"exec.start:{execution_id}",
            )
            started.append(execution_id)
        return started

    async def queued(self) -> list[str]:
        """Executions dispatched and not yet started, oldest first."""
        return [raw.decode() for raw in await self._redis.lrange(self._fifo, 0, -1)]
