"""`CausalLM`: Llama / Qwen2 / Qwen3 (dense) and Qwen3-MoE in plain torch, with the Hugging Face
parameter names.

One module serves and trains every supported checkpoint, so the engine, the trainer and the
published directories share one parameter set, named exactly as in the checkpoint's safetensors:

    model.embed_tokens.weight                                     [V, d]
    model.layers.{i}.input_layernorm.weight                       [d]
    model.layers.{i}.self_attn.{q,k,v}_proj.weight (+ .bias)      [H·hd | Hkv·hd, d]
    model.layers.{i}.self_attn.o_proj.weight (+ .bias)            [d, H·hd]
    model.layers.{i}.self_attn.{q,k}_norm.weight      (Qwen3)     [hd]
    model.layers.{i}.post_attention_layernorm.weight              [d]
    model.layers.{i}.mlp.{gate,up,down}_proj.weight (+ .bias)
    model.layers.{i}.mlp.gate.weight                  (MoE)       [E, d]       the router
    model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight   (MoE, sparse layers)
    model.norm.weight                                             [d]
    lm_head.weight                                  (untied only) [V, d]

so a checkpoint loads as its own state dict (`gyre.model.weights`). Two forwards share the modules:

- training (packed): `logits = model(input_ids, position_ids, cu_seqlens, tree)` over S rows
  concatenated into T tokens with block-diagonal causal attention, or ancestor-only attention inside
  tree-packed rows (`tree`, a `TreeLayout`; `gyre.model.attention`), logits [T, V];
- serving (paged): `model.forward_paged(input_ids, cache, batch)` over B rows of new tokens that
  attend K/V held in a `PagedKVCache` (`gyre.model.paged`), keys stored after rotary.

Every op follows transformers' modeling files (RMSNorm in float32 then `weight * x`, rotate-half
rotary, q/k norm before rotary, the MoE router's float32 softmax, top-k and renormalization), so
log-probs agree with a `transformers` forward (tested).

Both forwards take an optional `lora` (`gyre.model.lora`): low-rank deltas added to the outputs of
the targeted linear modules (q/k/v/o, gate/up/down of dense MLPs) — one adapter for the whole batch
when training, one adapter per row when serving; the base parameters are untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gyre.model.arch import ModelArch
from gyre.model.attention import packed_attention
from gyre.model.lora import LoraDelta
from gyre.model.paged import PagedBatch, PagedKVCache
from gyre.model.rope import Rotary, apply_rotary
from gyre.model.routing import ExpertRouting, replayed_experts
from gyre.model.tree_layout import TreeLayout


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # the common case: skip the two no-op casts (each is a dispatch)
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
        # bf16/fp16 are normalized in float32 as transformers does; float64 stays float64.
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        out: torch.Tensor = self.weight * normed.to(x.dtype)
        return out

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        """`forward` as one `F.rms_norm` kernel (serving: about half the time of the five ops, equal
        to float32 rounding); other dtypes keep `forward`, which normalizes in float32 first."""
        if x.dtype != torch.float32:
            return self(x)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, arch: ModelArch, index: int = 0) -> None:
        super().__init__()
        self.index = index
        d = arch.hidden_size
        self.num_heads, self.num_kv_heads, self.head_dim = arch.num_heads, arch.num_kv_heads, arch.head_dim
        self.scale = arch.head_dim**-0.5
        self.q_proj = nn.Linear(d, arch.q_size, bias=arch.qkv_bias)
        self.k_proj = nn.Linear(d, arch.kv_size, bias=arch.qkv_bias)
        self.v_proj = nn.Linear(d, arch.kv_size, bias=arch.qkv_bias)
        self.o_proj = nn.Linear(arch.q_size, d, bias=arch.o_bias)
        self.q_norm = RMSNorm(arch.head_dim, arch.rms_norm_eps) if arch.qk_norm else None
        self.k_norm = RMSNorm(arch.head_dim, arch.rms_norm_eps) if arch.qk_norm else None
        self._fused: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self._qk_weight: tuple[tuple[int, ...], torch.Tensor] | None = None

    def fuse(self) -> None:
        """One matmul for q, k and v (see `CausalLM.fuse_projections`)."""
        if self._fused is None:
            self._fused = _fuse((self.q_proj, self.k_proj, self.v_proj))

    def _qkv(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lora: LoraDelta | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lead = x.shape[:-1]
        if self._fused is not None:
            qkv = F.linear(x, *self._fused)
            q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            q_flat, k_flat, v_flat = qkv.split((q_out, kv_out, kv_out), dim=-1)
        else:
            q_flat, k_flat, v_flat = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if lora is not None:
            q_flat = lora.add(self.index, "q_proj", x, q_flat)
            k_flat = lora.add(self.index, "k_proj", x, k_flat)
            v_flat = lora.add(self.index, "v_proj", x, v_flat)
        q = q_flat.view(*lead, self.num_heads, self.head_dim)
        k = k_flat.view(*lead, self.num_kv_heads, self.head_dim)
        v = v_flat.view(*lead, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def _paged_qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lora: LoraDelta | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`_qkv` for serving: the fused projection's q and k columns are normalized and rotated as one
        tensor of H + H_kv heads (one RMSNorm and one rotation instead of two each: a small model's
        decode step is bound by the number of ops). Same math as `_qkv`, equal to float32 rounding."""
        if self._fused is None or lora is not None or x.dtype != torch.float32:
            return self._qkv(x, cos, sin, lora)
        lead, heads, dim = x.shape[:-1], self.num_heads + self.num_kv_heads, self.head_dim
        qkv = F.linear(x, *self._fused)
        qk = qkv[..., : heads * dim].view(*lead, heads, dim)
        v = qkv[..., heads * dim :].view(*lead, self.num_kv_heads, dim)
        if self.q_norm is not None:
            qk = F.rms_norm(qk, (dim,), None, self.q_norm.eps) * self._qk_norm_weight()
        qk = apply_rotary(qk, cos, sin)
        return qk[..., : self.num_heads, :], qk[..., self.num_heads :, :], v

    def _qk_norm_weight(self) -> torch.Tensor:
        """[H + H_kv, head_dim]: q_norm's weight for each query head, then k_norm's for each key head;
        rebuilt when either weight changes (weight updates copy in place, which bumps `_version`)."""
        assert self.q_norm is not None and self.k_norm is not None
        q, k = self.q_norm.weight, self.k_norm.weight
        key = (q._version, k._version, q.data_ptr(), k.data_ptr())
        if self._qk_weight is None or self._qk_weight[0] != key:
            stacked = torch.cat(
                (q.detach().expand(self.num_heads, -1), k.detach().expand(self.num_kv_heads, -1))
            )
            self._qk_weight = (key, stacked)
        return self._qk_weight[1]

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cu_seqlens: list[int],
        tree: TreeLayout | None = None,
        lora: LoraDelta | None = None,
    ) -> torch.Tensor:
        """Packed: x [T, d]; each row of `cu_seqlens` attends causally to itself only (ancestor-only
        within a tree-packed row: `gyre.model.attention.packed_attention`)."""
        q, k, v = self._qkv(x, cos, sin, lora)
        out = packed_attention(q, k, v, cu_seqlens, tree, scale=self.scale)
        return self._out(out.reshape(*x.shape[:-1], -1), lora)

    def _out(self, x: torch.Tensor, lora: LoraDelta | None) -> torch.Tensor:
        projected: torch.Tensor = self.o_proj(x)
        return projected if lora is None else lora.add(self.index, "o_proj", x, projected)

    def forward_paged(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: PagedKVCache,
        layer: int,
        batch: PagedBatch,
        lora: LoraDelta | None = None,
    ) -> torch.Tensor:
        """Paged: x [B, Lq, d]; writes the new K/V into the pool, then attends the first
        `batch.num_keys` slots of `batch.read_blocks`."""
        num_rows, num_queries = x.shape[0], x.shape[1]
        q, k, v = self._paged_qkv(x, cos, sin, lora)
        keys, values = cache.attend(layer, batch, k, v)  # [B, H_kv, Lk, D]
        if num_queries == 1:
            # Decode: the query heads sharing a key/value head attend as that head's queries
            # ([B, H_kv, H/H_kv, D]): grouped-query attention without repeating keys or transposing.
            groups = self.num_heads // self.num_kv_heads
            out = F.scaled_dot_product_attention(
                q.view(num_rows, self.num_kv_heads, groups, self.head_dim),
                keys,
                values,
                attn_mask=batch.mask,
                scale=self.scale,
            )
        else:
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                keys,
                values,
                attn_mask=batch.mask,
                scale=self.scale,
                enable_gqa=self.num_heads != self.num_kv_heads,
            ).transpose(1, 2)
        return self._out(out.reshape(num_rows, num_queries, -1), lora)


