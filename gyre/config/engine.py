"""Config section of a cell's rollout engine: the embedded engine (CPU, torch) or an SGLang server the
cell agent launches (GPU clusters, or CPUs with `sglang_device: cpu`); `sglang_*` fields apply to SGLang
only. `backend` names an entry of `gyre.engine.backends.ENGINE_BACKENDS`, checked before anything starts
(`check_engine`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from gyre.config.base import AtLeastOne, AtLeastOneOrNull, NonNegativeFloat, Port, Section
from gyre.paths import REPO_ROOT


class EngineSection(Section):
    backend: str = "embedded"
    """Rollout engine of a cell, a name in `gyre.engine.backends.ENGINE_BACKENDS` (checked before anything
    starts, `check_engine`): `embedded` (Gyre's engine in the cell agent's process, CPU, torch) or `sglang`
    (an SGLang server the cell agent launches from `sglang_python`)."""
    host: str = "127.0.0.1"
    """Address the engine listens on (embedded engine and launched SGLang). Keep loopback on one machine."""
    port: Port = 0
    """HTTP port of the engine; 0 picks a free one."""
    output_source: str = "model"
    """Embedded engine only: where outputs come from, a name in the backend registry of
    `services.cell_agent.engine.sources` (`model` = the checkpoint's forward and sampling,
    `scripted` = queued outputs)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype of the served weights and KV cache (float32 is exact and fastest on CPU; a bf16
    checkpoint is upcast): the embedded engine, and SGLang on CPU (`--dtype`; on GPUs SGLang serves the
    checkpoint's dtype)."""
    script_file: Path | None = None
    """Scripted output sources only: a JSONL file of script entries queued at start (one
    `{"text": ...}` or `{"output_ids": [...]}` object per line; see `sources/scripted.py`)."""
    script_repeat: bool = False
    """Scripted output sources only: when the queue runs dry, serve `script_file`'s entries again (a
    stand-in policy that keeps a long CI run going)."""
    max_batch_size: AtLeastOne = 32
    """Requests decoded together (continuous batching); SGLang on CPU: `--max-running-requests`."""
    max_prefill_tokens: AtLeastOne = 2048
    """Prompt tokens computed per scheduling step; longer prompts are prefilled in chunks."""
    block_size: AtLeastOne = 16
    """Tokens per KV block (the unit of the prefix cache and of KV migration)."""
    kv_cache_tokens: int = 65536
    """KV pool capacity in tokens (rounded up to blocks); allocated lazily, so idle capacity costs no RSS.
    SGLang on CPU: `--max-total-tokens` (allocated at start; without it SGLang takes 72% of free RAM). On
    GPUs SGLang sizes its pool from `sglang_mem_fraction_static` instead."""
    enable_prefix_cache: bool = True
    """Reuse KV blocks of earlier requests with the same token prefix under the same weight version."""
    incremental_streaming_output: bool = True
    """Streamed `/generate` chunks carry only what is new (SGLang's `--incremental-streaming-output`);
    off = every chunk repeats the whole output so far (SGLang's default, quadratic on long outputs)."""
    health_check_timeout_s: float = 20.0
    """`/health_generate` fails if a one-token probe does not finish within this time."""
    num_threads: AtLeastOne = 1
    """torch intra-op threads of the engine's compute thread (cores are shared with other processes)."""
    inline_step_ms: NonNegativeFloat = 25.0
    """A decode step (every request one token) whose recent CPU time is under this runs on the engine's
    event loop instead of its compute thread: for a small model the two thread hand-offs of a step
    cost more than the step itself, above all on a busy machine; HTTP then waits at most about this
    long between steps. Prefill chunks always run on the compute thread. 0 = every step there."""
    seed: int = 0
    """Sampling seed; a request's own generator is derived from it and the request id."""
    weight_version: str = "0"
    """Weight version reported before the first weight update."""
    weights_cpu_backup: bool = False
    """On `/release_memory_occupation` with tag `weights`, keep a copy to restore on resume (SGLang's
    `--enable-weights-cpu-backup`); off = weights must be updated after resume before serving."""
    return_routed_experts: bool = False
    """Return each forwarded token's MoE experts on request (SGLang's `--enable-return-routed-experts`; the
    embedded engine always can). Turned on for the run's engines with `trainer.routing_replay`."""
    enable_lora: bool = False
    """Serve LoRA adapters (SGLang's `--enable-lora`): `/load_lora_adapter`, `/unload_lora_adapter` and a
    request's `lora_path`. Turned on for the run's engines when `trainer.lora` is set."""
    max_lora_rank: AtLeastOneOrNull = None
    """The largest adapter rank served (SGLang's `--max-lora-rank`); None = the trainer's `lora.rank`."""
    lora_target_modules: list[str] = Field(default_factory=list)
    """Modules adapters may target (SGLang's `--lora-target-modules`); empty = the trainer's."""
    max_loaded_loras: AtLeastOne = 4
    """Adapters held at once (SGLang's `--max-loaded-loras`): a publication loads the new one before it
    unloads the oldest, so calls in flight on the previous one finish on it."""
    sglang_model_path: str | None = None
    """SGLang only: model path or HF id passed as `--model-path`; None = `model.path` (the directory the
    trainer starts from, so engine and trainer load the same weights)."""
    sglang_tp_size: AtLeastOne = 1
    """SGLang only: tensor-parallel size (`--tp-size`)."""
    sglang_mem_fraction_static: float | None = None
    """SGLang only: `--mem-fraction-static`; None keeps SGLang's default."""
    sglang_enable_memory_saver: bool = True
    """SGLang on GPUs only: `--enable-memory-saver`, needed to release and resume memory on role switches
    (CUDA only: on CPU the flag is not passed and a release frees nothing)."""
    sglang_device: Literal["cuda", "cpu"] = "cuda"
    """SGLang only: `--device`. `cpu` also sets `--attention-backend torch_native`, the KV budget
    (`kv_cache_tokens`), `max_batch_size`, `dtype` and `SGLANG_USE_CPU_ENGINE=1` (deploy/sglang/README.md)."""
    sglang_python: str = "python"
    """SGLang only: interpreter that runs `-m sglang.launch_server` (`make setup` installs SGLang into
    `.venv-sglang`: `.venv-sglang/bin/python`); checked at start to have sglang. A bare name is looked up
    on PATH; a relative path is the checkout's (`gyre.paths.REPO_ROOT`), whatever the working directory."""
    sglang_args: list[str] = Field(default_factory=list)
    """Extra arguments for `python -m sglang.launch_server` (cluster only)."""

    @field_validator("kv_cache_tokens")
    @classmethod
    def _kv_tokens(cls, v: int) -> int:
        if v < 64:
            raise ValueError(f"kv_cache_tokens must be at least 64; got {v}")
        return v

    @field_validator("sglang_python")
    @classmethod
    def _python_in_checkout(cls, v: str) -> str:
        if "/" in v and not Path(v).is_absolute():
            return str(REPO_ROOT / v)
        return v

    @field_validator("sglang_mem_fraction_static")
    @classmethod
    def _mem_fraction(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v < 1:
            raise ValueError(f"sglang_mem_fraction_static must be in (0, 1) or null; got {v}")
        return v
