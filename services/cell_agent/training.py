"""A cell's training side: its trainer backend, its rank in the cells' torch.distributed world, the
weight transport, and the core's authoritative snapshot.

    training = TrainingSide(cell=k, ...)
    await training.start()            # core: resume from the newest checkpoint (+ replay), announce the version
    await training.keep_world()       # join the world (world.py: re-formed when a cell restarts), forever
    await training.pull_snapshot(7)   # satellite: the core's weights of version 7, or False if gone

The core's snapshot is its live flat parameter buffer, exposed through the transport once the core
first moves into training (as the paper's core does) and described in Redis under a sequence lock
(`TrainerState`). Weights only change in `optimizer_step`, which makes the
lock odd first, so a satellite that reads the same even lock value before and after its pull got one
whole version — even while the core is computing, or taking its optimizer step meanwhile. The digest
check then proves the bytes equal the core's. Driving a step (claims, reduction) is `StepRunner`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from gyre.config.training import TrainerSection
from gyre.log import get_logger
from gyre.rl.loss import ObjectiveParams
from gyre.store import Keys
from gyre.trainer.backends import TrainerBackend, TrainerSpec, create_trainer, trainer_class
from gyre.trainer.checkpoint import latest_checkpoint
from gyre.trainer.collectives import CellCollectives
from gyre.weights.snapshot import SnapshotRecord
from gyre.weights.transports import WeightTransport
from services.cell_agent.compute import ComputeThread
from services.cell_agent.errors import CellUnavailableError, SnapshotError
from services.cell_agent.metrics import CellAgentMetrics
from services.cell_agent.replay import ReplayedStep, drop_replay_payloads, replay_steps
from services.cell_agent.trainer_state import TrainerState
from services.cell_agent.world import WorldKeeper

log = get_logger("gyre.cell_agent.training")


class TrainingSide:
    def __init__(
        self,
        *,
        cell: int,
        num_cells: int,
        section: TrainerSection,
        model_dir: Path,
        objective: ObjectiveParams,
        redis: aioredis.Redis,
        keys: Keys,
        checkpoint_root: Path,
        own_host: str,
        core_host: str,
        bind_host: str = "127.0.0.1",
        metrics: CellAgentMetrics | None = None,
    ) -> None:
        self.cell = cell
        self.metrics = metrics or CellAgentMetrics(CollectorRegistry(), cell)
        self.num_cells = num_cells
        self.is_core = cell == 0
        self.section = section
        self.redis = redis
        self.keys = keys
        self.state = TrainerState(redis, keys)
        self.checkpoint_root = checkpoint_root
        self.own_host = own_host
        self.core_host = core_host
        self.bind_host = bind_host
        self.exposed = False
        self.spec = TrainerSpec(section, model_dir, objective, with_optimizer=self.is_core)
        self._trainer: TrainerBackend | None = None
        if not (trainer_class(section.backend).needs_world and num_cells > 1):
            self._trainer = self._build()
        self.compute = ComputeThread(f"trainer-{cell}")
        self.groups: CellCollectives | None = None
        self.transport: WeightTransport | None = None
        self.connected = asyncio.Event()
        self.weights_lock = threading.Lock()
        self.step_lock = asyncio.Lock()
        """Held while this cell takes part in a step, and while its world is re-formed (never both)."""
        self.checkpointed_version: int | None = None
        self.microsteps_processed = 0
        self.world = WorldKeeper(self)
        self.on_replayed: Callable[[list[ReplayedStep]], Awaitable[None]] | None = None
        """Reports steps replayed by a trainer built once the world formed (the agent sets it)."""
        self.started_batches: set[str] = set()
        self.leaving = asyncio.Event()
        """Set when the agent stops (a planned departure, the run's stop): a satellite leaves the open step
        at its next claim, giving back what it claimed (step_runner.py `_consume`)."""
        """Batches this process has begun its part of (a batch begun by an earlier process is restarted)."""
        self.archive_dir: Path | None = None
        """Core: where it records each step it takes for `gyre audit` (None: it does not; step_archive.py)."""
        self.archive_weights_every = 0
        self.archive_level = 6

    def keep_step_records(self, archive_dir: Path, *, weights_every: int, compress_level: int) -> None:
        """Core: record every step taken (its micro-steps per cell, in order) under `archive_dir/steps/`, and
        the weights after every `weights_every` steps (0: none) under `archive_dir/weights/`."""
        if self.is_core:
            self.archive_dir = Path(archive_dir)
            self.archive_weights_every = weights_every
            self.archive_level = compress_level

    @property
    def trainer(self) -> TrainerBackend:
        if self._trainer is None:
            raise CellUnavailableError(
                f"cell {self.cell}'s {self.section.backend} trainer is built once the cells' world is joined"
            )
        return self._trainer

    @property
    def built(self) -> bool:
        """The trainer exists (a backend that needs the cells' world is built in `connect`)."""
        return self._trainer is not None

    def _build(self) -> TrainerBackend:
        trainer = create_trainer(self.section.backend, self.spec)
        if not self.is_core:
            trainer.version = None  # a satellite knows its weights only once it pulled them
        return trainer

    # -- start-up ------------------------------------------------------------------------------------
    async def start(self) -> list[ReplayedStep]:
        """Core: load the newest checkpoint if there is one, replay the steps taken after it (a core that
        restarts after steps it had not checkpointed yet), announce the policy version; once the trainer
        is built: here, or when the world forms for a backend that needs it (`build_after_world`).
        Returns the replayed steps."""
        if not self.built:
            return []
        return await self._resume()

    async def build_after_world(self) -> list[ReplayedStep]:
        """Build a trainer that needs the cells' world (megatron), once it has formed; then resume it."""
        if self.built:
            return []
        self._trainer = await self.compute.run(self._build)
        log.info("trainer_built", backend=self.section.backend)
        replayed = await self._resume()
        if replayed and self.on_replayed is not None:
            await self.on_replayed(replayed)
        return replayed

    async def _resume(self) -> list[ReplayedStep]:
        if not self.is_core:
            return []
        latest = latest_checkpoint(self.checkpoint_root)
        if latest is not None:
            await self.compute.run(self.trainer.load_checkpoint, latest)
            self.checkpointed_version = self.trainer.version
            log.info("trainer_resumed", checkpoint=str(latest), policy_version=self.trainer.version)
        assert self.trainer.version is not None
        reached = await self.state.version()
        replayed: list[ReplayedStep] = []
        if reached is not None and reached > self.trainer.version:
            replayed = await replay_steps(self, self.trainer.version, reached)
            if self.section.checkpoint_every_steps:
                await self.checkpoint()
        await self.state.set_version(self.trainer.version)
        return replayed

    async def connect(self) -> None:
        """Join the cells' world (the core forms it; blocks until all K cells are in it)."""
        await self.world.register()
        await self.world.connect()

    async def keep_world(self) -> None:
        """Join the world, then follow it across cell restarts for as long as the cell runs (world.py)."""
        await self.world.register()
        await self.world.keep()

    async def wait_connected(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self.connected.wait(), timeout=timeout_s)
        except TimeoutError:
            raise CellUnavailableError(
                f"cell {self.cell} has not joined the other cells' collectives within {timeout_s} s"
            ) from None

    # -- the core's snapshot ---------------------------------------------------------------------------
    async def publish_snapshot(self) -> None:
        """Core: describe the current weights in Redis (ends a sequence-lock write section)."""
        assert self.trainer.version is not None
        digest = await self.compute.run(self.trainer.digest) if self.section.snapshot_digest else ""
        endpoint = (
            {}
            if self.transport is None or not self.exposed
            else await self.compute.run(self.transport.expose, self.trainer.flat_params)
        )
        flat = self.trainer.flat_params
        record = SnapshotRecord(
            version=self.trainer.version,
            nbytes=flat.numel() * flat.element_size(),
            dtype=str(flat.dtype).removeprefix("torch."),
            digest=digest,
            transport=self.section.weight_transport,
            endpoint=endpoint,
        )
        await self.state.publish_snapshot(record)
        await self.state.set_version(self.trainer.version)

    async def expose_snapshot(self) -> None:
        """Core, on its way into training: make its weights readable by satellites from now on. The
        transport opens its listeners here, not at start-up (Mooncake listens on every interface)."""
        assert self.is_core
        if not self.exposed:
            self.exposed = True
            if self.connected.is_set():
                try:
                    await self.publish_snapshot()
                except BaseException:
                    # Not exposed after all: the retried SwitchRole exposes again instead of finding the
                    # flag set and leaving satellites without an endpoint to pull from.
                    self.exposed = False
                    raise

    async def optimizer_step(self) -> float:
        """Core: clip, step, version + 1, under the snapshot's sequence lock; returns the grad norm."""
        await self.state.begin_weights_change()

        def step() -> float:
            with self.weights_lock:
                return self.trainer.optimizer_step()

        norm = await self.compute.run(step)
        await self.publish_snapshot()
        return norm

    async def serve_pulls(self) -> None:
        """Core, `torch` transport: serve queued satellite pulls for as long as the cell runs."""
        assert self.is_core
        await self.connected.wait()
        if self.transport is None or not self.transport.core_serves:
            return
        while True:
            request = await self.state.next_pull()
            if request is None:
                await asyncio.sleep(self.section.poll_s)
                continue
            satellite, generation = request
            async with self.world.world_lock:
                transport = self.transport
                if generation != self.world.generation or transport is None:
                    log.warning(
                        "pull_of_another_world_dropped",
                        satellite=satellite,
                        generation=generation,
                        current=self.world.generation,
                    )
                    continue

                def serve(target: int = satellite, via: WeightTransport = transport) -> None:
                    with self.weights_lock:
                        assert self.trainer.version is not None
                        via.serve(self.trainer.flat_params, self.trainer.version, target)

                await asyncio.to_thread(serve)

    async def pull_snapshot(self, version: int, *, timeout_s: float = 60.0) -> bool:
        """Satellite: make this cell's weights the core's weights of `version`. False when the core has
        already moved past `version` (the step is over for this cell)."""
        assert not self.is_core and self.transport is not None
        began = time.monotonic()
        pulled = await self._pull_snapshot(version, timeout_s)
        self.metrics.snapshot_pull(pulled, time.monotonic() - began)
        return pulled

    async def _pull_snapshot(self, version: int, timeout_s: float) -> bool:
        assert self.transport is not None
        transport = self.transport
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if self.world.changed():
                raise CellUnavailableError(
                    f"cell {self.cell}: the cells' world is being re-formed; join again"
                )
            if loop.time() > deadline:
                raise CellUnavailableError(
                    f"no consistent snapshot of version {version} within {timeout_s} s"
                )
            read = await self.state.read_snapshot()
            if read is None or read.seq % 2 == 1:
                await asyncio.sleep(self.section.poll_s)
                continue
            if read.record.version != version:
                return False
            if not transport.core_serves and not read.record.endpoint:
                await asyncio.sleep(self.section.poll_s)  # the core has not exposed its weights yet
                continue
            if transport.core_serves:
                await self.state.request_pull(self.cell, self.world.generation)
            got = await self.compute.run(
                transport.pull, read.record.endpoint, self.trainer.flat_params, cell=self.cell
            )
            if got is not None and got != version:
                return False
            if got is None and await self.state.snapshot_seq() != read.seq:
                continue  # the core changed its weights while we read: read again
            if read.record.digest:
                digest = await self.compute.run(self.trainer.digest)
                if digest != read.record.digest:
                    raise SnapshotError(
                        f"snapshot of version {version} pulled with digest {digest[:12]}…, the core's is "
                        f"{read.record.digest[:12]}…"
                    )
            self.trainer.version = version
            log.info(
                "snapshot_pulled", policy_version=version, transport=transport.name, nbytes=read.record.nbytes
            )
            return True

    # -- checkpoints -------------------------------------------------------------------------------------
    async def checkpoint(self) -> Path | None:
        """Core: write a checkpoint of the current version unless one exists; then the micro-steps of the
        steps it covers are no longer needed for a replay and are dropped."""
        if not self.is_core or not self.built or self.trainer.version is None:
            return None
        if self.trainer.version == self.checkpointed_version:
            return None
        version = self.trainer.version
        path = await self.compute.run(self.trainer.save_checkpoint, self.checkpoint_root)
        previous = await self.state.checkpointed() or 0
        self.checkpointed_version = version
        await self.state.set_checkpointed(version)
        await drop_replay_payloads(self, range(previous, version))
        log.info("checkpoint_written", path=str(path), policy_version=version)
        return path

    async def close(self) -> None:
        await self.world.close()
        self.compute.close()
