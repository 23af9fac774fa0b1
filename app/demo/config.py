"""The demo's configuration: the packaged settings (`app/demo/demo.yaml`) under the user's file, GYRE_*
variables and flags, and the scheduling modes matched to one target staleness.

    config = demo_config(Path("my.yaml"), {"scheduler": {"seed": 1}})     # what `gyre demo` runs
    config = mode_config(None, {}, "async")                             # `gyre demo --mode async`

`gyre demo`, the benches that run the demo machinery (`gyre bench e2e|faults|learn`) and the fault and
end-to-end tests all build their configuration here.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gyre.config import ConfigError, GyreConfig, load_config
from gyre.paths import REPO_ROOT


def packaged_settings() -> dict[str, Any]:
    """app/demo/demo.yaml, its model path made absolute: the packaged warm start is named relative to the
    installed tree, not to the caller's directory."""
    base: dict[str, Any] = yaml.safe_load(resources.files("app.demo").joinpath("demo.yaml").read_text())
    base["model"]["path"] = str(REPO_ROOT / base["model"]["path"])
    return base


def embedded_model_path() -> Path:
    """The embedded default's model (the warm start shipped with the repository): what `gyre demo` trains,
    and what `gyre up` and the benchmarks serve when the config names no `model.path`."""
    return Path(packaged_settings()["model"]["path"])


def demo_config(file: Path | None, overrides: dict[str, Any]) -> GyreConfig:
    """The packaged demo settings ← the user's file ← GYRE_* ← CLI flags."""
    base = packaged_settings()
    # The packaged held-out pool belongs to the packaged tasks: a run that names tasks of its own
    # evaluates the pool it names (none unless it sets `tasks.held_out`).
    user_tasks = [
        (yaml.safe_load(file.read_text()) or {}).get("tasks") if file is not None else None,
        overrides.get("tasks"),
    ]
    sources = ("dirs", "datasets", "queries")
    if any(isinstance(t, dict) and any(k in t for k in sources) for t in user_tasks):
        base["tasks"].pop("held_out", None)
    return load_config(file, overrides=overrides, base=base)


def mode_config(file: Path | None, overrides: dict[str, Any], mode: str | None) -> GyreConfig:
    """`demo_config`, with `mode`'s (φ, μ) matched to the target staleness of the settings it replaces.

    Without `mode`, or with the mode the settings already have, φ and μ stay as configured. Switching
    from elastic keeps its target φ + (μ − 1)/2; switching to elastic keeps the packaged demo's μ."""
    from services.scheduler.policy import Mode
    from services.scheduler.policy.params import matched_phi_mu

    cfg = demo_config(file, overrides)
    if mode is None or mode == cfg.scheduler.mode:
        return cfg
    try:
        target = Mode(mode)
    except ValueError:
        raise ConfigError(f"--mode: choose elastic, async or colocate; got {mode!r}") from None
    sched = cfg.scheduler
    elastic_mu = sched.mu if sched.mode == Mode.ELASTIC.value else demo_config(None, {}).scheduler.mu
    try:
        phi, mu = matched_phi_mu(target, sched.phi + (sched.mu - 1) / 2, elastic_mu)
    except ValueError as e:
        raise ConfigError(f"--mode {mode}: {e}") from None
    return demo_config(file, _merge(overrides, {"scheduler": {"mode": mode, "phi": phi, "mu": mu}}))


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out