class MLP(nn.Module):
    """SwiGLU: `down(silu(gate(x)) * up(x))` (a dense layer's MLP, and each expert of a sparse one)."""

    def __init__(self, d: int, inter: int, bias: bool = False, index: int = 0) -> None:
        super().__init__()
        self.index = index
        self.gate_proj = nn.Linear(d, inter, bias=bias)
        self.up_proj = nn.Linear(d, inter, bias=bias)
        self.down_proj = nn.Linear(inter, d, bias=bias)
        self._fused: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def fuse(self) -> None:
        """One matmul for gate and up (see `CausalLM.fuse_projections`)."""
        if self._fused is None:
            self._fused = _fuse((self.gate_proj, self.up_proj))

    def serve(self, x: torch.Tensor, lora: LoraDelta | None = None) -> torch.Tensor:
        """`forward` for the engine (the sparse block's `serve` differs)."""
        return self(x, lora)

    def forward(self, x: torch.Tensor, lora: LoraDelta | None = None) -> torch.Tensor:
        if self._fused is not None:
            gate, up = F.linear(x, *self._fused).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        if lora is None:
            out: torch.Tensor = self.down_proj(F.silu(gate) * up)
            return out
        gate = lora.add(self.index, "gate_proj", x, gate)
        up = lora.add(self.index, "up_proj", x, up)
        hidden = F.silu(gate) * up
        return lora.add(self.index, "down_proj", hidden, self.down_proj(hidden))


