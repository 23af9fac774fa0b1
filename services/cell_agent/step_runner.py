"""One cell's part in one optimizer step: join the window, claim micro-steps, reduce, (core) update.

    result = await StepRunner(training, emit, heartbeat_timeout_s=10).run("b7", step=7, final_in_burst=False)

Every cell of the step, core and satellites alike:

1. the core opens the step record for `step` (it must hold version `step`); a satellite waits for it
   and, holding other weights, pulls the core's snapshot of `step` first;
2. registers while the window is open (otherwise it sits this step out);
3. claims micro-steps from the batch's queue until the window closes: forward + backward per claim
   (gradients add up in the flat buffer), `mark_done`, and when the queue is momentarily empty it
   idles at that consistent point (the core tries to close the window there, everyone reclaims the
   claims of dead cells) and resumes when data lands — one warmup and one drain per batch;
4. the cells of the closed window reduce their gradients onto the core (SUM: every token already
   carries 1/(L_i·B·N)) over the pre-built prefix group of that size;
5. the core clips, steps, bumps the version and, after a non-final step, broadcasts the new weights
   to the participants; it records the step for `gyre audit` (every cell's micro-steps in the order it
   accumulated them, and the weights after the step: step_archive.py); everyone then acknowledges its
   claims and the core marks the step done.

A satellite whose agent is stopping (`TrainingSide.leaving`: a planned departure, the run's stop) leaves at
its next claim while the window is open — it evicts itself and gives back every micro-step it holds, done or
not, so the others redo them at once instead of after its heartbeat lapses; once the window closed it is a
participant and goes on to the reduction (the agent waits for it: CellAgent.leave_step).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace

from google.protobuf.message import Message

from gyre.log import get_logger
from gyre.rl.codec import decode_microstep
from gyre.rl.loss import LossMetrics
from gyre.store import Claim
from gyre.v1 import events_pb2 as ev
from services.cell_agent.errors import CellStateError, CellUnavailableError
from services.cell_agent.step_archive import archive_step
from services.cell_agent.step_record import Registration, StepRecord, StepState, StepStatus, consumer_name
from services.cell_agent.training import TrainingSide

log = get_logger("gyre.cell_agent.step")

Emit = Callable[[Message, str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class StepOutcome:
    batch_id: str
    step: int
    participated: bool
    """This cell's gradients went into the step."""
    cells: tuple[int, ...]
    """The cells of the reduction (empty when the window closed without this cell learning it)."""
    microsteps: int
    """Micro-steps this cell processed and kept (0 when it did not take part)."""
    loss: float
    """Loss of this cell's micro-steps."""
    policy_version: int | None
    """Policy version after the step."""
    final_in_burst: bool
    metrics: LossMetrics | None = None
    """Core only: the merged metrics of every participant."""
    grad_norm: float | None = None
    """Core only: the summed gradient's norm before clipping."""
    step_microsteps: int = 0
    """Core only: micro-steps of the step over all its cells."""
    duration_s: float = 0.0
    """Core only: seconds from JoinBatch to the optimizer step's end."""
    microstep_ids: tuple[str, ...] = ()
    """Core only: the micro-steps whose gradients went into the step."""


@dataclass(slots=True)
class _Work:
    """What this cell computed in the step so far (kept until the reduction)."""

    metrics: LossMetrics = field(default_factory=LossMetrics)
    processed: int = 0
    finished: set[str] = field(default_factory=set)
    accumulated: list[str] = field(default_factory=list)
    """Every micro-step whose gradient went into this cell's buffer since it was zeroed, in order (kept or
    not: what the reduction sums, and what the step's record says this cell contributed)."""

    def reset(self) -> None:
        self.metrics, self.processed, self.finished, self.accumulated = LossMetrics(), 0, set(), []


def metrics_json(metrics: LossMetrics) -> str:
    return json.dumps(asdict(metrics))


def metrics_from_json(text: str) -> LossMetrics:
    return LossMetrics(**json.loads(text))


