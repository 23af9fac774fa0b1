"""`gyre audit RUN`: a finished run's outcome recomputed from primary data, not from the events its services
published about themselves.

    report = audit_run(Path("runs/demo-…"))     # AuditReport
    report.ok, report.defects, report.to_json()

Four parts, each with its own module:

- **replay** (`replay.py`, `reduction.py`): the training recomputed from the run's initial weights and its
  recorded micro-steps with the run's own trainer backend, compared with the weights the run kept after
  each step, its checkpoints and its publications (a replay that cannot run is a defect, unless
  `replay=False`);
- **objective** (`microsteps.py`, `recompute.py`, `objective.py`, `gradients.py`): what the replay takes
  on trust, recomputed — each trained group's advantages from the evaluator's rewards, admission and rows
  from the trajectory trees, the coefficients, compared field by field with the micro-steps (every valid
  member in them, no token the engine did not sample a target); and, during the replay, each micro-step's
  gradient from the trainer's loss against that of the audit's own objective, written independently; from
  the same forward, each step's train/inference mismatch and each correction's clip and mask fractions
  (`corrections.py`), compared with what the trainer logged for the step (`metrics.jsonl`);
- **ledger** (`ledger.py`): group → the step that trained it and its staleness, from the packer's batch
  files and the scheduler's dispatch records;
- **accounting** (`accounting.py`): every dispatched execution in exactly one terminal state, from the
  scheduler's counters and the runner's and evaluator's own records.

Each part lists its defects (one line each, naming what is wrong and where); the ledger and the accounting
are also compared with the run's report (`summary.json`, `events.jsonl`). A run passes when no part found a
defect. `gyre audit` exits 1 when one did, 2 when the directory is not a finished run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.audit.accounting import AccountingResult, account_executions
from app.audit.data import AuditInputError, RunData
from app.audit.ledger import LedgerResult, build_ledger
from app.audit.microsteps import ObjectiveResult, check_microsteps
from app.audit.replay import ReplayResult, replay_training


@dataclass(slots=True)
class AuditReport:
    run_dir: Path
    replay: ReplayResult
    ledger: LedgerResult
    accounting: AccountingResult
    objective: ObjectiveResult
    seconds: float

    @property
    def defects(self) -> list[str]:
        return [
            *(f"replay: {d}" for d in self.replay.defects),
            *(f"ledger: {d}" for d in self.ledger.defects),
            *(f"accounting: {d}" for d in self.accounting.defects),
            *(f"objective: {d}" for d in self.objective.defects),
        ]

    @property
    def ok(self) -> bool:
        return not self.defects

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "ok": self.ok,
            "defects": self.defects,
            "replay": self.replay.to_json(),
            "ledger": self.ledger.to_json(),
            "accounting": self.accounting.to_json(),
            "objective": self.objective.to_json(),
            "seconds": round(self.seconds, 1),
        }


def audit_run(
    run_dir: Path,
    *,
    replay: bool = True,
    probe: bool = True,
    progress: Callable[[str], None] | None = None,
    redis_url: str | None = None,
) -> AuditReport:
    """Audit a finished run (an AuditInputError when `run_dir` is not one). `redis_url`: read the run's
    Redis records from that server (one serving the run's data, stopped for writes) instead of from a copy
    of `run_dir/redis` loaded into a redis-server of the audit's own."""
    t0 = time.monotonic()
    data = RunData.load(Path(run_dir), redis_url=redis_url)
    book = build_ledger(data)
    counted = account_executions(data, book.group_step)
    checked = check_microsteps(data, book.group_step)
    if replay:
        replayed = replay_training(data, probe=probe, progress=progress, objective=checked)
    else:
        replayed, checked.skipped = ReplayResult(skipped="--no-replay"), "--no-replay"
    return AuditReport(Path(run_dir), replayed, book, counted, checked, time.monotonic() - t0)


__all__ = ["AuditInputError", "AuditReport", "RunData", "audit_run"]
