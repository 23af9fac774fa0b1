"""Routing replay (R3) for mixture-of-experts models: the trainer uses the experts the engine chose.

An engine in bfloat16 and a trainer in float32 (or the same weights a step apart) can let a token's
router pick other experts: the trainer then scores the token with a different network than the one
that sampled it, and the importance ratio of that token is noise. SGLang returns each token's experts
(`return_routed_experts`); miles, slime, verl and others replay them in the trainer's forward.

    routing = ExpertRouting(replay=experts)      # experts [T, L, k] int; a row of -1: route freely
    logits = model(ids, positions, cu_seqlens, routing=routing)
    routing.chosen                               # {layer: [T, k]} the experts each MoE layer used
    routing.stacked(num_layers, top_k)           # [T, L, k] int32, -1 for dense layers

The layout is SGLang's: per token, per decoder layer (dense layers included, -1 there), the top-k
expert ids. A replayed token's weights are the trainer's own router probabilities at the replayed
experts, renormalized as the model does, so the router still gets a gradient (what miles and slime
do); only the choice is replayed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class ExpertRouting:
    """The routing of one forward: what to replay (optional) and what each MoE layer chose."""

    replay: torch.Tensor | None = None
    """[T, L, k] expert ids per token and decoder layer; a token whose row (of a layer) holds a
    negative id routes freely there. None: every token routes freely."""
    chosen: dict[int, torch.Tensor] = field(default_factory=dict)
    """Decoder layer → [T, k] expert ids the layer used (filled by the forward)."""

    def given(self, layer: int, num_tokens: int, top_k: int) -> torch.Tensor | None:
        """The replayed experts of `layer`, [T, k] (None: route freely)."""
        if self.replay is None:
            return None
        if self.replay.dim() != 3 or self.replay.shape[0] != num_tokens or self.replay.shape[2] != top_k:
            raise ValueError(
                f"routing replay must be [T={num_tokens}, layers, k={top_k}] expert ids; got "
                f"{tuple(self.replay.shape)}"
            )
        if layer >= self.replay.shape[1]:
            raise ValueError(f"routing replay covers {self.replay.shape[1]} layers; layer {layer} is MoE")
        return self.replay[:, layer]

    def stacked(self, num_layers: int, top_k: int) -> torch.Tensor:
        """[T, L, k] int32 of the chosen experts, -1 in the layers that chose none (dense)."""
        if not self.chosen:
            raise ValueError("no MoE layer recorded a routing (a dense model?)")
        num_tokens = next(iter(self.chosen.values())).shape[0]
        out = torch.full((num_tokens, num_layers, top_k), -1, dtype=torch.int32)
        for layer, experts in self.chosen.items():
            out[:, layer] = experts.to(torch.int32)
        return out


def replayed_experts(probs: torch.Tensor, given: torch.Tensor, top_k: int) -> torch.Tensor:
    """The experts [N, k] of tokens routed by `probs` [N, E] with `given` [N, k] replayed: a token
    takes its given row when that row holds no negative id, its own top-k otherwise."""
    num_experts = probs.shape[-1]
    if given.shape != (probs.shape[0], top_k):
        raise ValueError(
            f"replayed experts must be [N={probs.shape[0]}, k={top_k}]; got {tuple(given.shape)}"
        )
    given = given.to(device=probs.device, dtype=torch.long)
    if given.numel() and int(given.max()) >= num_experts:
        raise ValueError(f"replayed expert id {int(given.max())} is beyond the model's {num_experts} experts")
    known = (given >= 0).all(dim=-1, keepdim=True)
    if bool(known.all()):
        return given
    free = torch.topk(probs, top_k, dim=-1).indices
    return torch.where(known, given, free)
