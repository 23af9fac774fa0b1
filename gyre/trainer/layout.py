"""Whether the configured trainer backend can train the run's model, checked before anything starts.

`gyre up` (before spawning) and each cell agent (before any connection or process group) call it, so
a layout the backend cannot build, or LoRA target modules that match no module of the model, stop the
run with exit 2 and one line naming the field. It imports neither torch nor the backend (megatron-core
takes seconds to import, and may not be installed):

    check_trainer(config.cell_agent.trainer, model.path)    # model = ModelDir.open(config.model); ModelError → exit 2
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from gyre.config.training import TrainerSection
from gyre.model.arch import CONFIG_FILE, ModelError, read_arch
from gyre.model.lora_spec import resolve_targets

LORA_TARGETS_FIELD = "cell_agent.trainer.lora.target_modules"

_REQUIRED_MODULES = {
    "megatron": ("megatron.core", "pip install 'gyre[megatron]' (or 'gyre[gpu]' on GPU nodes)")
}


def check_trainer(section: TrainerSection, model_dir: Path) -> None:
    """`ModelError` naming the field when `section.backend` is not registered or cannot train the model
    of `model_dir`, or `section.lora` targets a module the model does not have (`AdapterError`)."""
    from gyre.trainer.backends import TRAINER_BACKENDS

    if section.backend not in TRAINER_BACKENDS:
        raise ModelError(
            "config",
            "cell_agent.trainer.backend",
            f"{section.backend!r} is not a trainer backend; choose one of {', '.join(TRAINER_BACKENDS)}",
        )
    if section.lora is not None:
        resolve_targets(read_arch(model_dir), section.lora.target_modules, LORA_TARGETS_FIELD)
    required = _REQUIRED_MODULES.get(section.backend)
    if required is not None and importlib.util.find_spec(required[0].split(".")[0]) is None:
        raise ModelError(
            "config", "cell_agent.trainer.backend", f"{section.backend!r} needs {required[0]}: {required[1]}"
        )
    if section.backend == "megatron":
        from gyre.trainer.backends.megatron.architecture import check_cell_layout, check_megatron_layout

        tp = section.megatron.tensor_parallel_size
        check_megatron_layout(
            read_arch(model_dir), tensor_parallel_size=tp, source=Path(model_dir) / CONFIG_FILE
        )
        check_cell_layout(tp)
