"""The cells' torch.distributed world across cell restarts: one generation per set of live processes.

    keeper = WorldKeeper(training)
    await keeper.register()          # this process's incarnation, in Redis (`heartbeat()` keeps it alive)
    await keeper.connect()           # core: form the first world; satellite: join it (blocks until all K)
    await keeper.keep()              # from then on: re-form whenever a cell process was replaced

A gloo world cannot take in a new process: every group is a collective of the whole world, built once.
So each cell agent process registers a fresh *incarnation* at start, and the core forms the world of
generation g with the incarnations it found (`WorldRecord`: the generation, its own rendezvous store of
that generation, the members). When a cell restarts, its incarnation changes; the core notices, waits
until it is not inside a step (the old world, without the dead cell, serves the step in progress), and
forms generation g+1; every satellite that sees a newer generation naming its own incarnation leaves the
old world and joins the new one, when no step runs on it. A satellite inside a step when that happens
leaves the step (`changed()`, checked at its idle points: its claims go back, the scheduler retries its
JoinBatch). A core that restarts forms the next generation the same way, and every satellite follows.

Pull requests of the `torch` transport carry the generation they were made in; the core serves only those
of its current world (under `world_lock`, which formation takes too), so no pull blocks on a world that
is being replaced.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Protocol

from gyre.config.training import TrainerSection
from gyre.log import get_logger
from gyre.trainer.collectives import (
    CellCollectives,
    HostedStore,
    host_rendezvous,
    initialize_groups,
    join_rendezvous,
    set_socket_interface,
)
from gyre.trainer.star import StarHub
from gyre.weights.transports import TransportOptions, WeightTransport, create_transport
from services.cell_agent.compute import ComputeThread
from services.cell_agent.trainer_state import TrainerState, WorldRecord

log = get_logger("gyre.cell_agent.world")

WATCH_S = 0.5
"""How often the world's membership and generation are looked at."""
ALIVE_TTL_S = 5.0
"""A cell's incarnation expires this long after its last refresh (every second): a dead process's does."""


class WorldMember(Protocol):
    """What keeping the world needs of a cell's training side (`TrainingSide`, training.py, which imports
    this module): the cell's place and hosts, its state in Redis, the locks and the event it shares with its
    steps, and the collectives and weight transport each world builds for it."""

    cell: int
    num_cells: int
    is_core: bool
    section: TrainerSection
    state: TrainerState
    own_host: str
    core_host: str
    bind_host: str
    compute: ComputeThread
    step_lock: asyncio.Lock
    connected: asyncio.Event
    groups: CellCollectives | None
    transport: WeightTransport | None

    async def publish_snapshot(self) -> None: ...

    async def build_after_world(self) -> object:
        """Build a trainer that needs the cells' world, once it has formed (its result is not used here)."""


