"""Config sections of the proxy, runner, evaluator, packer and cell agents (one class each).

A section grows with its service; keep every field documented and validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

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
    template: str = "embedded"
    """Chat template the trees record token ids with (a name in `gyre.trajectory.TEMPLATES`); it must be
    the template of the model the engines serve. `hf` also needs `hf_tokenizer`."""
    tool_call_parser: str = "hermes"
    """Tool-call parser of engine outputs (a name in `gyre.trajectory.PARSERS`)."""
    hf_tokenizer: str | None = None
    """Template `hf` only: local path of the Hugging Face tokenizer whose chat template renders calls."""
    hf_end_of_turn: str = "<|im_end|>"
    """Template `hf` only: the token that ends an assistant turn."""
    default_max_tokens: int = 4096
    """Output budget of a call whose request names none (capped by the engine's context length)."""
    max_engine_attempts: int = 4
    """Attempts of one call on engines that fail or abort it (connection lost, engine shutting down);
    moves ordered by a drain do not count. After the last one the harness gets an error."""
    retry_backoff_s: float = 0.25
    """Delay before the second attempt; doubles with each further attempt."""
    engine_timeout_s: float = 900.0
    """Longest a call may wait on an engine (covers long generations)."""
    drain_timeout_s: float = 60.0
    """Longest a Drain waits for one in-flight call to leave the drained engine."""

    @field_validator("max_body_bytes", "default_max_tokens", "max_engine_attempts")
    @classmethod
    def _proxy_positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be at least 1; got {v}")
        return v

    @field_validator("retry_backoff_s", "engine_timeout_s", "drain_timeout_s")
    @classmethod
    def _proxy_non_negative(cls, v: float) -> float:
        if v < 0:
            raise ValueError(f"must be non-negative seconds; got {v}")
        return v


class SandboxSection(Section):
    """How harness executions (runner) and verifier runs (evaluator) are sandboxed."""

    isolation: Literal["auto", "isolated", "process"] = "auto"
    """`isolated`: own uid per slot, rlimits, network namespace with only the proxy relayed (root
    only); `process`: own process group, scrubbed env, rlimits; `auto`: isolated when root."""
    uid_base: int = 120000
    """First sandbox uid; slot k runs as uid_base + k (instance i of a service adds i * 1000)."""
    cpu_s: int | None = 3600
    """CPU seconds per process; None = unlimited."""
    memory_mb: int | None = 4096
    """Address space per process in MiB (RLIMIT_AS); None = unlimited (JS runtimes need that)."""
    max_processes: int | None = 512
    """Processes and threads of one sandbox (RLIMIT_NPROC on its uid)."""
    file_size_mb: int | None = 1024
    """Largest file a sandboxed process may write, MiB."""
    open_files: int | None = 1024
    """Open file descriptors per process."""
    kill_grace_s: float = 5.0
    """Seconds between SIGTERM and SIGKILL when a sandbox is stopped."""

    @field_validator("uid_base")
    @classmethod
    def _uid_base(cls, v: int) -> int:
        if not 1000 <= v <= 2**31 - 100_000:
            raise ValueError(f"uid_base must be in [1000, 2^31 - 100000] (unused uids); got {v}")
        return v

    @field_validator("cpu_s", "memory_mb", "max_processes", "file_size_mb", "open_files")
    @classmethod
    def _limit(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"a sandbox limit must be at least 1, or null for unlimited; got {v}")
        return v

    @field_validator("kill_grace_s")
    @classmethod
    def _grace(cls, v: float) -> float:
        if v < 0:
            raise ValueError(f"kill_grace_s must be non-negative; got {v}")
        return v


class RunnerSandboxSection(SandboxSection):
    """Sandbox of harness executions."""

    uid_base: int = 120000
    """First sandbox uid; slot k runs as uid_base + k (instance i adds i * 1000). Keep the runner's and
    the evaluator's ranges apart."""


class VerifierSandboxSection(SandboxSection):
    """Sandbox of verifier runs (no network at all, whatever `isolation` says about the proxy)."""

    uid_base: int = 130000
    """First verifier uid; slot k runs as uid_base + k (instance i adds i * 1000)."""
    cpu_s: int | None = 600
    """CPU seconds per verifier process; None = unlimited."""


class RunnerSection(Section):
    port: int = 0
    """gRPC port; 0 picks a free one."""
    max_concurrent: int = 32
    """Executions this runner keeps running at once."""
    harness: Literal["demo", "claude_code", "codex", "command"] = "demo"
    """Which harness command the runner launches (`command` = the argv in `command`)."""
    harness_args: list[str] = Field(default_factory=list)
    """Extra arguments appended to the harness command (e.g. `--tool-latency-s 2` for the demo)."""
    command: list[str] = Field(default_factory=list)
    """argv of the `command` harness; `{prompt}`, `{task_id}`, `{execution_id}`, `{python}` are expanded."""
    task_dirs: list[Path] = Field(default_factory=list)
    """Directories of on-disk tasks (`<dir>/<name>/task.yaml`), besides the built-in suites."""
    workspace_dir: Path | None = None
    """Where workspaces are created; None = `<run dir>/workspaces`."""
    sandbox: RunnerSandboxSection = Field(default_factory=RunnerSandboxSection)
    """Sandbox of harness executions."""
    on_stop: Literal["cancel", "detach"] = "cancel"
    """At shutdown: cancel running executions (terminated, CANCELLED) or leave them running for
    the next incarnation of this runner to adopt."""
    open_attempts: int = 3
    """OpenExecution attempts on the proxy before a start fails as INFRA_FAILURE."""

    @field_validator("max_concurrent", "open_attempts")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be at least 1; got {v}")
        return v

    @model_validator(mode="after")
    def _command_given(self) -> RunnerSection:
        if self.harness == "command" and not self.command:
            raise ValueError("harness `command` needs runner.command (an argv, e.g. [bash, -c, '{prompt}'])")
        return self


class EvaluatorSection(Section):
    port: int = 0
    """gRPC port; 0 picks a free one."""
    max_attempts: int = 3
    """Verifier attempts on one preserved workspace before the execution is excluded."""
    backoff_s: float = 0.5
    """First retry delay; doubles each attempt, bounded by the execution's overall budget."""
    max_concurrent: int = 4
    """Verifier runs at once."""
    task_dirs: list[Path] = Field(default_factory=list)
    """Directories of on-disk tasks; must match the runner's."""
    work_dir: Path | None = None
    """Where verifier attempts copy workspaces; None = `<run dir>/evaluations`."""
    sandbox: VerifierSandboxSection = Field(default_factory=VerifierSandboxSection)
    """Sandbox of verifier runs (network: none)."""

    @field_validator("max_attempts", "max_concurrent")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be at least 1; got {v}")
        return v

    @field_validator("backoff_s")
    @classmethod
    def _backoff(cls, v: float) -> float:
        if v < 0:
            raise ValueError(f"backoff_s must be non-negative; got {v}")
        return v


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