class StepRunner:
    def __init__(self, training: TrainingSide, emit: Emit, *, heartbeat_timeout_s: float) -> None:
        self.training = training
        self.emit = emit
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.cell = training.cell
        self.section = training.section

    async def run(self, batch_id: str, step: int, final_in_burst: bool) -> StepOutcome:
        t = self.training
        started = time.monotonic()
        await t.wait_connected(self.section.join_timeout_s)
        record = StepRecord(t.redis, t.keys, batch_id, heartbeat_timeout_s=self.heartbeat_timeout_s)
        if t.is_core:
            status = await record.status(0)
            if status.state is StepState.DONE and status.step == step:
                return self._outcome(record, status, participated=False)  # a retried JoinBatch
            if t.trainer.version != step:
                raise CellStateError(
                    f"batch {batch_id!r} trains step {step}; the core holds policy version {t.trainer.version}"
                )
            if status.state is not None and batch_id not in t.started_batches:
                # An earlier core process began this step and died: what it gathered is void.
                await record.restart(t.num_cells)
                log.warning("step_restarted", batch=batch_id, step=step, was=status.state.value)
            t.started_batches.add(batch_id)
            status = await record.open(step, final_in_burst)
        else:
            status = await self._wait_opened(record)
        if status.step != step:
            raise CellStateError(f"batch {batch_id!r} was opened for step {status.step}, not {step}")
        if status.state is StepState.DONE:
            return self._outcome(record, status, participated=False)
        # Not in this step's reduction (joined too late, or left out): return at once, so the scheduler
        # learns it now; the cell pulls the next version when it joins the next batch.
        if status.state is not StepState.OPEN:
            return self._outcome(record, status, participated=False)
        if not t.is_core and t.trainer.version != step and not await t.pull_snapshot(step):
            return self._outcome(record, await record.status(self.cell), participated=False)
        registration = await record.register(self.cell, step)
        if registration is not Registration.REGISTERED:
            log.info("step_not_joined", batch=batch_id, step=step, reason=registration.value)
            return self._outcome(record, await record.status(self.cell), participated=False)
        await t.compute.run(t.trainer.zero_grads)
        status, work = await self._consume(record, step)
        if status.evicted or self.cell not in status.cells:
            await t.compute.run(t.trainer.zero_grads)
            log.warning(
                "step_left_out", batch=batch_id, step=step, evicted=status.evicted, cells=status.cells
            )
            return self._outcome(record, status, participated=False)
        return await self._reduce_and_update(record, status, work, started)

    def _outcome(
        self,
        record: StepRecord,
        status: StepStatus,
        *,
        participated: bool,
        microsteps: int = 0,
        loss: float = 0.0,
    ) -> StepOutcome:
        return StepOutcome(
            batch_id=record.batch_id,
            step=status.step if status.step is not None else -1,
            participated=participated,
            cells=status.cells,
            microsteps=microsteps,
            loss=loss,
            policy_version=status.version,
            final_in_burst=status.final_in_burst,
        )

    async def _wait_opened(self, record: StepRecord) -> StepStatus:
        """Satellite: wait until the core opened the record (JoinBatch may reach a satellite first)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.section.join_timeout_s
        while True:
            self._check_world()
            status = await record.status(-1)
            if status.state is not None:
                return status
            if loop.time() >= deadline:
                raise TimeoutError(
                    f"batch {record.batch_id!r} was not opened by the core within "
                    f"{self.section.join_timeout_s} s"
                )
            await asyncio.sleep(self.section.poll_s)

    def _check_world(self) -> None:
        """Satellite: leave the step when the cells' world is being re-formed (a cell restarted)."""
        if self.training.world.changed():
            raise CellUnavailableError(f"cell {self.cell}: the cells' world is being re-formed; join again")

    async def _heartbeat(self, record: StepRecord) -> None:
        while True:
            await record.heartbeat(self.cell)
            await asyncio.sleep(self.section.heartbeat_interval_s)

    async def _consume(self, record: StepRecord, step: int) -> tuple[StepStatus, _Work]:
        """Claim and compute until the window closes; returns the final status and what this cell
        computed (its metrics, kept micro-steps and what its gradient holds)."""
        t = self.training
        loop = asyncio.get_running_loop()
        work = _Work()
        last_reclaim = 0.0
        heartbeat = asyncio.create_task(self._heartbeat(record), name=f"heartbeat-{record.batch_id}")
        try:
            while True:
                if heartbeat.done():
                    heartbeat.result()
                if t.leaving.is_set() and not t.is_core and await record.evict_self(self.cell):
                    returned = await record.release(self.cell)
                    log.info("left_step", batch=record.batch_id, returned=returned, discarded=work.processed)
                    return replace(await record.status(self.cell), evicted=True), work
                claim = await record.queue.claim(consumer_name(self.cell))
                if claim is not None:
                    lost = claim.item_id in work.finished or not await self._compute(
                        record, step, claim, work
                    )
                    # An item this cell already computed came back to it, or its claim was taken away
                    # while it computed: its claims were reclaimed while it lapsed, so its gradient
                    # holds work others redo.
                    if lost and t.is_core:
                        await self._restart(record, work, "core_claims_reclaimed")
                    elif lost and (claim.item_id not in work.finished or await record.evict_self(self.cell)):
                        await record.release(self.cell)
                        log.warning("evicted_from_step", batch=record.batch_id, item=claim.item_id)
                        status = await record.status(self.cell)
                        return replace(status, evicted=True), work
                    continue
                status = await (record.try_close() if t.is_core else record.status(self.cell))
                if status.reason == "core_reset":
                    await self._restart(record, work, status.reason)
                    continue
                if status.evicted:
                    await record.release(self.cell)
                    return status, work
                if status.state is StepState.CLOSING and self.cell in status.cells:
                    await record.confirm(self.cell)
                elif status.state is not StepState.OPEN:
                    return status, work
                if self.training.world.changed():
                    await record.evict_self(self.cell)
                    await record.release(self.cell)
                    self._check_world()
                if loop.time() - last_reclaim >= self.section.heartbeat_interval_s:
                    last_reclaim = loop.time()
                    reclaimed = await record.queue.reclaim_dead()
                    if reclaimed:
                        log.warning("microsteps_reclaimed", batch=record.batch_id, items=reclaimed)
                await asyncio.sleep(self.section.poll_s)
        finally:
            heartbeat.cancel()

    async def _compute(self, record: StepRecord, step: int, claim: Claim, work: _Work) -> bool:
        """Forward + backward of a claimed micro-step; False when the claim no longer counts."""
        t = self.training
        microstep = decode_microstep(claim.payload)
        if microstep.batch_id != record.batch_id or microstep.step != step:
            raise ValueError(
                f"micro-step {claim.item_id} of batch {microstep.batch_id!r} step {microstep.step} "
                f"found in the queue of batch {record.batch_id!r} step {step}"
            )
        await self.emit(
            ev.MicroStepClaimed(
                batch_id=record.batch_id, step=step, microstep_id=claim.item_id, cell=self.cell
            ),
            f"microstep:{record.batch_id}:{claim.item_id}:claimed:{self.cell}",
        )
        began = time.perf_counter()
        result = await t.compute.run(t.trainer.accumulate, microstep)
        work.accumulated.append(claim.item_id)
        duration = time.perf_counter() - began
        t.microsteps_processed += 1
        t.metrics.microstep(duration, microstep.num_tokens)
        merged = work.metrics.merge(result.metrics)
        if not await record.mark_done(self.cell, claim.item_id, metrics_json(merged)):
            return False
        work.metrics = merged
        work.processed += 1
        work.finished.add(claim.item_id)
        await self.emit(
            ev.MicroStepDone(
                batch_id=record.batch_id,
                step=step,
                microstep_id=claim.item_id,
                cell=self.cell,
                duration_s=duration,
                num_tokens=microstep.num_tokens,
            ),
            f"microstep:{record.batch_id}:{claim.item_id}:done:{self.cell}",
        )
        return True

    async def _restart(self, record: StepRecord, work: _Work, reason: str) -> None:
        """The core lapsed and lost claims: it cannot leave the step, so it starts its part over."""
        returned = await record.reset(self.cell)
        await self.training.compute.run(self.training.trainer.zero_grads)
        log.warning(
            "core_restarts_its_part",
            batch=record.batch_id,
            reason=reason,
            returned=returned,
            discarded=work.processed,
        )
        work.reset()

    async def _reduce_and_update(
        self, record: StepRecord, status: StepStatus, work: _Work, started: float
    ) -> StepOutcome:
        t = self.training
        cells = status.cells
        n = len(cells)
        metrics, processed = work.metrics, work.processed
        # Before the collective: the core reads every participant's list once the reduction is over.
        await record.set_accumulated(self.cell, work.accumulated)
        if t.groups is not None and n > 1:
            await t.compute.run(t.groups.reduce_to_core, t.trainer.flat_grads, n)
        if not t.is_core:
            await t.compute.run(t.trainer.zero_grads)
            if not status.final_in_burst and t.groups is not None and n > 1:
                await t.compute.run(t.groups.broadcast_from_core, t.trainer.flat_params, n)
                t.trainer.version = (status.step or 0) + 1
            await record.ack_all(self.cell)
            done = await record.wait_done(
                self.section.collective_timeout_s, self.section.poll_s, check=self._check_world
            )
            return self._outcome(record, done, participated=True, microsteps=processed, loss=metrics.loss)

        merged = LossMetrics()
        for text in (await record.metrics(cells)).values():
            merged = merged.merge(metrics_from_json(text))
        applied = await record.done_items(cells)
        grad_norm = await t.optimizer_step()
        version = t.trainer.version
        assert version is not None
        if not status.final_in_burst and t.groups is not None and n > 1:
            await t.compute.run(t.groups.broadcast_from_core, t.trainer.flat_params, n)
        await archive_step(
            t,
            batch_id=record.batch_id,
            step=version - 1,
            cells=cells,
            accumulated=await record.accumulated(cells),
            applied=applied,
            grad_norm=grad_norm,
            final_in_burst=status.final_in_burst,
        )
        await record.ack_all(self.cell)
        every = self.section.checkpoint_every_steps
        if every and version % every == 0:  # before the step counts as done: a restart resumes after it
            await t.checkpoint()
        await record.finish(version)
        num_microsteps = len(applied)
        return StepOutcome(
            batch_id=record.batch_id,
            step=version - 1,
            participated=True,
            cells=cells,
            microsteps=processed,
            loss=metrics.loss,
            policy_version=version,
            final_in_burst=status.final_in_burst,
            metrics=merged,
            grad_norm=grad_norm,
            step_microsteps=num_microsteps,
            duration_s=time.monotonic() - started,
            microstep_ids=tuple(sorted(applied)),
        )
