"""The role timeline renders to a PNG without a display."""

from gyre.metrics.timeline import plot_timeline
from services.scheduler.policy import Mode
from sim.layout import Layout
from sim.presets import PRESETS
from sim.simulation import Simulation


def test_timeline_png_is_written(tmp_path):
    preset = PRESETS["nl2repo-122b"]
    result = Simulation(
        preset, Layout.default(preset, Mode.ELASTIC), steps=3, seed=0, record_timeline=True
    ).run()
    assert result.timeline is not None
    path = plot_timeline(result.timeline, tmp_path / "plots" / "e0.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
