"""The demo's held-out evaluation: the pool of `tasks.held_out` (never dispatched, gyre/tasks/taskset.py)
scored on the weights of fixed steps, reported as `eval_by_step` in summary.json.

    held = HeldOut(config, steps=12, run_dir)     # eval steps 0, 4, 8, 12 for held_out_every_steps = 4
    held.keep(published_version)                  # while the run trains: copy an eval step's weights
    eval_by_step = held.evaluate()                # after the stack is down: [{"step", "mean_reward", ...}]

The trainer keeps only its newest publications, so the weights of an eval step are copied into
`runs/<run>/heldout/v<step>` as soon as they are published (the demo polls every second; a step is
tens of seconds); the last step's weights are often published only after the run stops, so its
trainer checkpoint (`checkpoints/step-N`, the same HF files) is used when its publication is missing. Step 0 is the run's `model.path`. Each evaluation runs `python -m harness.demo_model.heldout`
in a subprocess (the app does not import the harness): the same seed and sample count for every step,
so two evaluations differ by what training changed. A step whose weights were never seen is reported
with `mean_reward: null` and why, not dropped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from gyre.config import GyreConfig
from gyre.paths import REPO_ROOT
from gyre.trainer.checkpoint import published_path

EVAL_TIMEOUT_S = 600.0
TRAINER_ONLY = ("optimizer.pt", "trainer.json")
"""Files of a trainer checkpoint (`checkpoints/step-N`) the evaluation does not need."""


def eval_steps(steps: int, every: int) -> list[int]:
    """Step 0, every `every`-th step, and the last step."""
    return sorted({0, steps, *range(every, steps + 1, every)})


class HeldOut:
    def __init__(self, config: GyreConfig, steps: int, run_dir: Path) -> None:
        section = config.tasks
        self.tasks = list(section.held_out)
        self.samples, self.seed = section.held_out_samples, section.held_out_seed
        self.steps = eval_steps(steps, section.held_out_every_steps) if self.tasks else []
        self.model_dir = Path(str(config.model.path)).resolve()
        self.checkpoints = run_dir / "checkpoints"
        self.root = run_dir / "heldout"
        self.kept: dict[int, Path] = {0: self.model_dir}

    def keep(self, published_version: int) -> None:
        """Copy the publications of eval steps up to `published_version` not copied yet (version = step)."""
        for step in self.steps:
            if step in self.kept or step > published_version:
                continue
            sources = (published_path(self.checkpoints, step), self.checkpoints / f"step-{step:08d}")
            source = next((s for s in sources if (s / "model.safetensors").is_file()), None)
            if source is not None:
                target = self.root / f"v{step:08d}"
                shutil.copytree(
                    source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*TRAINER_ONLY)
                )
                self.kept[step] = target

    def evaluate(self) -> list[dict[str, Any]]:
        """Score every eval step's weights; one entry per eval step, in order."""
        if self.steps:
            self.keep(
                self.steps[-1]
            )  # the last step's weights: published late, or only the trainer's checkpoint
        out: list[dict[str, Any]] = []
        for step in self.steps:
            model = self.kept.get(step)
            if model is None:
                out.append(
                    {"step": step, "mean_reward": None, "error": "weights of this step never seen published"}
                )
                continue
            out.append({"step": step, **self._score(model)})
        return out

    def _score(self, model: Path) -> dict[str, Any]:
        cmd = [
            sys.executable,
            "-m",
            "harness.demo_model.heldout",
            "--model",
            str(model),
            "--tasks",
            *self.tasks,
            "--samples",
            str(self.samples),
            "--seed",
            str(self.seed),
        ]
        try:
            done = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=EVAL_TIMEOUT_S,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            )
        except subprocess.TimeoutExpired:
            return {"mean_reward": None, "error": f"held-out evaluation ran past {EVAL_TIMEOUT_S:.0f} s"}
        if done.returncode != 0:
            return {
                "mean_reward": None,
                "error": f"harness.demo_model.heldout exited {done.returncode}: {done.stderr[-500:]}",
            }
        result = json.loads(done.stdout.strip().splitlines()[-1])
        return {
            "mean_reward": result["mean_reward"],
            "rewards": result["rewards"],
            "seconds": result["seconds"],
            "samples_per_task": self.samples,
            "seed": self.seed,
        }
