"""Reading TensorBoard event files back (tensorboard's own reader, no TensorFlow)."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read_scalars(logdir: Path) -> dict[str, dict[int, float]]:
    """Every scalar in the event files under `logdir`: tag → {step: value}."""
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
