"""Config sections of the proxy, runner, evaluator, packer and cell agents (one class each).

A section grows with its service; keep every field documented and validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from gyre.config.base import Section


class ProxySection(Section):
    port: int = 0
    """gRPC port (OpenExecution, UpdateRoutes, Drain); 0 picks a free one."""
    http_port: int = 0
    """Harness-facing HTTP port (Anthropic / OpenAI APIs); 0 picks a free one."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Requests with a larger body are answered 413."""
    default_profile: str = "generic"
    """Harness profile used when an execution does not name one."""


class RunnerSection(Section):
    port: int = 0
    """gRPC port; 0 picks a free one."""
    max_concurrent: int = 32
    """Executions this runner keeps running at once."""
    harness: Literal["demo", "claude_code", "codex"] = "demo"
    """Which harness command the runner launches."""


class EvaluatorSection(Section):
    port: int = 0
    """gRPC port; 0 picks a free one."""
    max_attempts: int = 3
    """Verifier attempts on one preserved workspace before the execution is excluded."""
    backoff_s: float = 0.5
    """First retry delay; doubles each attempt, bounded by the execution's overall budget."""


class PackerSection(Section):
    port: int = 0
    """gRPC port; 0 picks a free one."""
    j_max: int = 5
    """J_max: trajectories admitted per execution."""
    microstep_tokens: int = 8192
    """Token budget of one micro-step."""
    normalize_std: bool = False
    """Divide group-relative advantages by the group's reward std (+eps)."""

    @field_validator("j_max", "microstep_tokens")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be at least 1; got {v}")
        return v


class ObjectiveSection(Section):
    clip_low: float = 0.995
    """Sequence-ratio bound under which an execution with negative advantage is masked."""
    clip_high: float = 1.005
    """Sequence-ratio bound above which an execution with positive advantage is masked."""
    token_ratio_cap: float = 5.0
    """Cap of the stop-gradient token importance weight."""
    token_loss_cap: float = 100.0
    """Cap of a token's loss."""


