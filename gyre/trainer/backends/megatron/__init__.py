"""The `megatron` trainer backend: megatron-core GPTModels built from HF Llama / Qwen2 / Qwen3 models.

Import `gyre.trainer.backends.megatron.trainer.MegatronTrainer` for the backend (it loads
megatron-core). This package's own import stays light, so a run can validate its model and parallel
layout at config time without megatron-core or torch.distributed:

    from gyre.trainer.backends.megatron import architecture_from_hf, check_parallel_layout
    check_parallel_layout(architecture_from_hf(hf_config), tensor_parallel_size=2)   # ValueError → exit 2

See README.md beside this file for what runs where and what is untested.
"""

from gyre.trainer.backends.megatron.architecture import (
    GPTArchitecture,
    RopeSpec,
    architecture_from_hf,
    check_parallel_layout,
)

__all__ = ["GPTArchitecture", "RopeSpec", "architecture_from_hf", "check_parallel_layout"]
