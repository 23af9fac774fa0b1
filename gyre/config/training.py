"""Config sections of the training side: the objective (GSPO-variant loss), the packer (groups to
micro-steps) and the trainer a cell runs in its training role."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gyre.config.base import (
    AtLeastOne,
    AtLeastOneOrNull,
    NonNegativeFloat,
    NonNegativeInt,
    Port,
    PositiveFloat,
    Section,
)

TokenCorrectionName = Literal["tis", "mis", "icepop"]
"""The names of `gyre.rl.corrections.TOKEN_CORRECTIONS` (the config may not import torch), kept equal to
it by tests/unit/rl/test_corrections.py."""


class ObjectiveSection(Section):
    clip_low: float = 0.995
    """Sequence-ratio bound under which an execution with negative advantage is masked."""
    clip_high: float = 1.005
    """Sequence-ratio bound above which an execution with positive advantage is masked."""
    token_ratio_cap: float = 5.0
    """Cap of the stop-gradient token importance weight."""
    token_loss_cap: float = 100.0
    """Cap of a token's loss."""
    token_correction: TokenCorrectionName = "tis"
    """Token-level train/inference mismatch correction (docs/method.md, "Mismatch corrections"): `tis`,
    the paper's weight sg(min(ρ_u, token_ratio_cap)); `mis`, masked IS: a target whose ρ_u leaves
    [mis_low, mis_high] is dropped, the others weighted sg(ρ_u) uncapped; `icepop`: a target whose ρ_u
    leaves [icepop_low, icepop_high] is dropped, the others keep the capped weight. A dropped target
    leaves its execution's normalizer (the kept ones carry 1/(L'_i·B·N))."""
    mis_low: float = 0.0
    """`mis`: ratio below which a target is dropped (0 = no lower bound)."""
    mis_high: float = 2.0
    """`mis`: ratio above which a target is dropped."""
    icepop_low: float = 0.5
    """`icepop`: ratio below which a target is dropped."""
    icepop_high: float = 5.0
    """`icepop`: ratio above which a target is dropped."""
    sequence_mask: bool = False
    """Geometric-mean masking: drop a whole execution whose s_i = exp(mean log ρ_u) over its targets
    leaves [sequence_mask_low, sequence_mask_high], whatever the sign of its advantage."""
    sequence_mask_low: float = 0.99
    """Lower bound of s_i under `sequence_mask`."""
    sequence_mask_high: float = 1.01
    """Upper bound of s_i under `sequence_mask`."""
    mismatch_bound: PositiveFloat = 0.1
    """|log π_θ − log p_roll| above which a target counts in the step's `mismatch_over_bound_fraction`."""

    @model_validator(mode="after")
    def _bands(self) -> ObjectiveSection:
        if not 0.0 < self.clip_low <= 1.0 <= self.clip_high:
            raise ValueError(
                f"need 0 < clip_low <= 1 <= clip_high; got clip_low={self.clip_low}, clip_high={self.clip_high}"
            )
        for name, low, high, floor in (
            ("mis", self.mis_low, self.mis_high, 0.0),
            ("icepop", self.icepop_low, self.icepop_high, None),
            ("sequence_mask", self.sequence_mask_low, self.sequence_mask_high, None),
        ):
            low_ok = low >= 0.0 if floor is not None else low > 0.0
            if not (low_ok and low <= 1.0 <= high < math.inf):
                bound = "0 <=" if floor is not None else "0 <"
                raise ValueError(
                    f"need {bound} {name}_low <= 1 <= {name}_high (a band keeps ratio 1); "
                    f"got {name}_low={low}, {name}_high={high}"
                )
        return self


class PackerSection(Section):
    port: Port = 0
    """gRPC port; 0 picks a free one."""
    j_max: AtLeastOne = 5
    """J_max: trajectories admitted per execution."""
    microstep_tokens: AtLeastOne = 8192
    """Token budget of one micro-step."""
    normalize_std: bool = False
    """Divide group-relative advantages by the group's reward std (+eps)."""
    row_layout: Literal["paths", "tree"] = "tree"
    """How an execution's admitted trajectories become training rows: `tree` packs the admitted paths
    under each root into one row, each shared prefix once, with ancestor-only attention (same
    gradient as `paths`, fewer tokens; the trainer must support tree rows — `MicroStep.as_path_rows`
    expands them for one that does not); `paths` gives every trajectory its own root-to-leaf row."""


class MegatronSection(Section):
    """Settings of the `megatron` trainer backend (`gyre/trainer/backends/megatron/README.md`)."""

    tensor_parallel_size: AtLeastOne = 1
    """Tensor-parallel ranks inside a cell: heads, query groups, vocab rows and FFN columns are split over
    them, so it must divide num_attention_heads, num_key_value_heads, vocab_size and intermediate_size
    of the model (checked at `gyre up` and service start, exit 2 naming the field). A cell agent runs
    one trainer process, so it trains at 1; larger sizes need a launcher with one process per rank."""
    params_dtype: Literal["float32", "float64", "bfloat16"] | None = None
    """dtype of the Megatron parameters; None = `trainer.dtype`. On CPU gradients and AdamW state share
    it; on GPUs (Megatron's DistributedOptimizer) gradients and optimizer state are float32 with float32
    master weights, so `bfloat16` is the usual choice there."""


