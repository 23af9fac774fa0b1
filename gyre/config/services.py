"""Config sections of the proxy, runner, evaluator, packer and cell agents (one class each).

A section grows with its service; keep every field documented and validated.
"""

from __future__ import annotations

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
    """Trainer backend of a cell."""
    lr: float = 1e-4
    """AdamW learning rate (constant)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip applied by the core."""
    checkpoint_every_steps: int = 0
    """Checkpoint model + optimizer + version every this many steps (0 = only at shutdown)."""
    dist_backend: Literal["gloo", "nccl"] = "gloo"
    """torch.distributed backend."""
    weight_transport: Literal["mooncake", "torch"] = "mooncake"
    """How a satellite pulls the core's snapshot (Mooncake Transfer Engine, or a torch broadcast)."""


class EngineSection(Section):
    backend: Literal["embedded", "sglang"] = "embedded"
    """Rollout engine of a cell."""
    port: int = 0
    """HTTP port of the engine; 0 picks a free one."""
    max_batch_size: int = 32
    """Requests decoded together (continuous batching)."""
    seed: int = 0
    """Sampling seed."""
    sglang_args: list[str] = Field(default_factory=list)
    """Extra arguments for `python -m sglang.launch_server` (cluster only)."""


class CellAgentSection(Section):
    ports: list[int] = Field(default_factory=list)
    """gRPC port of each cell agent, index = cell; empty = free ports picked by `gyre up`."""
    engine_ports: list[int] = Field(default_factory=list)
    """HTTP port of each cell's rollout engine, index = cell; empty = free ports picked by `gyre up`."""
    engine: EngineSection = Field(default_factory=EngineSection)
    """The rollout engine hosted in the rollout role."""
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    """The trainer run in the training role."""
