"""The model output source's KV memory: the paged pool, block ownership per request, the prefix cache and pins.

    store.admit(state, version)      prefix-cache lookup + blocks for all of the request's tokens
    store.reserve(state, n)          grow the request's blocks to hold n positions (decode)
    store.register(state)            index its newly full blocks in the prefix cache
    store.release(state)             index what is reusable, drop its references
    store.pin(state) / unpin(h)      hold a request's computed KV for migration
    store.export(h) / import_(blob)  the migration payload (see kv_transfer)
    store.record_routing(slots, r)   an MoE step's experts per slot; store.routing_of(state) reads them

Versions: the source passes a *cache version* that changes on every weight update (the weight
version plus an update counter, so even an update that keeps the version string invalidates). The
root of every cache key carries it, so nothing computed under old weights is ever matched after an
update; and a request whose KV was started under an older cache version (so it mixes weights) puts
nothing in the cache and pins nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import torch

from gyre.model.arch import ModelArch
from gyre.model.paged import PagedKVCache
from services.cell_agent.engine.blocks import BlockManager, version_root
from services.cell_agent.engine.kv_transfer import KVPayload, decode_kv, encode_kv
from services.cell_agent.engine.request import RequestState
from services.cell_agent.engine.sources.base import KVPin, OutputSourceError


@dataclass(slots=True)
class RequestKV:
    """The blocks a request holds (position p lives in `blocks[p // block_size]`)."""

    blocks: list[int] = field(default_factory=list)
    parent: Hashable = None
    num_registered: int = 0


@dataclass(slots=True)
class _Pin:
    rid: str
    blocks: list[int]
    token_ids: tuple[int, ...]
    weight_version: str
    adapter: str = ""


class KVStore:
    def __init__(
        self,
        arch: ModelArch,
        *,
        num_tokens: int,
        block_size: int,
        enable_prefix_cache: bool,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.arch = arch
        self.dtype = dtype
        self.block_size = block_size
        self.num_blocks = 1 + -(-num_tokens // block_size)
        self.enable_prefix_cache = enable_prefix_cache
        self.cache: PagedKVCache | None = None
        self.routing: torch.Tensor | None = None
        """MoE models: [slots, L, k] int32, the experts each layer chose for the token at a slot (what
        SGLang keeps for `return_routed_experts`), so a prefix-cache hit answers its routing too."""
        self.blocks = BlockManager(self.num_blocks, block_size)
        self._pins: dict[str, _Pin] = {}
        self._handles = itertools.count(1)
        self.allocate()

    # ---- memory ------------------------------------------------------------------------------

    @property
    def resident(self) -> bool:
        return self.cache is not None

    def allocate(self) -> None:
        if self.cache is None:
            self.cache = PagedKVCache.allocate(
                self.arch, self.num_blocks * self.block_size, self.block_size, self.dtype
            )
        moe = self.arch.moe
        if moe is not None and self.routing is None:
            shape = (self.num_blocks * self.block_size, self.arch.num_layers, moe.num_experts_per_tok)
            self.routing = torch.full(shape, -1, dtype=torch.int32)

    def drop(self) -> None:
        """Free the pool and forget every cached block and pin (no request may hold blocks)."""
        assert self.blocks.num_in_use == len({b for p in self._pins.values() for b in p.blocks}), (
            "release_memory with requests holding KV"
        )
        self._pins.clear()
        self.blocks = BlockManager(self.num_blocks, self.block_size)
        self.cache = None
        self.routing = None

    def _pool(self) -> PagedKVCache:
        if self.cache is None:
            raise OutputSourceError("KV cache memory is released; call /resume_memory_occupation first", 503)
        return self.cache

    def _fresh(self, n: int) -> list[int] | None:
        blocks = self.blocks.allocate_many(n)
        if blocks is not None:
            pool = self._pool()
            for block in blocks:
                pool.zero_block(block, self.block_size)
        return blocks

    # ---- requests ----------------------------------------------------------------------------

    def _cacheable(self, state: RequestState, current_version: str) -> bool:
        return self.enable_prefix_cache and state.kv_version == current_version

    def admit(self, state: RequestState, current_version: str, headroom_blocks: int = 1) -> bool:
        """Give `state` blocks for all its tokens, reusing the longest cached prefix (at most all but
        the last token, which must be computed to sample from). False = not enough free blocks."""
        bs = self.block_size
        tokens = state.tokens
        root = version_root(current_version)
        match = self.blocks.match(root, tokens, len(tokens) - 1) if self.enable_prefix_cache else None
        shared = match.blocks if match is not None else []
        partial = match.partial if match is not None else None
        # Hold the matched blocks first, so allocating fresh ones cannot evict them.
        held = shared + ([partial.block] if partial is not None else [])
        for block in held:
            self.blocks.incref(block)
        covered = len(shared) * bs
        needed = -(-len(tokens) // bs) - len(shared)
        if -(-len(tokens) // bs) > self.num_blocks - 1:
            self.blocks.release(held)
            raise OutputSourceError(
                f"request needs {-(-len(tokens) // bs)} KV blocks, the pool has {self.num_blocks - 1}; "
                "raise cell_agent.engine.kv_cache_tokens",
                507,
            )
        if needed + headroom_blocks > self.blocks.num_free:
            self.blocks.release(held)
            return False
        own = self._fresh(needed)
        assert own is not None and needed >= 1
        if match is not None and partial is not None:
            # Copy-on-write: the partial entry's first k slots into this request's own block.
            k = match.partial_tokens
            src, dst = partial.block * bs, own[0] * bs
            pool = self._pool()
            pool.copy_slots(dst, src, k)
            if self.routing is not None:
                self.routing[dst : dst + k] = self.routing[src : src + k]
            covered += k
            self.blocks.decref(partial.block)
        state.backend_state = RequestKV(
            blocks=shared + own,
            parent=match.parent if match is not None else root,
            num_registered=len(shared),
        )
        state.num_computed = covered
        state.kv_version = current_version
        if state.num_cached < 0:
            state.num_cached = covered
        return True

    def reserve(self, state: RequestState, num_positions: int) -> bool:
        kv = _kv(state)
        missing = -(-num_positions // self.block_size) - len(kv.blocks)
        if missing <= 0:
            return True
        fresh = self._fresh(missing)
        if fresh is None:
            return False
        kv.blocks.extend(fresh)
        return True

    def register(self, state: RequestState, current_version: str) -> None:
        """Index the request's full computed blocks not indexed yet."""
        if not self._cacheable(state, current_version):
            return
        kv = _kv(state)
        bs = self.block_size
        while (kv.num_registered + 1) * bs <= state.num_computed:
            i = kv.num_registered
            kv.parent = self.blocks.insert(kv.parent, state.tokens[i * bs : (i + 1) * bs], kv.blocks[i])
            kv.num_registered += 1

    def release(self, state: RequestState, current_version: str) -> None:
        kv = state.backend_state
        if not isinstance(kv, RequestKV):
            return
        self.register(state, current_version)
        tail = state.num_computed - kv.num_registered * self.block_size
        if self._cacheable(state, current_version) and 0 < tail < self.block_size:
            start = kv.num_registered * self.block_size
            self.blocks.insert(kv.parent, state.tokens[start : start + tail], kv.blocks[kv.num_registered])
        self.blocks.release(kv.blocks)
        state.backend_state = None
        state.num_computed = 0

    def block_table(self, state: RequestState) -> list[int]:
        return _kv(state).blocks

    # ---- migration ---------------------------------------------------------------------------

    def pin(self, state: RequestState, current_version: str, weight_version: str, adapter: str = "") -> KVPin:
        """Hold the blocks of `state`'s computed tokens. KV started under an older cache version (it
        mixes weights) or not computed yet pins nothing: the destination recomputes. `adapter` names the
        LoRA adapter the KV was computed under ("" = none); an import needs the same one."""
        handle = f"kv-{next(self._handles)}"
        kv = state.backend_state
        if isinstance(kv, RequestKV) and state.kv_version == current_version:
            n = state.num_computed
            blocks = kv.blocks[: -(-n // self.block_size)]
        else:
            n, blocks = 0, []
        for block in blocks:
            self.blocks.incref(block)
        self._pins[handle] = _Pin(
            rid=state.rid,
            blocks=blocks,
            token_ids=tuple(state.tokens[:n]),
            weight_version=weight_version,
            adapter=adapter,
        )
        return KVPin(handle=handle, rid=state.rid, num_tokens=n, weight_version=weight_version)

    def unpin(self, handle: str) -> None:
        pin = self._pins.pop(handle, None)
        if pin is None:
            raise OutputSourceError(f"no KV pin {handle!r} (already released?)", 404)
        self.blocks.release(pin.blocks)

    def export(self, handle: str) -> bytes:
        pin = self._pins.get(handle)
        if pin is None:
            raise OutputSourceError(f"no KV pin {handle!r} (already released?)", 404)
        pool = self._pool()
        n = len(pin.token_ids)
        slots = torch.tensor(
            [pin.blocks[p // self.block_size] * self.block_size + p % self.block_size for p in range(n)],
            dtype=torch.long,
        )
        payload = KVPayload(
            token_ids=pin.token_ids,
            weight_version=pin.weight_version,
            fingerprint=self.arch.fingerprint(),
            k=pool.k.index_select(1, slots),
            v=pool.v.index_select(1, slots),
            adapter=pin.adapter,
        )
        return encode_kv(payload)

    def import_(self, blob: bytes, root_of: Callable[[str], str | None], weight_version: str) -> int:
        """Write exported KV into fresh blocks and index them in the prefix cache (evictable, most
        recently used) under `root_of(adapter name)`, the cache root of the adapter it was computed
        under (None: this engine does not serve it). Returns the number of tokens now reusable."""
        payload = decode_kv(blob)
        current_version = root_of(payload.adapter)
        if current_version is None:
            raise OutputSourceError(
                f"KV payload was computed under LoRA adapter {payload.adapter!r}, which this engine does not serve",
                409,
            )
        if payload.fingerprint != self.arch.fingerprint():
            raise OutputSourceError("KV payload comes from a different model architecture", 409)
        if payload.weight_version != weight_version:
            raise OutputSourceError(
                f"KV payload was computed under weight version {payload.weight_version!r}, this engine "
                f"serves {weight_version!r}",
                409,
            )
        if not self.enable_prefix_cache:
            raise OutputSourceError(
                "the prefix cache is disabled on this engine; imported KV could not be reused", 409
            )
        n = payload.num_tokens
        if n == 0:
            return 0
        expected = (self.arch.num_layers, n, self.arch.num_kv_heads, self.arch.head_dim)
        if tuple(payload.k.shape) != expected:
            raise OutputSourceError(f"KV payload shape {tuple(payload.k.shape)} does not match {expected}")
        bs = self.block_size
        blocks = self._fresh(-(-n // bs))
        if blocks is None:
            raise OutputSourceError("not enough free KV blocks to import; retry later", 503)
        pool = self._pool()
        slots = torch.tensor([blocks[p // bs] * bs + p % bs for p in range(n)], dtype=torch.long)
        pool.put_slots(slots, payload.k, payload.v)
        if self.routing is not None:
            self.routing[slots] = -1  # the payload carries no routing
        parent: Hashable = version_root(current_version)
        for i, block in enumerate(blocks):
            parent = self.blocks.insert(parent, payload.token_ids[i * bs : (i + 1) * bs], block)
        self.blocks.release(blocks)
        return n

    def flush(self) -> int:
        return self.blocks.flush()

    # ---- MoE routing -------------------------------------------------------------------------

    def record_routing(self, slots: torch.Tensor, chosen: dict[int, torch.Tensor]) -> None:
        """Compute thread: the experts `chosen` ({layer: [N, k]}) of the N tokens written at `slots`."""
        if self.routing is None or not chosen:
            return
        flat = slots.reshape(-1)
        for layer, experts in chosen.items():
            self.routing[flat, layer] = experts.to(torch.int32)

    def routing_of(self, state: RequestState) -> torch.Tensor | None:
        """[len(tokens) - 1, L, k]: the experts of each of `state`'s tokens computed so far (the last
        token is never forwarded), -1 beyond them."""
        if self.routing is None:
            return None
        n = max(len(state.tokens) - 1, 0)
        out = torch.full((n, *self.routing.shape[1:]), -1, dtype=torch.int32)
        kv = state.backend_state
        if isinstance(kv, RequestKV):
            bs = self.block_size
            m = min(state.num_computed, n)
            positions = torch.arange(m)
            blocks = torch.tensor(kv.blocks[: -(-m // bs)], dtype=torch.long)
            out[:m] = self.routing[blocks[positions // bs] * bs + positions % bs]
        return out

    def stats(self) -> dict[str, int]:
        return {
            "kv_blocks_total": self.num_blocks - 1,
            "kv_block_size": self.block_size,
            "kv_blocks_in_use": self.blocks.num_in_use,
            "kv_blocks_cached": self.blocks.num_cached,
            "kv_blocks_evictable": self.blocks.num_evictable,
            "kv_blocks_free": self.blocks.num_free,
            "kv_pins": len(self._pins),
            "kv_resident": int(self.resident),
        }


def _kv(state: RequestState) -> RequestKV:
    kv = state.backend_state
    assert isinstance(kv, RequestKV), f"{state.rid} holds no KV"
    return kv
