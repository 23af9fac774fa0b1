"""The `mlflow` sink: an MLflow run of the per-step training metrics in a local SQLite store
(`pip install 'gyre[mlflow]'`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gyre.metrics.sinks.base import MetricsSink, SinkSettings


class MlflowSink(MetricsSink):
    """An MLflow run in a local SQLite store `runs/<run>/mlflow.db` (experiment `metrics.mlflow_experiment`,
    run tagged `gyre.run=<run id>` and resumed after a restart); `mlflow ui --backend-store-uri
    sqlite:///runs/<run>/mlflow.db` shows it."""

    name = "mlflow"
    extra = "mlflow"

    def __init__(self, section: SinkSettings, run_dir: Path, run_id: str) -> None:
        super().__init__(section, run_dir, run_id)
        try:
            from mlflow.entities import Metric
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise self._missing(e) from None
        self._metric = Metric
        self.store = (run_dir / "mlflow.db").resolve()
        self._client = MlflowClient(tracking_uri=f"sqlite:///{self.store}")
        experiment = self._client.get_experiment_by_name(section.mlflow_experiment)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self._client.create_experiment(section.mlflow_experiment)
        )
        found = self._client.search_runs([experiment_id], filter_string=f"tags.`gyre.run` = '{run_id}'")
        self.mlflow_run_id = (
            found[0].info.run_id
            if found
            else self._client.create_run(
                experiment_id, run_name=run_id, tags={"gyre.run": run_id}
            ).info.run_id
        )
        self._closed = False

    def write(self, row: dict[str, Any], scalars: dict[str, float]) -> None:
        ms, step = int(1000 * float(row.get("time_s") or time.time())), int(row["step"])
        self._client.log_batch(
            self.mlflow_run_id, metrics=[self._metric(k, v, ms, step) for k, v in scalars.items()]
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.set_terminated(self.mlflow_run_id)
