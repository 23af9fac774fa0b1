"""The `megatron` trainer backend: megatron-core GPTModels built from HF Llama / Qwen2 / Qwen3 models.

`gyre.trainer.backends.megatron.trainer.MegatronTrainer` is the backend (importing it loads
megatron-core, several seconds); the registry in `gyre.trainer.backends` imports it only when a cell
builds one. This package's own import stays light, so a run checks its model and layout at config
time without megatron-core or torch.distributed:

    from gyre.trainer.backends.megatron import check_megatron_layout
    check_megatron_layout(read_arch(model_dir), tensor_parallel_size=2)   # LayoutError (a ModelError) → exit 2

See README.md beside this file for what runs where and what is untested.
"""

from gyre.trainer.backends.megatron.architecture import (
    TP_FIELD,
    LayoutError,
    check_cell_layout,
    check_megatron_layout,
)

__all__ = ["TP_FIELD", "LayoutError", "check_cell_layout", "check_megatron_layout"]
