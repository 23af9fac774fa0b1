"""CellAgent: one cell's role, rollout engine and training side, and the four operations the scheduler
calls (the gRPC servicer is a thin translation of these).

    agent = CellAgent(config, model=ModelDir.open(config.model), cell=k, redis=redis, emit=publish)
    await agent.start()                                   # engine serving, role ROLLOUT
    await agent.switch_role(TRAINING)                     # hand back in-flight calls, free engine memory
    outcome = await agent.join_batch("b7", step=7, final_in_burst=True)
    await agent.switch_role(ROLLOUT, weight_version=8)

Rollout → training: stop admitting, abort what is in flight (the proxy retries it elsewhere; the
count is reported), release the engine's KV cache (and weights where configured). The trainer and the
communication groups stay resident across switches. Training → rollout: take the memory back, load the
newest published weights (the core's published HF directory `published/v<version>/`, named in Redis;
a satellite streams it from the core first unless `cell_agent.published_weights: shared`:
published_weights.py), admit again, report ready. A switch to rollout asking for version v
waits until v is published.

Weight publication (core): after the final step of a burst, and on an explicit PublishWeights, the
core writes the published directory and pushes the weights to every rollout engine with the new weight
version — its own in-process, the others' by `cell_agent.trainer.publication` (tensor, disk or
distributed: `publication.py`); engines flush their prefix cache and keep running requests unless
`publish_abort_requests` — then emits WeightsPublished.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import grpc
import redis.asyncio as aioredis
import torch
from google.protobuf.message import Message
from prometheus_client import CollectorRegistry

from gyre.config import GyreConfig
from gyre.config.infra import WILDCARD_HOSTS
from gyre.ids import cell_engine_id
from gyre.log import get_logger
from gyre.model.lora import LoraAdapter, frozen_adapter
from gyre.model.model_dir import ModelDir
from gyre.rl.loss import ObjectiveParams
from gyre.roles import ROLLOUT, TRAINING, CellRole, role_name
from gyre.rpc import aio_channel
from gyre.store import Keys
from gyre.trainer.checkpoint import published_path, write_published
from gyre.v1 import cell_agent_pb2
from gyre.v1 import events_pb2 as ev
from services.cell_agent.detached import Detached
from services.cell_agent.engine_hosts import EngineHost, create_engine_host
from services.cell_agent.errors import CellStateError, CellUnavailableError
from services.cell_agent.metrics import CellAgentMetrics
from services.cell_agent.publication import Publisher
from services.cell_agent.published_weights import PublishedWeights, stream_publication
from services.cell_agent.replay import report_replayed
from services.cell_agent.roles import RoleMachine
from services.cell_agent.step_fields import correction_fields
from services.cell_agent.step_runner import StepOutcome, StepRunner
from services.cell_agent.trainer_state import EngineEntry, Published
from services.cell_agent.training import TrainingSide

log = get_logger("gyre.cell_agent")

LEAVE_STEP_S = 5.0
"""How long a stopping satellite waits to leave its step (or finish its reduction) before it is cancelled:
within the 8 s a service gives its own shutdown."""

Emit = Callable[[Message, str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class SwitchResult:
    role: CellRole
    duration_s: float
    requests_handed_back: int
    weight_version: int


@dataclass(frozen=True, slots=True)
class PublishTarget:
    engine_id: str
    url: str
    cell: int


@dataclass(frozen=True, slots=True)
class PublishResult:
    policy_version: int
    duration_s: float
    engine_ids: tuple[str, ...]
    path: str


@dataclass(frozen=True, slots=True)
class CellView:
    cell: int
    role: CellRole
    engine_id: str
    engine_url: str
    policy_version: int | None
    engine_weight_version: str
    batch_id: str
    microsteps_processed: int
    weights_digest: str


class CellAgent:
    def __init__(
        self,
        config: GyreConfig,
        *,
        model: ModelDir,
        cell: int,
        redis: aioredis.Redis,
        emit: Emit,
        engine: EngineHost | None = None,
        metrics: CellAgentMetrics | None = None,
    ) -> None:
        self.config = config
        self.model = model
        """The run's model directory, read once at the service's start (what the engine falls back to and
        publications copy their tokenizer files from)."""
        self.section = config.cell_agent
        self.cell = cell
        self.num_cells = config.scheduler.num_cells
        if not 0 <= cell < self.num_cells:
            raise ValueError(f"cell {cell} is outside 0..{self.num_cells - 1} (scheduler.num_cells)")
        self.is_core = cell == 0
        if 2 * self.section.trainer.heartbeat_interval_s >= config.redis.heartbeat_timeout_s:
            raise ValueError(
                f"cell_agent.trainer.heartbeat_interval_s ({self.section.trainer.heartbeat_interval_s}) must be under "
                f"half of redis.heartbeat_timeout_s ({config.redis.heartbeat_timeout_s}), or live cells lose their claims"
            )
        self.emit = emit
        self.engine_id = cell_engine_id(cell)
        engine_section = self.section.engine
        if cell < len(self.section.engine_ports):
            engine_section = engine_section.model_copy(update={"port": self.section.engine_ports[cell]})
        self.engine = engine or create_engine_host(
            engine_section, model.path, log_path=config.run.path / "logs" / f"engine-{cell}.log"
        )
        self.checkpoint_root = Path(self.section.trainer.checkpoint_dir or config.run.path / "checkpoints")
        self.metrics = metrics or CellAgentMetrics(CollectorRegistry(), cell)
        self.training = TrainingSide(
            cell=cell,
            num_cells=self.num_cells,
            section=self.section.trainer,
            model_dir=model.path,
            objective=ObjectiveParams(**config.objective.model_dump()),
            redis=redis,
            keys=Keys(config.run.id),
            checkpoint_root=self.checkpoint_root,
            own_host=config.run.peer_host("cell_agent", cell),
            core_host=config.run.peer_host("cell_agent", 0),
            bind_host=config.run.host,
            metrics=self.metrics,
        )
        if config.archive.steps:  # the training record `gyre audit` replays (step_archive.py)
            self.training.keep_step_records(
                config.archive.path_for(config.run.path),
                weights_every=config.archive.weights_every_steps,
                compress_level=config.archive.compress_level,
            )
        self.state = self.training.state
        self.publisher = Publisher(
            self.section.trainer,
            bind_host=config.run.host,
            advertise_host=config.run.peer_host("cell_agent", cell),
            timeout_s=self.section.publish_timeout_s,
            run_id=config.run.id,
        )
        self._core_channel: grpc.aio.Channel | None = None
        self.published_weights = PublishedWeights(
            mode=self.section.published_weights,
            cell=cell,
            own_root=self.checkpoint_root,
            channel=self._channel_to_core,
            newest=self.state.published,
            timeout_s=self.section.engine_ready_timeout_s,
            keep=2,
        )
        self.roles = RoleMachine(ROLLOUT)
        self.metrics.role = lambda: role_name(self.roles.role)
        self.metrics.policy_version = lambda: self.training.trainer.version
        self.heartbeat_timeout_s = config.redis.heartbeat_timeout_s
        self.batch_id = ""
        self._switch_lock = asyncio.Lock()
        self._batch_lock = asyncio.Lock()
        self._publish_lock = asyncio.Lock()
        self._published_event_version: int | None = None
        self._ops = Detached()
        """Switches, steps and publications run detached from the RPC that asked (detached.py)."""
        self.engine.weights_on_restart = self._newest_published
        self.engine.on_restarted = self._engine_restarted

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        torch.set_num_threads(self.section.engine.num_threads)
        await self.engine.start()
        self.training.on_replayed = lambda steps: report_replayed(self.training, self.emit, steps)
        replayed = await self.training.start()
        await report_replayed(self.training, self.emit, replayed)
        published = await self.state.published()
        if published is not None and await self.engine.weight_version() != str(published.version):
            await self.engine.load_weights(*await self.published_weights.local(published))
        await self._register_engine()
        log.info(
            "cell_agent_started", cell=self.cell, engine=self.engine_url, role=role_name(self.roles.role)
        )

    async def background(self) -> list[Coroutine[Any, Any, None]]:
        """Coroutines the service supervises: the collectives across cell restarts, and (core) serving pulls."""
        tasks: list[Coroutine[Any, Any, None]] = [self.training.keep_world(), self.training.world.heartbeat()]
        if self.is_core:
            tasks.append(self.training.serve_pulls())
        return tasks

    async def _newest_published(self) -> tuple[Path, int] | None:
        """The newest publication as this cell's files (a satellite streams it from the core first)."""
        published = await self.state.published()
        return None if published is None else await self.published_weights.local(published)

    async def _engine_restarted(self) -> None:
        """The engine died and its host restarted it with the newest publication at that moment: in the
        rollout role, serve one published since (each push to it failed while it was down), then register
        it again. A switch in progress finishes first (it waited for the restart itself)."""
        async with self._switch_lock:
            loaded = ""
            while self.roles.role == ROLLOUT:
                newest = await self._newest_published()
                serving = await self.engine.weight_version()
                if newest is None or serving == str(newest[1]) or loaded == str(newest[1]):
                    break
                await self.engine.load_weights(*newest)
                loaded = str(newest[1])
            await self._register_engine()
            log.warning(
                "engine_restarted",
                cell=self.cell,
                role=role_name(self.roles.role),
                engine_weight_version=await self.engine.weight_version(),
            )

    async def leave_step(self, timeout_s: float = LEAVE_STEP_S) -> None:
        """A satellite being stopped (a planned departure, the run's stop) leaves its step first, while its
        service still runs: while the window is open it gives its claims back at once (the others need not
        wait for its heartbeat to lapse); once the window closed it is a participant, and it finishes the
        reduction instead of failing the others' collective. Waits at most `timeout_s`."""
        if self.is_core or not self._batch_lock.locked():
            return
        self.training.leaving.set()
        if not await self._ops.wait_for("join", timeout_s):
            log.warning("step_not_left", batch=self.batch_id, waited_s=timeout_s)

    async def stop(self) -> None:
        self._ops.cancel_all()
        if self.is_core:
            await self.training.checkpoint()
            await self.publisher.close()
        await self.engine.stop()
        await self.training.close()
        if self._core_channel is not None:
            await self._core_channel.close()

    # -- roles -----------------------------------------------------------------------------------------
    async def switch_role(self, to_role: CellRole, weight_version: int = 0) -> SwitchResult:
        return await self._ops.run(
            ("switch", to_role, weight_version), lambda: self._switch_role(to_role, weight_version)
        )

    async def _switch_role(self, to_role: CellRole, weight_version: int) -> SwitchResult:
        async with self._switch_lock:
            if self.roles.role == to_role:
                return SwitchResult(to_role, 0.0, 0, self._as_version(await self.engine.weight_version()))
            if self._batch_lock.locked():
                raise CellStateError(
                    f"cell {self.cell} is training on batch {self.batch_id!r}; switch after it"
                )
            transition = self.roles.begin(to_role)
            seq = await self.state.next_transition(self.cell)
            await self.emit(
                ev.RoleTransitionBegun(cell=self.cell, from_role=transition.from_role, to_role=to_role),
                f"cell:{self.cell}:transition:{seq}:begun",
            )
            try:
                if to_role == TRAINING:
                    handed_back = await self._to_training()
                    version = 0
                else:
                    handed_back = 0
                    version = await self._to_rollout(weight_version)
            except BaseException:
                self.roles.fail()
                log.error("role_transition_failed", cell=self.cell, to_role=role_name(to_role))
                raise
            done = self.roles.complete()
            duration = done.elapsed_s()
            self.metrics.switched(role_name(to_role), duration)
            await self._register_engine()
            await self.emit(
                ev.RoleTransitionCompleted(
                    cell=self.cell,
                    from_role=transition.from_role,
                    to_role=to_role,
                    duration_s=duration,
                    requests_handed_back=handed_back,
                    weight_version=version,
                ),
                f"cell:{self.cell}:transition:{seq}:completed",
            )
            log.info(
                "role_switched",
                cell=self.cell,
                role=role_name(to_role),
                duration_s=round(duration, 4),
                requests_handed_back=handed_back,
                weight_version=version,
            )
            return SwitchResult(to_role, duration, handed_back, version)

    async def _to_training(self) -> int:
        handed_back = await self.engine.hand_back()
        await self.engine.release(weights=self.section.release_engine_weights)
        torch.set_num_threads(self.section.trainer.num_threads)
        if self.is_core:
            await self.training.expose_snapshot()
        return handed_back

    async def _to_rollout(self, weight_version: int) -> int:
        published: Published | None
        if weight_version > 0:
            published = await self.state.wait_published(weight_version, self.section.engine_ready_timeout_s)
        else:
            published = await self.state.published()
        await self.engine.resume()
        serving = await self.engine.weight_version()
        if published is not None and (self.engine.weights_released or serving != str(published.version)):
            await self.engine.load_weights(*await self.published_weights.local(published))
        elif self.engine.weights_released:
            await self.engine.load_weights(self.model.path, 0)
        torch.set_num_threads(self.section.engine.num_threads)
        await self.engine.reopen()
        await self.engine.wait_ready(self.section.engine_ready_timeout_s)
        return self._as_version(await self.engine.weight_version())

    @property
    def engine_url(self) -> str:
        """The engine's URL as other hosts dial it: an engine bound to every interface (`0.0.0.0`, a
        container's or pod's) is reached at this cell's peer host (`run.peer_hosts`), not at 0.0.0.0."""
        url = urlsplit(self.engine.url)
        if self.config.cell_agent.engine.host not in WILDCARD_HOSTS:
            return self.engine.url
        port = f":{url.port}" if url.port else ""
        return urlunsplit(url._replace(netloc=f"{self.config.run.peer_host('cell_agent', self.cell)}{port}"))

    def _channel_to_core(self) -> grpc.aio.Channel:
        """The gRPC channel to the core's agent (opened at first use, on the running event loop)."""
        if self._core_channel is None:
            ports = self.section.ports
            if not ports:
                raise CellUnavailableError("cell_agent.ports must name the core's port to fetch its weights")
            target = f"{self.config.run.peer_host('cell_agent', 0)}:{ports[0]}"
            self._core_channel = aio_channel(target)
        return self._core_channel

    async def stream_published(self, version: int) -> AsyncIterator[cell_agent_pb2.PublishedChunk]:
        """Core: the files of publication `version` for a cell that shares no disk with it."""
        if not self.is_core:
            raise CellStateError(f"cell {self.cell} is a satellite; publications are fetched from the core")
        async for chunk in stream_publication(self.checkpoint_root, version):
            yield chunk

    async def _register_engine(self) -> None:
        role = self.roles.role
        await self.state.set_engine(
            EngineEntry(
                self.cell,
                self.engine_id,
                self.engine_url,
                role_name(role),
                await self.engine.weight_version(),
            )
        )

    @staticmethod
    def _as_version(text: str) -> int:
        return int(text) if text.isdigit() else 0

    # -- training ----------------------------------------------------------------------------------------
    async def join_batch(self, batch_id: str, step: int, final_in_burst: bool) -> StepOutcome:
        if not batch_id:
            raise ValueError("batch_id must be set")
        if self.roles.role != TRAINING:
            raise CellStateError(
                f"cell {self.cell} is in {role_name(self.roles.role)}; switch it to training first"
            )
        return await self._ops.run(
            ("join", batch_id), lambda: self._join_batch(batch_id, step, final_in_burst)
        )

    async def _join_batch(self, batch_id: str, step: int, final_in_burst: bool) -> StepOutcome:
        async with self._batch_lock, self.training.step_lock:
            self.batch_id = batch_id
            began = time.monotonic()
            try:
                runner = StepRunner(self.training, self.emit, heartbeat_timeout_s=self.heartbeat_timeout_s)
                outcome = await runner.run(batch_id, step, final_in_burst)
            finally:
                self.batch_id = ""
            if outcome.participated:
                self.metrics.step(time.monotonic() - began)
            if self.is_core and outcome.participated:
                await self._step_completed(outcome)
        return outcome

    async def _step_completed(self, outcome: StepOutcome) -> None:
        metrics = outcome.metrics
        assert metrics is not None and outcome.policy_version is not None
        clip_fraction = (
            metrics.num_clipped_executions / metrics.num_executions if metrics.num_executions else 0.0
        )
        trained = metrics.num_targets > 0 and metrics.num_scored_executions > 0
        fields = correction_fields(metrics)
        await self.emit(
            ev.StepCompleted(
                batch_id=outcome.batch_id,
                policy_version=outcome.policy_version,
                cells=list(outcome.cells),
                num_microsteps=outcome.step_microsteps,
                loss=metrics.loss,
                grad_norm=outcome.grad_norm or 0.0,
                duration_s=outcome.duration_s,
                num_targets=metrics.num_targets,
                clip_fraction=clip_fraction,
                final_in_burst=outcome.final_in_burst,
                token_ratio_min=metrics.token_ratio_min if trained else 0.0,
                token_ratio_mean=metrics.token_ratio_mean if trained else 0.0,
                token_ratio_max=metrics.token_ratio_max if trained else 0.0,
                sequence_ratio_min=metrics.seq_ratio_min if trained else 0.0,
                sequence_ratio_mean=metrics.seq_ratio_mean if trained else 0.0,
                sequence_ratio_max=metrics.seq_ratio_max if trained else 0.0,
                microstep_ids=list(outcome.microstep_ids),
                **fields,
            ),
            f"step:{outcome.batch_id}:{outcome.policy_version}",
        )
        self.metrics.step_objective(clip_fraction, fields)
        log.info(
            "step_completed",
            batch=outcome.batch_id,
            policy_version=outcome.policy_version,
            cells=outcome.cells,
            loss=metrics.loss,
            grad_norm=outcome.grad_norm,
        )
        if outcome.final_in_burst:
            await self.publish_weights(None)

    # -- publication -------------------------------------------------------------------------------------
    async def publish_weights(self, targets: Sequence[PublishTarget] | None) -> PublishResult:
        """Core: publish the current weights (file + Redis record) and push them to rollout engines
        (`targets`, or every cell engine registered in the rollout role)."""
        if not self.is_core:
            raise CellStateError(f"cell {self.cell} is a satellite; only the core (cell 0) publishes weights")
        return await self._ops.run(
            ("publish", tuple(targets) if targets is not None else None),
            lambda: self._publish_weights(targets),
        )

    async def _publish_weights(self, targets: Sequence[PublishTarget] | None) -> PublishResult:
        async with self._publish_lock:
            started = time.monotonic()
            t = self.training
            version = t.trainer.version
            assert version is not None
            path = published_path(self.checkpoint_root, version)

            def freeze() -> tuple[dict[str, torch.Tensor], LoraAdapter | None]:
                named = {name: w.detach().clone() for name, w in t.trainer.named_weights().items()}
                adapter = frozen_adapter(t.trainer.adapter, named)
                if not path.exists():
                    write_published(
                        self.checkpoint_root,
                        version=version,
                        arch=t.trainer.arch,
                        tensors=named,
                        source=self.model.path,
                        adapter=adapter,
                    )
                return named, adapter

            named, adapter = await t.compute.run(freeze)
            await self.state.set_published(version, str(path))
            if targets is None:
                entries = await self.state.engines(self.num_cells)
                targets = [
                    PublishTarget(e.engine_id, e.url, e.cell) for e in entries if e.role == role_name(ROLLOUT)
                ]
            results = await asyncio.gather(
                *(self._push(target, named, adapter, version, path) for target in targets),
                return_exceptions=True,
            )
            updated: list[str] = []
            for target, result in zip(targets, results, strict=True):
                if isinstance(result, BaseException):
                    log.error(
                        "weights_push_failed", engine=target.engine_id, url=target.url, error=repr(result)
                    )
                else:
                    updated.append(target.engine_id)
            duration = time.monotonic() - started
            self.metrics.published(duration)
            if self._published_event_version != version:
                await self.emit(
                    ev.WeightsPublished(
                        policy_version=version,
                        engine_ids=updated,
                        duration_s=duration,
                        checkpoint_path=str(path),
                    ),
                    f"weights:{version}",
                )
                self._published_event_version = version
            log.info(
                "weights_published", policy_version=version, engines=updated, duration_s=round(duration, 4)
            )
            return PublishResult(version, duration, tuple(updated), str(path))

    async def _push(
        self,
        target: PublishTarget,
        named: dict[str, torch.Tensor],
        adapter: LoraAdapter | None,
        version: int,
        path: Path,
    ) -> None:
        """Make `target`'s engine serve `version`: the weights, or under LoRA the adapter."""
        if target.cell == self.cell:
            if self.roles.role != ROLLOUT:
                return
            if adapter is not None:
                await self.engine.push_adapter(adapter, version)
            else:
                await self.engine.push_weights(
                    named, version, abort_requests=self.section.trainer.publish_abort_requests
                )
        elif adapter is not None:
            base = self.model.path
            await self.publisher.push_adapter(target.url, adapter, version=version, path=path, base=base)
        else:
            await self.publisher.push(target.url, named, version=version, path=path)

    # -- status --------------------------------------------------------------------------------------------
    async def view(self) -> CellView:
        t = self.training
        version = t.trainer.version if t.built else None
        digest = await t.compute.run(t.trainer.digest) if version is not None else ""
        return CellView(
            cell=self.cell,
            role=self.roles.role,
            engine_id=self.engine_id,
            engine_url=self.engine_url,
            policy_version=version,
            engine_weight_version=await self.engine.weight_version(),
            batch_id=self.batch_id,
            microsteps_processed=t.microsteps_processed,
            weights_digest=digest,
        )