class SparseMoeBlock(nn.Module):
    """Qwen3-MoE's sparse MLP, as transformers computes it (`Qwen3MoeSparseMoeBlock`): the router
    `gate` scores every expert, softmax in float32, the top `num_experts_per_tok` are kept (and
    renormalized to sum 1 when `norm_topk_prob`) and cast back to the hidden dtype; each token's output
    is the weighted sum of its chosen experts' SwiGLU MLPs, added up in expert order. Experts keep the
    checkpoint's own names (`experts.{e}.gate_proj.weight`, ...), so a Hub checkpoint loads as is."""

    def __init__(self, arch: ModelArch, index: int = 0) -> None:
        super().__init__()
        moe = arch.moe
        assert moe is not None
        self.index = index
        self.top_k = moe.num_experts_per_tok
        self.norm_topk_prob = moe.norm_topk_prob
        self.gate = nn.Linear(arch.hidden_size, moe.num_experts, bias=False)
        self.experts = nn.ModuleList(
            MLP(arch.hidden_size, moe.moe_intermediate_size) for _ in range(moe.num_experts)
        )
        self._stacked: tuple[torch.Tensor, torch.Tensor] | None = None

    def fuse(self) -> None:
        """Fuse each expert's gate and up; for serving a few experts (`serve`), also stack every expert's
        gate/up [E, 2·inter, d] and down [E, d, inter] weights, each expert's parameters becoming views."""
        experts = [e for e in self.experts if isinstance(e, MLP)]
        for expert in experts:
            expert.fuse()
        if self._stacked is not None or not self._serves_densely() or experts[0].down_proj.bias is not None:
            return
        with torch.no_grad():
            gate_up = torch.stack([e._fused[0] for e in experts if e._fused is not None])
            down = torch.stack([e.down_proj.weight.detach() for e in experts])
            inter = experts[0].gate_proj.weight.shape[0]
            for i, expert in enumerate(experts):
                expert.gate_proj.weight.data = gate_up[i, :inter]
                expert.up_proj.weight.data = gate_up[i, inter:]
                expert.down_proj.weight.data = down[i]
                expert._fused = (gate_up[i], None)
        self._stacked = (gate_up, down)

    def _serves_densely(self) -> bool:
        return len(self.experts) <= 4 * self.top_k

    def serve(
        self, x: torch.Tensor, lora: LoraDelta | None = None, routing: ExpertRouting | None = None
    ) -> torch.Tensor:
        """`forward` for the engine. With few experts (at most 4x the chosen ones), every expert runs on
        every token as three batched ops over the stacked weights, and the routing weights — zero for the
        experts a token did not choose — combine them: a decode step of a small model is bound by the
        number of ops, which the per-expert loop multiplies. Same routing and products; each token's sum
        adds the same terms (plus exact zeros)."""
        if self._stacked is None or lora is not None:
            return self(x, lora, routing)
        gate_up, down = self._stacked
        num_experts, inter = gate_up.shape[0], down.shape[2]
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self._routed(flat, routing)
        dense = torch.zeros((flat.shape[0], num_experts), dtype=weights.dtype).scatter_(1, chosen, weights)
        both = F.linear(flat, gate_up.view(num_experts * 2 * inter, -1)).view(-1, num_experts, 2, inter)
        hidden = F.silu(both[:, :, 0]) * both[:, :, 1]  # [N, E, inter]
        y = torch.bmm(hidden.transpose(0, 1), down.transpose(1, 2))  # [E, N, d]
        out = (y * dense.t().unsqueeze(-1).to(y.dtype)).sum(dim=0)
        return out.reshape(x.shape)

    def route(self, x: torch.Tensor, given: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, d] → (weights [N, k] in x's dtype, expert ids [N, k]). `given` [N, k]: replay these
        experts (rows with a negative id route freely); their weights are this router's probabilities
        there, renormalized as usual, so the router keeps its gradient (`gyre.model.routing`)."""
        logits = F.linear(x, self.gate.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        if given is None:
            weights, experts = torch.topk(probs, self.top_k, dim=-1)
        else:
            experts = replayed_experts(probs, given, self.top_k)
            weights = probs.gather(-1, experts)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(logits.dtype), experts

    def _routed(self, flat: torch.Tensor, routing: ExpertRouting | None) -> tuple[torch.Tensor, torch.Tensor]:
        if routing is None:
            return self.route(flat)
        weights, experts = self.route(flat, routing.given(self.index, flat.shape[0], self.top_k))
        routing.chosen[self.index] = experts
        return weights, experts

    def forward(
        self, x: torch.Tensor, lora: LoraDelta | None = None, routing: ExpertRouting | None = None
    ) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, experts = self._routed(flat, routing)
        out = torch.zeros_like(flat)
        for e in experts.unique().tolist():  # ascending: the order transformers adds experts in
            token, slot = torch.where(experts == e)
            y = self.experts[e](flat[token]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out.reshape(x.shape)


@torch.no_grad()
def _fuse(layers: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Re-home the weights (and biases) of `layers` as row blocks of one tensor; returns it. Each
    parameter keeps its name and values and becomes a view, so in-place weight updates reach both."""
    weight = torch.cat([layer.weight.detach() for layer in layers])
    has_bias = layers[0].bias is not None
    bias = (
        torch.cat([layer.bias.detach() for layer in layers if layer.bias is not None]) if has_bias else None
    )
    row = 0
    for layer in layers:
        rows = layer.weight.shape[0]
        layer.weight.data = weight[row : row + rows]
        if bias is not None and layer.bias is not None:
            layer.bias.data = bias[row : row + rows]
        row += rows
    return weight, bias


class DecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, index: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.self_attn = Attention(arch, index)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.mlp: MLP | SparseMoeBlock = (
            SparseMoeBlock(arch, index)
            if arch.moe is not None and arch.moe.is_sparse(index)
            else MLP(arch.hidden_size, arch.intermediate_size, arch.mlp_bias, index)
        )


class DecoderModel(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(arch, i) for i in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)


class CausalLM(nn.Module):
    """A decoder of `arch` with HF parameter names. Build it empty (`CausalLM(arch)`), then load
    weights (`gyre.model.weights.load_model`) or `init_weights(seed)` for a random model."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.arch = arch
        self.model = DecoderModel(arch)
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(arch.rope, arch.head_dim)

    @property
    def max_positions(self) -> int:
        return self.arch.max_position_embeddings

    @torch.no_grad()
    def init_weights(self, seed: int, std: float = 0.02) -> CausalLM:
        """Deterministic random init as transformers does it: N(0, std) weights, zero biases, unit norms."""
        gen = torch.Generator().manual_seed(seed)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * std)
        return self

    def fuse_projections(self) -> CausalLM:
        """Serve with one matmul for q/k/v and one for gate/up per layer (fewer, larger matmuls: on
        CPU a small model's decode step is bound by per-op overhead). Parameters stay as they are by
        name and value; they become views of the fused tensors, so weight updates (in-place copies)
        keep working. For inference only: the trainer's flat buffers re-home parameters themselves."""
        for layer in self._layers():
            layer.self_attn.fuse()
            layer.mlp.fuse()
        return self

    def _check_positions(self, position_ids: torch.Tensor) -> None:
        if position_ids.numel() and int(position_ids.max()) >= self.max_positions:
            raise ValueError(
                f"position {int(position_ids.max())} is beyond max_position_embeddings={self.max_positions} "
                "of the model (config.json); shorten the sequence"
            )

    def _layers(self) -> list[DecoderLayer]:
        return [layer for layer in self.model.layers if isinstance(layer, DecoderLayer)]

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlens: torch.Tensor | list[int],
        tree: TreeLayout | None = None,
        lora: LoraDelta | None = None,
        logits_from: int = 0,
        routing: ExpertRouting | None = None,
    ) -> torch.Tensor:
        """Packed training forward: input_ids/position_ids [T], cu_seqlens [S+1] → logits [T, V];
        `tree` is the layout of tree-packed rows (None: every row is a path). Positions are taken as
        given (in a tree row a token's position is its depth along its own path). `lora` adds an
        adapter's deltas (`gyre.model.lora.LoraAdapter`). `logits_from` > 0: the logits of tokens
        `logits_from`.. only ([T - logits_from, V]; a scorer of a prompt's continuation needs no more).
        `routing` replays MoE experts per token and records the experts used (`gyre.model.routing`)."""
        if input_ids.dim() != 1 or position_ids.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and position_ids must both be 1-D [T]; got {tuple(input_ids.shape)} and "
                f"{tuple(position_ids.shape)}"
            )
        bounds = [
            int(c) for c in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)
        ]
        if not bounds or bounds[0] != 0 or bounds[-1] != input_ids.shape[0] or bounds != sorted(bounds):
            raise ValueError(
                f"cu_seqlens must be non-decreasing from 0 to T={input_ids.shape[0]}; got {bounds[:4]}..."
            )
        self._check_positions(position_ids)
        if not 0 <= logits_from <= input_ids.shape[0]:
            raise ValueError(f"logits_from must be in [0, T={input_ids.shape[0]}]; got {logits_from}")
        cos, sin = self.rotary.cos_sin(position_ids, self.lm_head.weight.dtype)
        h = self.model.embed_tokens(input_ids)
        for layer in self._layers():
            h = h + layer.self_attn(layer.input_layernorm(h), cos, sin, bounds, tree, lora)
            x, mlp = layer.post_attention_layernorm(h), layer.mlp
            h = h + (mlp(x, lora, routing) if isinstance(mlp, SparseMoeBlock) else mlp(x, lora))
        logits: torch.Tensor = self.lm_head(self.model.norm(h[logits_from:]))
        return logits

    def forward_paged(
        self,
        input_ids: torch.Tensor,
        cache: PagedKVCache,
        batch: PagedBatch,
        last_index: torch.Tensor | None = None,
        lora: LoraDelta | None = None,
        routing: ExpertRouting | None = None,
    ) -> torch.Tensor:
        """Serving forward: input_ids [B, Lq] at `batch.positions` → logits [B, Lq, V], or [B, V] at
        the query index `last_index[b]` of each row when given (the only position a step samples).
        `lora` gives each row its adapter (`gyre.model.lora.LoraRows`); `routing` records each MoE
        layer's experts for the B·Lq tokens, row-major."""
        self._check_positions(batch.positions)
        cos, sin = self.rotary.cached_cos_sin(batch.positions, self.lm_head.weight.dtype)
        h = F.embedding(input_ids, self.model.embed_tokens.weight)
        for i, layer in enumerate(self._layers()):
            h = h + layer.self_attn.forward_paged(
                layer.input_layernorm.fused(h), cos, sin, cache, i, batch, lora
            )
            x, mlp = layer.post_attention_layernorm.fused(h), layer.mlp
            h = h + (mlp.serve(x, lora, routing) if isinstance(mlp, SparseMoeBlock) else mlp.serve(x, lora))
        if last_index is not None:
            h = h[:, 0] if h.shape[1] == 1 else h[torch.arange(h.shape[0]), last_index]
        logits: torch.Tensor = self.lm_head(self.model.norm.fused(h))
        return logits