class LoraSection(Section):
    """A LoRA adapter trained instead of the whole model (`gyre.model.lora`): only its A and B matrices get
    gradients and optimizer state, satellites pull only them, and a publication is a PEFT adapter
    directory the engines serve on top of the unchanged base (`model.path`)."""

    rank: AtLeastOne = 16
    """r: the adapter's rank (A: [r, in], B: [out, r])."""
    alpha: PositiveFloat = 32.0
    """lora_alpha: the delta is scaled by alpha / r (alpha / √r with `use_rslora`)."""
    dropout: float = 0.0
    """lora_dropout: dropout on the adapter's input in training forwards (never when serving). Above 0
    every training forward is random: π_θ of the importance ratio is then a dropout sample, and a
    chunked micro-step's two passes see different masks."""
    target_modules: list[str] = Field(default_factory=lambda: ["all-linear"])
    """Modules adapted, PEFT's names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; a
    name matches every layer's module of that name, `all-linear` all seven). A name that matches no module
    of the model stops the run at start (exit 2)."""
    use_rslora: bool = False
    """Rank-stabilized scaling alpha / √r."""
    seed: int = 0
    """Seed of A's initialization (B starts at zero, so the first policy is the base model)."""

    @field_validator("dropout")
    @classmethod
    def _dropout(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise ValueError(f"must be in [0, 1); got {v}")
        return v


WeightTransportName = Literal["mooncake", "torch"]
"""The names of `gyre.weights.transports.WEIGHT_TRANSPORTS` (the trainer's config may not import the
transports: a contract keeps the trainer below them), kept equal to the registry by its contract test,
tests/unit/cell_agent/test_weight_transports.py."""


class TrainerSection(Section):
    backend: str = "torch"
    """Trainer backend of a cell, a name in the registry of `gyre.trainer.backends` (checked before
    anything starts, `gyre.trainer.layout.check_trainer`): `torch` (the
    embedded default, `gyre.model.CausalLM`) or `megatron` (megatron-core GPTModel; `pip install
    'gyre[megatron]'`, or `gyre[gpu]` on GPU nodes; settings in `megatron`)."""
    megatron: MegatronSection = Field(default_factory=MegatronSection)
    """The megatron backend's parallel layout and parameter dtype."""
    lora: LoraSection | None = None
    """Train a LoRA adapter on the frozen base instead of every weight (torch backend); None = full
    fine-tuning."""
    device: str = "cpu"
    """torch device of the trainer (`cpu`, `cuda`, `cuda:0`)."""
    dtype: Literal["float32", "float64", "bfloat16"] = "float32"
    """Parameter, gradient and optimizer-state dtype (the checkpoint is converted on load; published
    directories are written in it)."""
    num_threads: AtLeastOne = 1
    """torch intra-op threads of the trainer's compute thread (cores are shared with other processes)."""
    lr: PositiveFloat = 1e-4
    """AdamW learning rate (constant)."""
    weight_decay: NonNegativeFloat = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW β1."""
    adam_beta2: float = 0.999
    """AdamW β2."""
    adam_eps: PositiveFloat = 1e-8
    """AdamW ε."""
    grad_clip: NonNegativeFloat = 1.0
    """Global gradient-norm clip applied by the core to the summed gradient (0 = no clipping)."""
    chunk_tokens: AtLeastOneOrNull = None
    """Token limit of one forward for a micro-step over its budget (chunked path); None = the budget."""
    checkpoint_every_steps: NonNegativeInt = 1
    """Checkpoint model + optimizer + version every this many steps (0 = only at shutdown). A core that
    restarts resumes from its newest checkpoint and takes the steps after it again from their micro-steps,
    which stay in Redis until a checkpoint covers them: N bounds both that replay and that memory."""
    checkpoint_dir: Path | None = None
    """Where the core writes checkpoints and published weights; None = `<run dir>/checkpoints`. Other
    cells read it only with `cell_agent.published_weights: shared` (which `publication: disk` needs); by
    default the core streams published weights to them."""
    keep_checkpoints: AtLeastOne = 2
    """Checkpoints kept on disk (older ones are deleted); the newest published weights are always kept."""
    dist_backend: Literal["gloo", "nccl", "tls"] = "gloo"
    """What carries the cells' collectives (gradient reduction, parameter broadcast, the `torch` weight
    transport): torch.distributed's `gloo` (CPU) or `nccl` (GPUs), both plaintext, or `tls`, Gyre's own
    star of mutual-TLS connections from each satellite to the core (`gyre.trainer.star`; CPU trainers,
    needs `tls.enabled`) for deployments whose cells' network is not private."""
    dist_port: Port = 0
    """Port of the core's rendezvous (gloo/NCCL: the TCPStore; tls: the star's TLS listener); 0 = the
    core picks a free one and announces it through Redis."""
    dist_socket_ifname: str | None = None
    """Network interface gloo/NCCL bind (sets GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME); None = the
    interface of the host name (loopback on a single machine)."""
    collective_timeout_s: PositiveFloat = 600.0
    """Timeout of one collective (gradient reduction, parameter broadcast, snapshot broadcast)."""
    rendezvous_timeout_s: PositiveFloat = 120.0
    """How long a cell waits for every cell to join the torch.distributed world at start-up."""
    weight_transport: WeightTransportName = "torch"
    """How a satellite pulls the core's snapshot, a name in the registry of `gyre.weights.transports`:
    `torch`, a torch.distributed broadcast from the core over the cells' own gloo/NCCL groups (the embedded
    default: no extra listener, loopback only), or `mooncake`, the Mooncake Transfer Engine (one flat
    buffer registered by the core, read by satellites; clusters select it, deploy/k8s, where the
    NetworkPolicy confines it: it listens on 0.0.0.0 whatever it is given)."""
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
    join_timeout_s: PositiveFloat = 120.0
    """How long a cell waits for the core to open the batch it was asked to join."""
    heartbeat_interval_s: PositiveFloat = 1.0
    """Seconds between a training cell's heartbeats on the micro-step queue (must be well under
    `redis.heartbeat_timeout_s`, after which its claimed micro-steps are reclaimed)."""
    poll_s: PositiveFloat = 0.02
    """Wait between two looks at an empty micro-step queue (the consistent point where a cell idles)."""
    publication: Literal["tensor", "disk", "distributed"] = "tensor"
    """How the core pushes published weights into the rollout engines of other cells (its own engine is
    updated in-process): `tensor` = `/update_weights_from_tensor` (safetensors to the embedded engine;
    SGLang's serialized form, same-host only); `disk` = `/update_weights_from_disk` of the published HF
    directory (every engine must see `checkpoint_dir`); `distributed` = `/init_weights_update_group`
    once per engine, then `/update_weights_from_distributed`: the core broadcasts each tensor over a
    group of itself and the engine's ranks (`dist_backend`: gloo on CPU, NCCL between GPUs)."""
    publish_abort_requests: bool = False
    """Abort the requests an engine is running when new weights arrive (SGLang's `abort_all_requests`).
    False keeps them: they continue under the new weights with their prefix cache flushed (no prefix
    computed under old weights is served again)."""
    routing_replay: bool = False
    """Routing replay (R3) for MoE models: the trainer's MoE layers use the experts the engine chose for
    each token (recorded by the proxy from `return_routed_experts`; `gyre.model.routing`), with the
    trainer's own router weights at them. Turns on `proxy.record_routed_experts`; needs the torch
    backend, an MoE model and engines that return routing (SGLang: `--enable-return-routed-experts`)."""

    @field_validator("adam_beta1", "adam_beta2")
    @classmethod
    def _beta(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise ValueError(f"AdamW betas must be in [0, 1); got {v}")
        return v

    @model_validator(mode="after")
    def _lora_layout(self) -> TrainerSection:
        if self.lora is not None and self.backend != "torch":
            raise ValueError(
                f"lora: the {self.backend} backend does not train LoRA adapters; use backend: torch, or drop lora"
            )
        if self.routing_replay and self.backend != "torch":
            raise ValueError(
                f"routing_replay: the {self.backend} backend does not replay MoE routing; use backend: torch, "
                "or set routing_replay: false"
            )
        if self.lora is not None and self.publication == "distributed":
            raise ValueError(
                "lora: an adapter is published by /load_lora_adapter (publication: tensor or disk), not over a "
                "distributed weight-update group; set publication: tensor"
            )
        return self

    @model_validator(mode="after")
    def _dist_backend_fits(self) -> TrainerSection:
        """nccl moves CUDA tensors; the TLS star moves CPU tensors and forms no weight-update group."""
        if self.dist_backend == "nccl" and not self.device.startswith("cuda"):
            raise ValueError(
                f"dist_backend nccl needs a CUDA trainer device; device is {self.device!r}: set device: cuda, "
                "or dist_backend: gloo"
            )
        if self.dist_backend == "tls" and not self.device.startswith("cpu"):
            raise ValueError(
                f"dist_backend tls moves CPU tensors; device is {self.device!r}: set dist_backend: nccl (on a "
                "private network) or device: cpu"
            )
        if self.dist_backend == "tls" and self.publication == "distributed":
            raise ValueError(
                "publication distributed broadcasts over a torch.distributed group into the engines; with "
                "dist_backend tls set publication: tensor or disk"
            )
        return self
