"""The demo's held-out evaluation: the pool of `tasks.held_out` (never dispatched, gyre/tasks/taskset.py)
scored on the weights of fixed steps, reported as `eval_by_step` in summary.json.

    held = HeldOut(config, steps=12, run_dir)     # eval steps 0, 4, 8, 12 for held_out_every_steps = 4
    held.keep(published_version)                  # while the run trains: copy an eval step's weights
    eval_by_step = held.evaluate()                # after the stack is down: [{"step", "mean_reward", ...}]

The trainer keeps only its newest publications, so the weights of an eval step are copied into
`runs/<run>/heldout/v<step>` as soon as they are published (the demo polls every second; a step is
tens of seconds); the last step's weights are often published only after the run stops, so its
trainer checkpoint (`checkpoints/step-N`, the same HF files) is used when its publication is missing.
Step 0 is the run's `model.path`. The evaluation runs `python -m harness.demo_model.heldout` in one
subprocess for every step (the app does not import the harness; the torch import and start-up are paid
once): the same seed and sample count for every step, so two evaluations differ by what training changed. A step whose weights were never seen is reported
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
        seen = [step for step in self.steps if step in self.kept]
        scores = dict(zip(seen, self._score([self.kept[step] for step in seen]) if seen else [], strict=True))
        unseen = {"mean_reward": None, "error": "weights of this step never seen published"}
        return [{"step": step, **scores.get(step, unseen)} for step in self.steps]

    def _score(self, models: list[Path]) -> list[dict[str, Any]]:
        """One result per model of `models`, in order (each with `mean_reward: None` and why on a failure)."""
        cmd = [
            sys.executable,
            "-m",
            "harness.demo_model.heldout",
            "--model",
            *(str(m) for m in models),
            "--tasks",
            *self.tasks,
            "--samples",
            str(self.samples),
            "--seed",
            str(self.seed),
        ]
        timeout_s = EVAL_TIMEOUT_S * len(models)
        stdout, error = "", ""
        try:
            done = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            )
            stdout = done.stdout
            if done.returncode != 0:
                error = f"harness.demo_model.heldout exited {done.returncode}: {done.stderr[-500:]}"
        except subprocess.TimeoutExpired as e:
            stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            error = f"held-out evaluation ran past {timeout_s:.0f} s"
        scored: dict[str, dict[str, Any]] = {}
        for line in stdout.splitlines():  # one JSON line per model scored (those before a failure)
            try:
                result = json.loads(line)
            except ValueError:
                continue
            if isinstance(result, dict) and "model" in result and "mean_reward" in result:
                scored[str(result["model"])] = result
        out: list[dict[str, Any]] = []
        for model in models:
            result = scored.get(str(model))
            if result is None or result["mean_reward"] is None:
                why = result.get("error") if result is not None else None
                out.append(
                    {
                        "mean_reward": None,
                        "error": why or error or "harness.demo_model.heldout printed no score",
                    }
                )
                continue
            out.append(
                {
                    "mean_reward": result["mean_reward"],
                    "rewards": result["rewards"],
                    "seconds": result["seconds"],
                    "samples_per_task": self.samples,
                    "seed": self.seed,
                }
            )
        return out
