"""The contract every registered metrics sink keeps (gyre/metrics/sinks/base.py), run for each name of `SINKS`:
it is registered under its own name, opens after the JSONL sink, takes rows and closes; without its package it
refuses to open with a `ConfigError` naming the install. And the registry is the one list of sinks: the config
field's documentation names each of them and its refusal lists exactly them."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from gyre.config import ConfigError, load_config
from gyre.config.metrics import MetricsSection
from gyre.metrics.sinks import SINKS, MetricsSink, open_sinks, sink_class
from gyre.metrics.steps import scalars

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", list(SINKS))
def test_a_registered_sink_opens_takes_rows_and_closes(tmp_path: Path, name: str) -> None:
    cls = sink_class(name)
    assert issubclass(cls, MetricsSink) and cls.name == name
    sinks = open_sinks(MetricsSection(sinks=[name]), tmp_path, "r1")
    assert [s.name for s in sinks] == ["jsonl", name]
    for step in (0, 1):
        row = {"step": step, "time_s": 1_000.0 + step, "loss": 0.5 / (step + 1)}
        for sink in sinks:
            sink.write(row, scalars(row))
    for sink in sinks:
        sink.close()
    if name == "wandb":
        import wandb

        wandb.teardown()  # its service process ends here, not in an atexit hook after the session's cleanup


@pytest.mark.parametrize("name", list(SINKS))
def test_a_registered_sink_without_its_package_refuses_to_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    cls = sink_class(name)
    for module in [m for m in sys.modules if m.split(".")[0] == name] or [name]:
        monkeypatch.setitem(sys.modules, module, None)  # each sink's package is named as the sink
    with pytest.raises(ConfigError, match=rf"metrics.sinks: '{name}' needs the {name} package"):
        open_sinks(MetricsSection(sinks=[name]), tmp_path, "r1")
    if cls.extra is not None:
        extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        assert cls.extra in extras, f"{name}: extra {cls.extra!r} is not in pyproject.toml"


def test_the_registry_the_config_docs_and_its_refusal_agree(tmp_path: Path) -> None:
    doc = MetricsSection.model_fields["sinks"].description or ""
    assert all(f"`{name}`" in doc for name in SINKS), doc
    bad = tmp_path / "gyre.yaml"
    bad.write_text("metrics:\n  sinks: [neptune]\n")
    with pytest.raises(ConfigError) as refused:
        load_config(bad, environ={})
    assert str(refused.value).endswith(f"available: {', '.join(SINKS)}")
    assert MetricsSection(sinks=list(SINKS)).sinks == list(SINKS)
