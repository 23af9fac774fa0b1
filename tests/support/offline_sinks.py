"""Reading back what the optional metric sinks logged offline: the history of a W&B offline run and the
metric history of an MLflow run, so a sink test checks the values, not only that files appeared.

    read_wandb_history(run_dir)             # [{"_step": 0, "loss": 0.5, ...}, ...] over every offline directory
    read_mlflow_history(run_dir, "loss")    # [(step, value), ...] of the run's MLflow store

A W&B offline run is `runs/<run>/wandb/offline-run-*/run-<id>.wandb`: W&B's transaction log, the LevelDB
log format (a 7-byte header ":W&B", magic 0xBEE1, version; then 32 KiB blocks of records, each a 7-byte
header — CRC32, length, type FULL/FIRST/MIDDLE/LAST — and its bytes) of `wandb_internal_pb2.Record`
messages; a `history` record holds one `log()` call's items as JSON. wandb 0.31 has no Python reader of
its own for it any more (the Go core writes it), so the few lines below read it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_BLOCK = 32 * 1024
_HEADER = struct.Struct("<4sHB")
_RECORD = struct.Struct("<IHB")
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    ident, magic, _ = _HEADER.unpack_from(data)
    if ident != b":W&B" or magic != 0xBEE1:
        raise ValueError(f"{path}: not a W&B transaction log")
    pos, parts = _HEADER.size, b""
    while pos + _RECORD.size <= len(data):
        left = _BLOCK - pos % _BLOCK
        _, length, kind = _RECORD.unpack_from(data, pos)
        if left < _RECORD.size or (kind == 0 and length == 0):  # the block's zero padding
            pos += left
            continue
        chunk = data[pos + _RECORD.size : pos + _RECORD.size + length]
        pos += _RECORD.size + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            parts = chunk
        elif kind == _MIDDLE:
            parts += chunk
        elif kind == _LAST:
            yield parts + chunk
            parts = b""


def read_wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """Every `log()` of every offline W&B directory under `run_dir/wandb`, oldest directory first."""
    from wandb.proto import wandb_internal_pb2

    rows: list[dict[str, Any]] = []
    for path in sorted(Path(run_dir).glob("wandb/offline-run-*/*.wandb")):
        for raw in _records(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {
                        item.key or "/".join(item.nested_key): json.loads(item.value_json)
                        for item in record.history.item
                    }
                )
    return rows


def read_mlflow_history(run_dir: Path, key: str, experiment: str = "gyre") -> list[tuple[int, float]]:
    """(step, value) of `key` in every MLflow run of `experiment` in `run_dir/mlflow.db`."""
    from mlflow.tracking import MlflowClient

    store = Path(run_dir) / "mlflow.db"
    if not store.is_file():
        return []
    client = MlflowClient(tracking_uri=f"sqlite:///{store.resolve()}")
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    return [
        (m.step, m.value)
        for run in client.search_runs([found.experiment_id])
        for m in client.get_metric_history(run.info.run_id, key)
    ]


def hide_package(monkeypatch: Any, module: str) -> None:
    """As if `gyre[<module>]` were not installed: the package and every submodule already imported (another
    test may have imported `mlflow.entities`, which a `from mlflow.entities import …` would then find)."""
    import sys

    for name in [m for m in sys.modules if m.split(".")[0] == module] or [module]:
        monkeypatch.setitem(sys.modules, name, None)
