"""Whether megatron-core can build a model (`gyre.model.arch.ModelArch`) over a parallel layout —
checked before any process group starts, so a run that cannot train stops at `gyre up` / service
start with exit 2 and one line naming the field.

Pure Python (no torch.distributed, no megatron import):

    check_megatron_layout(read_arch(model_dir), tensor_parallel_size=2, source=model_dir / "config.json")

The HF config itself is parsed once, by `gyre.model.arch` (families, GQA, rope kinds and both rope
dialects; it refuses what Gyre does not run at all). What is refused here is what megatron-core's GPT
layer cannot express, or what a tensor-parallel split cannot divide:

- Llama's `attention_bias` (a bias on q/k/v *and* o) and `mlp_bias`: megatron-core has q/k/v biases
  alone (`add_qkv_bias`, Qwen2) or biases on every linear (`add_bias_linear`), not these mixes;
- `num_attention_heads`, `num_key_value_heads`, `vocab_size`, `intermediate_size` must be multiples
  of the tensor-parallel size (heads and query groups, vocab rows and FFN columns are split evenly);
- mixture-of-experts checkpoints (Qwen3-MoE): megatron-core 0.16.1's MoE layer does not run on a
  CPU (its `TopKRouter.gating` moves a router weight that is on the CPU to
  `torch.cuda.current_device()` at every forward); the torch backend trains them;

Pipeline parallelism is not offered at all (no config field): megatron-core 0.16's schedules and p2p
allocate on CUDA, and the Gyre objective needs a whole micro-step's logits in one process.
"""

from __future__ import annotations

from pathlib import Path

from gyre.model.arch import CONFIG_FILE, ModelArch, ModelError

TP_FIELD = "cell_agent.trainer.megatron.tensor_parallel_size"
MOE_REFUSAL = (
    "Qwen3MoeForCausalLM is not supported by the megatron backend (megatron-core 0.16.1's MoE router "
    "moves its weight to CUDA at every forward, so it cannot run on a CPU); use trainer.backend torch"
)


class LayoutError(ModelError):
    """A model megatron-core cannot build over the configured layout (exit 2, like any `ModelError`)."""


def check_megatron_layout(
    arch: ModelArch,
    *,
    tensor_parallel_size: int,
    source: Path | str = CONFIG_FILE,
) -> None:
    """`LayoutError` naming the model's field (in `source`) and the layout field it conflicts with."""
    if arch.moe is not None:
        raise LayoutError(source, "architectures", MOE_REFUSAL)
    if arch.o_bias:
        raise LayoutError(
            source,
            "attention_bias",
            "true is not supported by the megatron backend (megatron-core has q/k/v biases alone or "
            "biases on every linear, not q/k/v/o without the MLP); use trainer.backend torch",
        )
    if arch.mlp_bias:
        raise LayoutError(
            source,
            "mlp_bias",
            "true is not supported by the megatron backend (MLP biases without attention biases); "
            "use trainer.backend torch",
        )
    if tensor_parallel_size < 1:
        raise LayoutError("config", TP_FIELD, f"must be at least 1; got {tensor_parallel_size}")
    tp = tensor_parallel_size
    for field_name, value in (
        ("num_attention_heads", arch.num_heads),
        ("num_key_value_heads", arch.num_kv_heads),
        ("vocab_size", arch.vocab_size),
        ("intermediate_size", arch.intermediate_size),
    ):
        if value % tp:
            raise LayoutError(
                source,
                field_name,
                f"{value} is not divisible by {TP_FIELD} {tp}; pick a tensor_parallel_size that divides it",
            )


def check_cell_layout(tensor_parallel_size: int) -> None:
    """`LayoutError` unless a cell agent can run the layout: it runs one trainer process per cell."""
    if tensor_parallel_size != 1:
        raise LayoutError(
            "config",
            TP_FIELD,
            f"{tensor_parallel_size}: a cell agent runs one trainer process, so it trains at tensor_parallel_size "
            "1 (MegatronTrainer takes a TP group from a launcher that starts one process per rank); use 1",
        )