class WorldKeeper:
    def __init__(self, side: WorldMember) -> None:
        self.side = side
        self.incarnation = uuid.uuid4().hex[:12]
        """This process's identity among the cells' incarnations."""
        self.generation = 0
        """The generation this cell is a member of (0: none yet)."""
        self.members: tuple[str, ...] = ()
        self.announced = 0
        """Newest generation seen announced that names this cell (ahead of `generation` while moving)."""
        self.world_lock = asyncio.Lock()
        """Held while the world is formed, and by the core while it serves a pull over it."""
        self._hosted: HostedStore | StarHub | None = None
        self._store: object | None = None

    def changed(self) -> bool:
        """Satellite: a newer world was announced, this cell must leave its step and move to it."""
        return not self.side.is_core and self.announced > self.generation

    async def register(self) -> None:
        await self.side.state.set_incarnation(self.side.cell, self.incarnation, ALIVE_TTL_S)

    async def heartbeat(self) -> None:
        """Keep this process's incarnation alive for as long as the cell runs (one cell has no world)."""
        while self.side.num_cells > 1:
            await self.register()
            await asyncio.sleep(1.0)

    async def connect(self) -> None:
        """Form (core) or join (satellite) the first world that holds this process; returns once in it."""
        side = self.side
        if side.num_cells == 1:
            side.connected.set()
            if side.is_core:
                await side.publish_snapshot()
            return
        set_socket_interface(side.section.dist_socket_ifname)
        if side.is_core:
            await self._form(await self._wait_members())
        else:
            await self._join(await self._wait_announced())

    async def keep(self) -> None:
        """Connect, then re-form (core) or follow (satellite) the world for as long as the cell runs."""
        if not self.side.connected.is_set():
            await self.connect()
        if self.side.num_cells == 1:
            return
        while True:
            await asyncio.sleep(WATCH_S)
            if self.side.is_core:
                found = await self.side.state.incarnations(self.side.num_cells)
                if any(i is None for i in found) or tuple(found) == self.members:
                    continue
                log.info("world_member_replaced", generation=self.generation, members=found)
                async with self.side.step_lock:  # the step in progress finishes on the old world
                    await self._form(await self._wait_members())
            else:
                record = await self.side.state.world()
                if record is None or record.generation == self.generation or not self._names_me(record):
                    continue
                self.announced = record.generation
                log.info("world_moving", generation=record.generation, previous=self.generation)
                async with self.side.step_lock:
                    await self._join(await self._wait_announced())

    def _names_me(self, record: WorldRecord) -> bool:
        cell = self.side.cell
        return cell < len(record.members) and record.members[cell] == self.incarnation

    async def _wait_members(self) -> tuple[str, ...]:
        """Core: every cell's incarnation (each cell agent registers its own at start)."""
        side = self.side
        while True:
            found = await side.state.incarnations(side.num_cells)
            found[0] = self.incarnation
            if all(i is not None for i in found):
                return tuple(str(i) for i in found)
            await asyncio.sleep(side.section.poll_s * 10)

    async def _wait_announced(self) -> WorldRecord:
        """Satellite: the newest world that names this process."""
        side = self.side
        loop = asyncio.get_running_loop()
        deadline = loop.time() + side.section.rendezvous_timeout_s * 4
        while True:
            record = await side.state.world()
            if record is not None and self._names_me(record) and record.generation > self.generation:
                self.announced = record.generation
                return record
            if loop.time() > deadline:
                raise TimeoutError(
                    f"cell {side.cell}: the core formed no world with this process within "
                    f"{side.section.rendezvous_timeout_s * 4:.0f} s"
                )
            await asyncio.sleep(side.section.poll_s * 10)

    async def _leave(self) -> None:
        side = self.side
        side.connected.clear()
        if side.transport is not None:
            await side.compute.run(side.transport.close)
            side.transport = None
        if side.groups is not None:
            await side.compute.run(side.groups.close)
            side.groups = None
        if self._hosted is not None:
            self._hosted.close()
            self._hosted = None

    async def _form(self, members: tuple[str, ...]) -> None:
        """Core: announce generation g+1 with these members and build it (blocks until all K joined);
        a formation that times out (a member died meanwhile) is tried again with the next generation."""
        side = self.side
        async with self.world_lock:
            while True:
                await self._leave()
                previous = await side.state.world()
                generation = max(self.generation, previous.generation if previous else 0) + 1
                hosted = await asyncio.to_thread(
                    host_rendezvous,
                    side.section.dist_backend,
                    bind_host=side.bind_host,
                    port=side.section.dist_port,
                    world_size=side.num_cells,
                    generation=generation,
                    timeout_s=side.section.rendezvous_timeout_s,
                )
                self._hosted = hosted
                await side.state.set_world(WorldRecord(generation, side.core_host, hosted.port, members))
                try:
                    await self._build(hosted.rendezvous, generation)
                except (RuntimeError, TimeoutError) as e:
                    log.warning("world_formation_failed", generation=generation, error=str(e)[:300])
                    self.generation = generation
                    members = await self._wait_members()
                    continue
                self.members = members
                break
        await side.publish_snapshot()

    async def _join(self, record: WorldRecord) -> None:
        """Satellite: leave the old world, join `record`'s (retrying its store while the core opens it)."""
        side = self.side
        async with self.world_lock:
            await self._leave()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + side.section.rendezvous_timeout_s
            while True:
                try:
                    store = await asyncio.to_thread(
                        join_rendezvous,
                        side.section.dist_backend,
                        host=record.host,
                        port=record.port,
                        world_size=side.num_cells,
                        cell=side.cell,
                        generation=record.generation,
                        timeout_s=min(5.0, side.section.rendezvous_timeout_s),
                    )
                    break
                except (RuntimeError, TimeoutError) as e:
                    if loop.time() > deadline:
                        raise
                    log.warning("rendezvous_retry", host=record.host, port=record.port, error=str(e)[:200])
                    await asyncio.sleep(0.2)
            self._store = store
            try:
                await self._build(store, record.generation)
            except (RuntimeError, TimeoutError) as e:  # the core moved on meanwhile: follow it next time
                log.warning("world_join_failed", generation=record.generation, error=str(e)[:300])
                self.generation = record.generation
                return
            self.members = record.members

    async def _build(self, store: object, generation: int) -> None:
        side = self.side
        side.groups = await side.compute.run(
            initialize_groups,
            store,
            cell=side.cell,
            num_cells=side.num_cells,
            backend=side.section.dist_backend,
            timeout_s=side.section.collective_timeout_s,
        )
        await side.build_after_world()  # a backend that needs the cells' world (megatron) is built now
        options = TransportOptions(
            host=(side.section.mooncake_host or side.own_host) if side.is_core else side.own_host,
            protocol=side.section.mooncake_protocol,
            device=side.section.mooncake_device,
            groups=side.groups,
        )
        side.transport = await side.compute.run(create_transport, side.section.weight_transport, options)
        self.generation = generation
        side.connected.set()
        log.info("collectives_ready", world_size=side.num_cells, generation=generation)

    async def close(self) -> None:
        await self._leave()
        if self.side.is_core and self.generation:
            await self.side.state.clear_world(self.generation)
