"""Megatron's rotary embedding with the Hugging Face rope kinds and no hidden CUDA calls.

Why a subclass: megatron-core 0.16's `RotaryEmbedding.get_emb` moves `inv_freq` to
`torch.cuda.current_device()` on its first call, and `YarnRotaryEmbedding` does so already in its
constructor, so neither runs on a CPU machine; its llama3 scaling also fixes low/high frequency
factors and the original context (1, 4, 8192) instead of reading them from the model. This class keeps
Megatron's forward (with its `lru_cache`), its packed-sequence (`thd`) application in
`rope_utils.apply_rotary_pos_emb` and its YaRN attention factor (read from the config by
`Attention`, see `model.YarnTransformerConfig`), and only computes `inv_freq` per kind, on the
model's device, with Megatron's own helpers where they exist:

    default   θ^(-2i/d)
    linear    θ^(-2i/d) / factor                                (as transformers; no position division)
    llama3    RotaryEmbedding._apply_scaling with the model's factors
    yarn      Megatron's correction range and linear ramp between θ^(-2i/d) and θ^(-2i/d) / factor

The GPT model is then built with `position_embedding_type="rope"` and this module replaces the stock
one (`model.GyreGPTModel`); nothing in megatron-core is patched.
"""

from __future__ import annotations

import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
    _yarn_find_correction_range,
    _yarn_linear_ramp_mask,
)
from torch import Tensor

from gyre.trainer.backends.megatron.architecture import RopeSpec


class GyreRotaryEmbedding(RotaryEmbedding):
    """`RotaryEmbedding` whose `inv_freq` is computed per HF rope kind and lives on `device`."""

    def __init__(
        self,
        rope: RopeSpec,
        *,
        kv_channels: int,
        device: torch.device,
        cp_group: torch.distributed.ProcessGroup,
    ) -> None:
        super().__init__(
            kv_channels=kv_channels,
            rotary_percent=1.0,
            rotary_base=rope.theta,  # type: ignore[arg-type]  # replaced below
            use_cpu_initialization=True,
            cp_group=cp_group,
        )
        self.rope = rope
        self.inv_freq = self.kind_inv_freq(rope, kv_channels).to(device)

    def kind_inv_freq(self, rope: RopeSpec, dim: int) -> Tensor:
        """Inverse frequencies [dim/2] (float32, on the host) of the rope kind."""
        pos_freqs = rope.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        base = 1.0 / pos_freqs
        if rope.kind == "default":
            return base
        if rope.kind == "linear":
            return base / rope.factor
        if rope.kind == "llama3":
            return self._apply_scaling(
                base,
                factor=rope.factor,
                low_freq_factor=rope.low_freq_factor,
                high_freq_factor=rope.high_freq_factor,
                original_max_position_embeddings=rope.original_max_position_embeddings,
            )
        assert rope.kind == "yarn", rope.kind
        low, high = _yarn_find_correction_range(
            rope.beta_fast,
            rope.beta_slow,
            dim,
            rope.theta,
            rope.original_max_position_embeddings,
            rope.truncate,
        )
        extrapolation = 1.0 - _yarn_linear_ramp_mask(low, high, dim // 2, device=torch.device("cpu"))
        return 1.0 / (rope.factor * pos_freqs) * (1 - extrapolation) + base * extrapolation

    def get_emb(self, max_seq_len: int, offset: int = 0) -> Tensor:
        """[max_seq_len, 1, 1, dim] angles of positions offset.. (non-interleaved halves)."""
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]
