"""The executions the proxy serves: their trees in memory, loaded lazily from Redis, and closing.

    state = await executions.for_key(api_key)       # AuthenticationError / ExecutionClosedError
    await executions.persist(state, nodes)          # in commit order, after tree.commit

An execution opened by this process is created in memory; one opened before a restart is
rebuilt from the tree store on its first request (`TreeStore.load`), once even when several
requests race for it. Writes of one execution go through its lock in commit order, so a node
written twice (an alias added later) ends with its latest encoding. `close` freezes the tree,
stops calls in flight, waits for pending writes, marks the tree closed in Redis (the packer never
sees a closed tree that is still growing) and drops it from memory: a closed key answers 403
from a set of ids, without loading anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gyre.engine import EngineError
from gyre.log import get_logger
from gyre.store.trees import TreeMeta, TreeStore
from gyre.trajectory import ChatTemplate, HarnessProfile, MessageMemo, Node, TrajectoryTree, get_profile
from services.proxy.credentials import Credentials
from services.proxy.errors import AuthenticationError, ExecutionClosedError
from services.proxy.generation import Generation

log = get_logger("gyre.proxy.executions")


@dataclass(eq=False)
class ExecutionState:
    execution_id: str
    profile: str
    policy_version: int
    tree: TrajectoryTree
    closed: bool = False
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    calls: set[Generation] = field(default_factory=set)
    """Generations in flight."""
    pending_writes: int = 0
    writes_idle: asyncio.Event = field(default_factory=asyncio.Event)
    memo: MessageMemo = field(default_factory=MessageMemo)
    """The messages of the harness's last requests, converted (see `MessageMemo`)."""

    def __post_init__(self) -> None:
        self.writes_idle.set()


class UnknownExecutionError(KeyError):
    """No execution with this id was opened in this run."""


class Executions:
    def __init__(
        self,
        store: TreeStore,
        credentials: Credentials,
        template: ChatTemplate,
        default_profile: str,
        strict_matching: bool = False,
    ) -> None:
        self.strict_matching = strict_matching
        self.store = store
        self.credentials = credentials
        self.template = template
        self.default_profile = default_profile
        self._open: dict[str, ExecutionState] = {}
        self._loading: dict[str, asyncio.Future[ExecutionState]] = {}
        self._closed: set[str] = set()
        """Executions known to be closed; their trees live in Redis only."""

    def in_memory(self, execution_id: str) -> ExecutionState | None:
        """The execution's state if this process holds it (nothing is loaded)."""
        return self._open.get(execution_id)

    @property
    def num_open(self) -> int:
        return sum(1 for s in self._open.values() if not s.closed)

    async def open(
        self, execution_id: str, profile: str, policy_version: int, extra: Mapping[str, str] | None = None
    ) -> str:
        """Register the execution (idempotent while open) and issue a key for it."""
        if not execution_id:
            raise ValueError("execution_id is required")
        if execution_id in self._closed:
            raise ExecutionClosedError(f"execution {execution_id} is closed")
        profile = profile or self.default_profile
        get_profile(profile)  # ValueError names the known profiles
        created = await self.store.create(
            execution_id,
            profile=profile,
            template=self.template.name,
            policy_version=policy_version,
            extra=extra,
        )
        if created:  # its tree is empty: built here, not read back from Redis
            tree = TrajectoryTree(execution_id, self.template, self._profile(profile))
            self._open.setdefault(execution_id, ExecutionState(execution_id, profile, policy_version, tree))
        else:
            await self.get(execution_id)
            log.info("execution_reopened", execution=execution_id)
        return await self.credentials.issue(execution_id)

    async def for_key(self, api_key: str | None) -> ExecutionState:
        if not api_key:
            raise AuthenticationError("missing API key: send it as x-api-key or Authorization: Bearer")
        execution_id = await self.credentials.resolve(api_key)
        if execution_id is None:
            raise AuthenticationError("invalid API key")
        try:
            return await self.get(execution_id)
        except UnknownExecutionError:  # the key outlived its execution's records
            raise AuthenticationError("invalid API key") from None

    async def get(self, execution_id: str) -> ExecutionState:
        """An open execution (loaded from Redis on first use); `ExecutionClosedError` once closed."""
        if execution_id in self._closed:
            raise ExecutionClosedError(f"execution {execution_id} is closed; its key takes no more calls")
        state = self._open.get(execution_id)
        if state is not None:
            return state
        pending = self._loading.get(execution_id)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._loading[execution_id] = pending
            try:
                pending.set_result(await self._load(execution_id))
            except BaseException as e:
                pending.set_exception(e)
                pending.exception()  # retrieved here; waiters get it too
            finally:
                del self._loading[execution_id]
        state = await asyncio.shield(pending)
        return self._open.setdefault(execution_id, state)  # an `open` that created it meanwhile wins

    async def _load(self, execution_id: str) -> ExecutionState:
        meta = await self.store.meta(execution_id)
        if meta is None:
            raise UnknownExecutionError(execution_id)
        if meta.template != self.template.name:
            raise ValueError(
                f"execution {execution_id} was recorded with template {meta.template!r}; this proxy renders "
                f"with {self.template.name!r} (the chat template of model.path changed)"
            )
        if meta.closed:
            self._closed.add(execution_id)
            raise ExecutionClosedError(f"execution {execution_id} is closed; its key takes no more calls")
        tree = await self.store.load(execution_id, self.template, self._profile(meta.profile))
        if tree.nodes:
            log.info("tree_reloaded", execution=execution_id, num_nodes=len(tree.nodes))
        return ExecutionState(execution_id, meta.profile, meta.policy_version, tree)

    def _profile(self, name: str) -> HarnessProfile:
        return get_profile(name).with_matching(self.strict_matching)

    async def persist(self, state: ExecutionState, nodes: Iterable[Node], num_sampled: int) -> None:
        """Write a commit's nodes (call right after `tree.commit`, before any await). Shielded, so a
        harness hanging up cannot lose a record; counted, so `close` waits for it."""
        state.pending_writes += 1
        state.writes_idle.clear()
        await asyncio.shield(self._persist(state, list(nodes), num_sampled))

    async def _persist(self, state: ExecutionState, nodes: list[Node], num_sampled: int) -> None:
        try:
            async with state.write_lock:
                await self.store.append(state.execution_id, nodes, num_sampled=num_sampled)
        finally:
            state.pending_writes -= 1
            if state.pending_writes == 0:
                state.writes_idle.set()

    async def close(self, execution_id: str) -> tuple[TreeMeta, int]:
        """Freeze the tree, stop its calls, flush writes, mark it closed, drop it from memory.
        Idempotent. Returns the stored meta and the number of nodes."""
        try:
            state = await self.get(execution_id)
        except ExecutionClosedError:
            return await self.store.close(execution_id), await self.store.num_nodes(execution_id)
        state.closed = True
        state.tree.close()
        for call in list(state.calls):
            call.cancel()
            engine, rid = call.engine, call.rid
            if engine is not None and rid is not None:
                try:
                    await engine.client.abort(rid)
                except EngineError as e:
                    log.warning("close_abort_failed", execution=execution_id, error=e.message)
        await state.writes_idle.wait()
        meta = await self.store.close(execution_id)
        self._closed.add(execution_id)
        self._open.pop(execution_id, None)
        return meta, len(state.tree.nodes)