class TrainerSection(Section):
    backend: Literal["torch", "megatron"] = "torch"
    """Trainer backend of a cell, a name in the registry of `gyre.trainer.backends` (`torch` on the
    embedded default; `megatron` is reserved for clusters and not registered yet)."""
    device: str = "cpu"
    """torch device of the trainer (`cpu`, `cuda`, `cuda:0`)."""
    dtype: Literal["float32", "float64"] = "float32"
    """Parameter, gradient and optimizer-state dtype."""
    num_threads: int = 1
    """torch intra-op threads of the trainer's compute thread (cores are shared with other processes)."""
    lr: float = 1e-4
    """AdamW learning rate (constant)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW β1."""
    adam_beta2: float = 0.999
    """AdamW β2."""
    adam_eps: float = 1e-8
    """AdamW ε."""
    grad_clip: float = 1.0
    """Global gradient-norm clip applied by the core to the summed gradient (0 = no clipping)."""
    chunk_tokens: int | None = None
    """Token limit of one forward for a micro-step over its budget (chunked path); None = the budget."""
    checkpoint_every_steps: int = 0
    """Checkpoint model + optimizer + version every this many steps (0 = only at shutdown)."""
    checkpoint_dir: Path | None = None
    """Where the core writes checkpoints and published weights; None = `<run dir>/checkpoints`.
    Every cell must read the same directory (a shared volume on clusters)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (older ones are deleted); the newest published weights are always kept."""
    dist_backend: Literal["gloo", "nccl"] = "gloo"
    """torch.distributed backend."""
    dist_port: int = 0
    """Port of the core's torch.distributed rendezvous store (TCPStore); 0 = the core picks a free one
    and announces it through Redis."""
    dist_socket_ifname: str | None = None
    """Network interface gloo/NCCL bind (sets GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME); None = the
    interface of the host name (loopback on a single machine)."""
    collective_timeout_s: float = 600.0
    """Timeout of one collective (gradient reduction, parameter broadcast, snapshot broadcast)."""
    rendezvous_timeout_s: float = 120.0
    """How long a cell waits for every cell to join the torch.distributed world at start-up."""
    weight_transport: Literal["mooncake", "torch"] = "mooncake"
    """How a satellite pulls the core's snapshot: Mooncake Transfer Engine (one flat buffer registered
    by the core, read by satellites), or a torch.distributed broadcast from the core (fallback)."""
    mooncake_protocol: Literal["tcp", "rdma"] = "tcp"
    """Mooncake transport protocol (TCP on CPU machines, RDMA on clusters)."""
    mooncake_device: str = ""
    """Mooncake device list for RDMA (e.g. `mlx5_0`); empty = auto-discovery / none for TCP."""
    mooncake_host: str | None = None
    """Address the core announces to satellites for Mooncake reads; None = the core's peer host
    (`run.peer_host("cell_agent", 0)`). Mooncake listens on 0.0.0.0 whatever is given here (see the
    README's security notes)."""
    snapshot_digest: bool = True
    """The core publishes a SHA-256 of its weights with each snapshot and a satellite verifies the bytes
    it pulled against it (costs one hash of the weights per step)."""
    join_timeout_s: float = 120.0
    """How long a cell waits for the core to open the batch it was asked to join."""
    heartbeat_interval_s: float = 1.0
    """Seconds between a training cell's heartbeats on the micro-step queue (must be well under
    `redis.heartbeat_timeout_s`, after which its claimed micro-steps are reclaimed)."""
    poll_s: float = 0.02
    """Wait between two looks at an empty micro-step queue (the consistent point where a cell idles)."""

    @field_validator("num_threads", "keep_checkpoints")
    @classmethod
    def _at_least_one(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be at least 1; got {v}")
        return v

    @field_validator("checkpoint_every_steps")
    @classmethod
    def _cadence(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"checkpoint_every_steps must be >= 0 (0 = only at shutdown); got {v}")
        return v

    @field_validator("lr", "adam_eps", "collective_timeout_s", "rendezvous_timeout_s", "join_timeout_s",
                     "heartbeat_interval_s", "poll_s")
    @classmethod
    def _positive(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"must be > 0; got {v}")
        return v

    @field_validator("adam_beta1", "adam_beta2")
    @classmethod
    def _beta(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise ValueError(f"AdamW betas must be in [0, 1); got {v}")
        return v

    @field_validator("weight_decay", "grad_clip")
    @classmethod
    def _non_negative(cls, v: float) -> float:
        if v < 0:
            raise ValueError(f"must be >= 0 (0 turns it off); got {v}")
        return v

    @field_validator("chunk_tokens")
    @classmethod
    def _chunk(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"chunk_tokens must be at least 1 or null (the micro-step budget); got {v}")
        return v

    @field_validator("dist_port")
    @classmethod
    def _port(cls, v: int) -> int:
        if not 0 <= v <= 65535:
            raise ValueError(f"port must be in 0..65535 (0 = the core picks one); got {v}")
        return v


class EngineSection(Section):
    backend: Literal["embedded", "sglang"] = "embedded"
    """Rollout engine of a cell: the embedded engine (CPU, torch) or SGLang servers (GPU clusters)."""
    host: str = "127.0.0.1"
    """Address the engine listens on (embedded engine and launched SGLang). Keep loopback on one machine."""
    port: int = 0
    """HTTP port of the engine; 0 picks a free one."""
    output_source: str = "model"
    """Embedded engine only: where outputs come from, a name in the backend registry of
    `services.cell_agent.engine.backends` (`model` = GyreLM sampling, `scripted` = queued outputs)."""
    max_batch_size: int = 32
    """Requests decoded together (continuous batching)."""
    max_prefill_tokens: int = 2048
    """Prompt tokens computed per scheduling step; longer prompts are prefilled in chunks."""
    block_size: int = 16
    """Tokens per KV block (the unit of the prefix cache and of KV migration)."""
    kv_cache_tokens: int = 65536
    """KV pool capacity in tokens (rounded up to blocks); allocated lazily, so idle capacity costs no RSS."""
    enable_prefix_cache: bool = True
    """Reuse KV blocks of earlier requests with the same token prefix under the same weight version."""
    incremental_streaming_output: bool = True
    """Streamed `/generate` chunks carry only what is new (SGLang's `--incremental-streaming-output`);
    off = every chunk repeats the whole output so far (SGLang's default, quadratic on long outputs)."""
    health_check_timeout_s: float = 20.0
    """`/health_generate` fails if a one-token probe does not finish within this time."""
    num_threads: int = 1
    """torch intra-op threads of the engine's compute thread (cores are shared with other processes)."""
    seed: int = 0
    """Sampling seed; a request's own generator is derived from it and the request id."""
    weight_version: str = "0"
    """Weight version reported before the first weight update."""
    weights_cpu_backup: bool = False
    """On `/release_memory_occupation` with tag `weights`, keep a copy to restore on resume (SGLang's
    `--enable-weights-cpu-backup`); off = weights must be updated after resume before serving."""
    sglang_model_path: str | None = None
    """SGLang only: model path or HF id passed as `--model-path`."""
    sglang_tp_size: int = 1
    """SGLang only: tensor-parallel size (`--tp-size`)."""
    sglang_mem_fraction_static: float | None = None
    """SGLang only: `--mem-fraction-static`; None keeps SGLang's default."""
    sglang_enable_memory_saver: bool = True
    """SGLang only: `--enable-memory-saver`, needed to release and resume memory on role switches."""
    sglang_python: str = "python"
    """SGLang only: interpreter that runs `-m sglang.launch_server`."""
    sglang_args: list[str] = Field(default_factory=list)
    """Extra arguments for `python -m sglang.launch_server` (cluster only)."""

    @field_validator("port")
    @classmethod
    def _port(cls, v: int) -> int:
        if not 0 <= v <= 65535:
            raise ValueError(f"port must be in 0..65535 (0 = pick a free one); got {v}")
        return v

    @field_validator("max_batch_size", "max_prefill_tokens", "block_size", "num_threads", "sglang_tp_size")
    @classmethod
    def _at_least_one(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be at least 1; got {v}")
        return v

    @field_validator("kv_cache_tokens")
    @classmethod
    def _kv_tokens(cls, v: int) -> int:
        if v < 64:
            raise ValueError(f"kv_cache_tokens must be at least 64; got {v}")
        return v

    @field_validator("sglang_mem_fraction_static")
    @classmethod
    def _mem_fraction(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v < 1:
            raise ValueError(f"sglang_mem_fraction_static must be in (0, 1) or null; got {v}")
        return v


class CellAgentSection(Section):
    ports: list[int] = Field(default_factory=list)
    """gRPC port of each cell agent, index = cell; empty = free ports picked by `gyre up`."""
    engine_ports: list[int] = Field(default_factory=list)
    """HTTP port of each cell's rollout engine, index = cell; empty = free ports picked by `gyre up`."""
    engine: EngineSection = Field(default_factory=EngineSection)
    """The rollout engine hosted in the rollout role."""
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    """The trainer run in the training role."""
    release_engine_weights: bool = False
    """On rollout → training, release the engine's weights too (not only its KV cache); they are
    reloaded from the newest published weights on the way back. Off on CPU, where the engine's
    copy is small; on GPUs turn it on to give the trainer the memory."""
    engine_ready_timeout_s: float = 60.0
    """How long a switch to rollout waits for the engine to serve (SGLang start-up included)."""
    publish_timeout_s: float = 120.0
    """Time limit of pushing weights to one rollout engine."""

    @field_validator("engine_ready_timeout_s", "publish_timeout_s")
    @classmethod
    def _positive(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"must be > 0; got {v}")
        return v
