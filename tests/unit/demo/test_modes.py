"""`gyre demo --mode`: each baseline at the demo's own target staleness, as `gyre bench e2e` compares them."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from app.cli import app
from app.demo.config import mode_config
from bench.e2e import mode_settings
from gyre.config import ConfigError


@pytest.mark.parametrize(
    ("mode", "phi", "mu"), [(None, 0.5, 2), ("elastic", 0.5, 2), ("async", 1.0, 1), ("colocate", 0.0, 3)]
)
def test_each_mode_keeps_the_demos_target_staleness(mode: str | None, phi: float, mu: int) -> None:
    s = mode_config(None, {}, mode).scheduler
    assert (s.mode, s.phi, s.mu) == (mode or "elastic", phi, mu)
    assert s.phi + (s.mu - 1) / 2 == 1.0  # the packaged demo's φ = 0.5, μ = 2


def test_the_modes_match_what_bench_e2e_runs_at_the_same_staleness() -> None:
    shape = {"scheduler": {"phi": 0.5, "mu": 3}}  # E[d] = 1.5, the bench's default
    for mode, settings in mode_settings(1.5, elastic_mu=3).items():
        s = mode_config(None, shape, mode).scheduler
        assert (s.phi, s.mu) == (settings["phi"], settings["mu"])


def test_a_mode_that_cannot_match_the_staleness_is_refused() -> None:
    with pytest.raises(ConfigError, match="colocate needs μ = 2·E\\[d\\] \\+ 1 to be whole"):
        mode_config(None, {"scheduler": {"phi": 0.25, "mu": 1}}, "colocate")
    bad = CliRunner().invoke(app, ["demo", "--mode", "bogus", "--steps", "1"])
    assert bad.exit_code == 2 and "choose elastic, async or colocate" in bad.output
