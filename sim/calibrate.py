"""Fit a preset's workload parameters to the paper's *reported workload statistics*.

Nothing here looks at speedups: the targets are per-execution and per-query statistics (mean
durations, timeout rates, share of queries past 4 h). The fitted values are written into
`sim/presets.py` by hand, rounded; this module reproduces them and shows the residuals:

    PYTHONPATH=. python -m sim.calibrate nl2repo-122b
    PYTHONPATH=. python -m sim.calibrate nl2repo-2.4t

The fit is a Nelder–Mead search on relative squared error with common random numbers (one fixed
sample of 20,000 queries), so the objective is smooth in the parameters.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from sim.presets import PRESETS, Preset
from sim.workload import WorkloadModel, WorkloadStatistics, workload_statistics

_SAMPLE_GROUPS = 20_000
_SAMPLE_SEED = 20260927


def relative_error(stats: WorkloadStatistics, targets: Mapping[str, float]) -> float:
    return sum(((float(getattr(stats, name)) - value) / value) ** 2 for name, value in targets.items())


def nelder_mead(
    f: Callable[[np.ndarray], float], x0: Sequence[float], *, iterations: int = 400
) -> np.ndarray:
    """Minimize `f` from `x0` (a plain Nelder–Mead; scipy is not a dependency)."""
    points = [np.asarray(x0, dtype=float)]
    for i in range(len(x0)):
        p = points[0].copy()
        p[i] = p[i] * 1.15 if p[i] != 0 else 0.05
        points.append(p)
    values = [f(p) for p in points]
    for _ in range(iterations):
        order = np.argsort(values)
        points = [points[i] for i in order]
        values = [values[i] for i in order]
        centroid = np.mean(points[:-1], axis=0)
        reflected = centroid + (centroid - points[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - points[-1])
            fe = f(expanded)
            points[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            points[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (points[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                points[-1], values[-1] = contracted, fc
            else:
                points = [points[0] + 0.5 * (p - points[0]) for p in points]
                values = [f(p) for p in points]
    return points[int(np.argmin(values))]


def fit(preset: Preset) -> tuple[WorkloadModel, WorkloadStatistics]:
    """Fit the preset's free workload parameters to its reported statistics."""
    if not preset.calibration_targets or not preset.calibrated_fields:
        raise ValueError(f"preset {preset.name!r} has no reported statistics to fit")
    names = preset.calibrated_fields
    base = preset.workload
    if not isinstance(base, WorkloadModel):
        raise ValueError(f"{preset.name}: only a statistical workload (WorkloadModel) can be fitted")

    def model_at(x: np.ndarray) -> WorkloadModel | None:
        values = dict(zip(names, (float(v) for v in x), strict=True))
        if any(v <= 0 for v in values.values()):
            return None
        try:
            return dataclasses.replace(base, **values)
        except ValueError:
            return None

    def objective(x: np.ndarray) -> float:
        model = model_at(x)
        if model is None:
            return 1e9
        stats = workload_statistics(model, preset.group_size, num_groups=_SAMPLE_GROUPS, seed=_SAMPLE_SEED)
        return relative_error(stats, preset.calibration_targets)

    best = nelder_mead(objective, [getattr(base, n) for n in names])
    model = model_at(best)
    assert model is not None
    return model, workload_statistics(model, preset.group_size, num_groups=_SAMPLE_GROUPS, seed=_SAMPLE_SEED)


def main(argv: list[str]) -> None:
    if len(argv) != 1 or argv[0] not in PRESETS:
        raise SystemExit(f"usage: python -m sim.calibrate PRESET  (one of {', '.join(PRESETS)})")
    preset = PRESETS[argv[0]]
    model, stats = fit(preset)
    for name in preset.calibrated_fields:
        print(f"{name} = {getattr(model, name):.4f}")
    for name, target in preset.calibration_targets.items():
        print(f"{name}: fitted {getattr(stats, name):.4f}  reported {target:.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
