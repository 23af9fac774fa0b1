"""The sinks of per-step training metrics: JSONL (always), TensorBoard, W&B and MLflow (offline), each read
back from its own files; the optional sinks refusing to start without their package; the `metrics:` config
section."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gyre.config import ConfigError, load_config
from gyre.config.metrics import MetricsSection
from gyre.metrics.sinks import JsonlSink, MetricsSink, open_sinks, read_jsonl_steps, sink_class
from gyre.metrics.steps import scalars
from tests.support.offline_sinks import hide_package, read_mlflow_history, read_wandb_history
from tests.support.tensorboard import read_scalars


def _row(step: int) -> dict[str, object]:
    return {
        "step": step,
        "policy_version": step + 1,
        "time_s": 1_000.0 + step,
        "loss": 0.5 / (step + 1),
        "reward_mean": 0.25 * step,
        "admitted_trajectories": {"main": 3 + step},
        "groups": [{"group_id": "g"}],
        "token_ratio_min": None,
    }


def test_jsonl_and_tensorboard_hold_the_same_rows(tmp_path: Path) -> None:
    sinks = open_sinks(MetricsSection(), tmp_path, "r1")
    assert [s.name for s in sinks] == ["jsonl", "tensorboard"]
    for step in range(3):
        for sink in sinks:
            sink.write(_row(step), scalars(_row(step)))
    for sink in sinks:
        sink.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2] and lines[1]["token_ratio_min"] is None
    tb = read_scalars(tmp_path / "tensorboard")
    assert set(tb) == {"loss", "reward_mean", "admitted_trajectories/main"}
    for line in lines:
        for tag, value in scalars(line).items():
            assert tb[tag][line["step"]] == pytest.approx(value)


def test_a_torn_last_line_is_cut_and_written_steps_are_known(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 0}) + "\n" + json.dumps({"step": 1}) + "\n" + '{"step": 2, "lo')
    assert read_jsonl_steps(path) == {0, 1}
    assert path.read_text().endswith("}\n")
    sink = JsonlSink(MetricsSection(), tmp_path, "r1")
    assert sink.written == {0, 1}
    sink.write({"step": 2}, {})
    sink.close()
    assert read_jsonl_steps(path) == {0, 1, 2}


def test_a_non_finite_number_is_refused_not_written(tmp_path: Path) -> None:
    sink = JsonlSink(MetricsSection(), tmp_path, "r1")
    with pytest.raises(ValueError):
        sink.write({"step": 0, "loss": float("nan")}, {})
    sink.close()
    assert (tmp_path / "metrics.jsonl").read_text() == ""


@pytest.mark.parametrize(("sink", "module"), [("wandb", "wandb"), ("mlflow", "mlflow")])
def test_an_optional_sink_without_its_package_fails_at_open_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sink: str, module: str
) -> None:
    hide_package(monkeypatch, module)
    with pytest.raises(
        ConfigError, match=rf"metrics.sinks: '{sink}' needs the {module} package.*gyre\[{sink}\]"
    ):
        open_sinks(MetricsSection(sinks=["tensorboard", sink]), tmp_path, "r1")
    # nothing is left open or half-written: the JSONL file exists, empty, and can be opened again
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    for s in open_sinks(MetricsSection(), tmp_path, "r1"):
        s.close()


def test_the_metrics_section_names_bad_values(tmp_path: Path) -> None:
    bad = tmp_path / "gyre.yaml"
    bad.write_text("metrics:\n  sinks: [tensorboard, tensorboard]\n")
    with pytest.raises(ConfigError, match=r"metrics\.sinks: sinks must not repeat a sink"):
        load_config(bad, environ={})
    bad.write_text("metrics:\n  sinks: [neptune]\n")
    with pytest.raises(
        ConfigError,
        match=r"metrics\.sinks: 'neptune' is not a registered sink; available: tensorboard, wandb, mlflow$",
    ):
        load_config(bad, environ={})
    bad.write_text("metrics:\n  port: 70000\n")
    with pytest.raises(ConfigError, match=r"metrics\.port: must be a port"):
        load_config(bad, environ={})
    assert load_config(None, environ={"GYRE_METRICS__PORT": "9400"}).metrics.port == 9400


def _log_three_steps_over_a_restart(sink: str, run_dir: Path) -> list[tuple[int, float]]:
    """Steps 0 and 1, a restart (the sinks opened again on the same run), step 2; returns the `loss` values
    the sink's own files hold, read back (tests/support/offline_sinks.py)."""
    section = MetricsSection(sinks=[sink])
    first = open_sinks(section, run_dir, "r1")
    for step in (0, 1):
        for s in first:
            s.write(_row(step), scalars(_row(step)))
    for s in first:
        s.close()
    second = open_sinks(section, run_dir, "r1")
    for s in second:
        s.write(_row(2), scalars(_row(2)))
        s.close()
    if sink == "mlflow":
        return sorted(read_mlflow_history(run_dir, "loss"))
    import wandb

    wandb.teardown()  # its service process ends here, not in an atexit hook after the session's cleanup
    return [(int(r["_step"]), float(r["loss"])) for r in read_wandb_history(run_dir) if "loss" in r]


@pytest.mark.parametrize("sink", ["wandb", "mlflow"])
def test_an_optional_sink_logs_every_step_offline_across_a_restart(tmp_path: Path, sink: str) -> None:
    """The extras are installed by `make setup` (`gyre[wandb]`, `gyre[mlflow]`): each sink writes every step
    to one offline run, also after a restart, and the values read back from its own files are the rows'."""
    logged = _log_three_steps_over_a_restart(sink, tmp_path)
    assert logged == [(0, 0.5), (1, 0.25), (2, pytest.approx(0.5 / 3))], logged
    if sink == "wandb":  # one offline directory per open, all of the same run id; two opens within one
        # second share the time stamp, and wandb then suffixes the second directory's name (-r1-1)
        runs = [
            p
            for p in (tmp_path / "wandb").iterdir()
            if re.fullmatch(r"offline-run-\d{8}_\d{6}-r1(-\d+)?", p.name)
        ]
        assert len(runs) == 2 and all(list(r.glob("*.wandb")) for r in runs)


@pytest.mark.parametrize("sink", ["wandb", "mlflow"])
def test_the_read_back_sees_a_sink_that_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sink: str
) -> None:
    """The test above can fail: a sink whose write does nothing leaves nothing to read back."""
    cls: type[MetricsSink] = sink_class(sink)
    monkeypatch.setattr(cls, "write", lambda self, row, scalars: None)
    assert _log_three_steps_over_a_restart(sink, tmp_path) == []
