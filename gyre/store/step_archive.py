"""The training record of a run: every optimizer step's micro-steps as applied, and the weights after it.

What `gyre audit` replays (app/audit/replay.py): from the run's initial weights, each step's micro-steps,
cell by cell in the order each cell accumulated them, summed over the cells of the reduction, one optimizer
step; the result is compared with the weights the run had after that step. The core writes one file per
step, after its optimizer step and before the step counts as done (services/cell_agent/step_archive.py):

    <archive>/steps/<batch>.json.gz          the step: cells of the reduction, each cell's accumulated
                                             micro-step ids in order, every payload (the `gyre.rl.codec`
                                             bytes the cells decoded), the gradient norm, the version
    <archive>/weights/v<version>.safetensors the weights after the step (`TrainerBackend.named_weights`,
                                             in the trainer's dtype), every `weights_every_steps` steps

    write_step_record(archive_dir, StepRecordFile(...), weights=trainer.named_weights())
    for record in read_step_records(run_dir): ...

A step taken again by a restarted core (services/cell_agent/replay.py: the steps after its newest
checkpoint, from their stored micro-steps) replaces its file: the weights that exist now are the replay's,
so the record says how the replay made them (one cell, the micro-steps in id order). Files are written
atomically (temporary file, fsync, rename, fsync of the directory).
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from gyre.durable import replace_durable
from gyre.trajectory.archive import archive_dir_of

STEP_FORMAT = "gyre-step-archive/1"
_WEIGHTS = re.compile(r"^v(\d{8})\.safetensors$")


@dataclass(frozen=True, slots=True)
class StepRecordFile:
    """One optimizer step as the core took it."""

    batch_id: str
    step: int
    version: int
    """Policy version after the step (step + 1)."""
    cells: tuple[int, ...]
    """The cells whose gradients were summed (a prefix 0..n−1; (0,) for a replayed step)."""
    accumulated: dict[int, list[str]]
    """Cell → the micro-step ids it accumulated into its gradient since it last zeroed it, in order."""
    applied: list[str]
    """The micro-steps the step record counts as done by those cells (Redis `done:<cell>` sets)."""
    payloads: dict[str, bytes]
    """Micro-step id → its encoded bytes (`gyre.rl.codec`), for every id above."""
    grad_norm: float
    """The summed gradient's norm before clipping, as the core computed it."""
    final_in_burst: bool = False
    replayed: bool = False
    """Taken again by a restarted core from the stored micro-steps."""
    weights_file: str | None = None
    """The weights after the step, relative to the archive directory (None when not kept)."""
    extra: dict[str, Any] = field(default_factory=dict)


def steps_dir(archive_dir: Path) -> Path:
    return Path(archive_dir) / "steps"


def step_path(archive_dir: Path, batch_id: str) -> Path:
    return steps_dir(archive_dir) / f"{batch_id}.json.gz"


def weights_path(archive_dir: Path, version: int) -> Path:
    return Path(archive_dir) / "weights" / f"v{version:08d}.safetensors"


def write_step_record(
    archive_dir: Path,
    record: StepRecordFile,
    *,
    weights: Mapping[str, torch.Tensor] | None = None,
    compress_level: int = 6,
) -> int:
    """Write the step's file (and the weights after it, when given); returns the bytes written."""
    written = 0
    weights_file = record.weights_file
    if weights is not None:
        target = weights_path(archive_dir, record.version)
        host = {name: t.detach().to("cpu").contiguous() for name, t in weights.items()}
        data = save(host, metadata={"gyre_policy_version": str(record.version)})
        replace_durable(target, data)
        written += len(data)
        weights_file = str(target.relative_to(archive_dir))
    document = {
        "format": STEP_FORMAT,
        "batch_id": record.batch_id,
        "step": record.step,
        "version": record.version,
        "cells": list(record.cells),
        "accumulated": {str(c): list(ids) for c, ids in record.accumulated.items()},
        "applied": sorted(record.applied),
        "payloads": {k: base64.b64encode(v).decode() for k, v in sorted(record.payloads.items())},
        "grad_norm": record.grad_norm,
        "final_in_burst": record.final_in_burst,
        "replayed": record.replayed,
        "weights_file": weights_file,
        "extra": record.extra,
    }
    data = gzip.compress(json.dumps(document, sort_keys=True).encode(), compress_level, mtime=0)
    replace_durable(step_path(archive_dir, record.batch_id), data)
    return written + len(data)


def read_step_record(path: Path) -> StepRecordFile:
    """A step file; a ValueError names the file when it is not one."""
    try:
        d = json.loads(gzip.decompress(Path(path).read_bytes()))
    except (OSError, EOFError, ValueError) as e:
        raise ValueError(f"{path}: not a gzip JSON step archive ({e})") from None
    if not isinstance(d, dict) or d.get("format") != STEP_FORMAT:
        raise ValueError(f"{path}: not a Gyre step archive ({STEP_FORMAT})")
    return StepRecordFile(
        batch_id=str(d["batch_id"]),
        step=int(d["step"]),
        version=int(d["version"]),
        cells=tuple(int(c) for c in d["cells"]),
        accumulated={int(c): [str(i) for i in ids] for c, ids in d["accumulated"].items()},
        applied=[str(i) for i in d["applied"]],
        payloads={k: base64.b64decode(v) for k, v in d["payloads"].items()},
        grad_norm=float(d["grad_norm"]),
        final_in_burst=bool(d.get("final_in_burst", False)),
        replayed=bool(d.get("replayed", False)),
        weights_file=d.get("weights_file"),
        extra=dict(d.get("extra") or {}),
    )


def read_step_records(directory: Path) -> list[StepRecordFile]:
    """Every step file of a run (or archive) directory, in step order."""
    found = sorted(steps_dir(archive_dir_of(directory)).glob("*.json.gz"))
    return sorted((read_step_record(p) for p in found), key=lambda r: r.step)


def archived_weights(directory: Path) -> dict[int, Path]:
    """Policy version → the weights file kept after that step, for a run (or archive) directory."""
    folder = archive_dir_of(directory) / "weights"
    if not folder.is_dir():
        return {}
    return dict(sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _WEIGHTS.match(p.name))))


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))
