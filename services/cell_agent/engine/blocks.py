"""KV block accounting: reference counts, a free list, and the prefix cache over token blocks.

A block is `block_size` consecutive token slots. Its reference count says how many owners hold it (a
running request, a KV pin). A block may also be *cached*: indexed under the key

    (parent, tokens)        parent = the cache entry of the previous block, or the root of a weight version

so a later request whose token prefix walks the same chain reuses it. The root is `("v", version)`:
an entry computed under older weights is unreachable after an update, and never served again (a
flush also drops it). Full blocks (`len(tokens) == block_size`) are shared read-only; a partial
entry (the tail of a finished request, or of an imported KV range) is reused by *copying* its first
k matching slots into a fresh block, so a cached block is never written again.

A cached block whose reference count falls to zero is *evictable*: it keeps its content, sits in an
LRU, and is reclaimed only when the free list is empty. Evicting an entry evicts its evictable
descendants too (they became unreachable). Block 0 is the scratch slot's block, never handed out.

Pure Python, no torch: the model source moves the tensors, this module only decides.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from itertools import count


def version_root(weight_version: str) -> tuple[str, str]:
    """The parent key of the first block of every prefix computed under `weight_version`."""
    return ("v", weight_version)


@dataclass(slots=True, eq=False)
class CacheEntry:
    serial: int
    block: int
    parent: Hashable
    tokens: tuple[int, ...]


@dataclass(slots=True)
class PrefixMatch:
    """Full cached blocks to share, plus an optional partial entry to copy `partial_tokens` from."""

    blocks: list[int] = field(default_factory=list)
    parent: Hashable = None
    partial: CacheEntry | None = None
    partial_tokens: int = 0

    def num_tokens(self, block_size: int) -> int:
        return len(self.blocks) * block_size + self.partial_tokens


class BlockManager:
    """Owns block ids 1..num_blocks-1: who holds them and which are cached."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"need at least 2 blocks (block 0 is scratch); got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref = [0] * num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))
        self._serials = count(1)
        self._entry_of_block: dict[int, CacheEntry] = {}
        self._children: dict[Hashable, dict[tuple[int, ...], CacheEntry]] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()

    # ---- accounting -------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks an allocation can get right now (free + evictable cached)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_in_use(self) -> int:
        """Blocks held by at least one owner."""
        return self.num_blocks - 1 - len(self._free) - len(self._evictable)

    @property
    def num_cached(self) -> int:
        return len(self._entry_of_block)

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def allocate(self) -> int | None:
        """A fresh block with reference count 1, evicting the least recently used cached block if
        the free list is empty; None when every block is held."""
        if not self._free and self._evictable:
            victim = next(iter(self._evictable))
            self._evict(self._entry_of_block[victim])
        if not self._free:
            return None
        block = self._free.popleft()
        assert self._ref[block] == 0
        self._ref[block] = 1
        return block

    def allocate_many(self, n: int) -> list[int] | None:
        """n blocks or none (all-or-nothing)."""
        if n > self.num_free:
            return None
        blocks = [self.allocate() for _ in range(n)]
        assert all(b is not None for b in blocks)
        return [b for b in blocks if b is not None]

    def incref(self, block: int) -> None:
        assert 0 < block < self.num_blocks
        if self._ref[block] == 0:
            assert block in self._entry_of_block, f"block {block} is neither held nor cached"
            del self._evictable[block]
        self._ref[block] += 1

    def decref(self, block: int) -> None:
        assert self._ref[block] > 0, f"block {block} released more often than held"
        self._ref[block] -= 1
        if self._ref[block] == 0:
            if block in self._entry_of_block:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def release(self, blocks: Sequence[int]) -> None:
        for block in blocks:
            self.decref(block)

    # ---- prefix cache -----------------------------------------------------------------------

    def match(self, root: Hashable, tokens: Sequence[int], max_tokens: int) -> PrefixMatch:
        """The longest cached prefix of `tokens[:max_tokens]` under `root`. Does not take references
        (call `incref` on the blocks you keep); touches matched entries in the LRU."""
        bs = self.block_size
        result = PrefixMatch(parent=root)
        parent: Hashable = root
        pos = 0
        while pos + bs <= max_tokens:
            entry = self._children.get(parent, {}).get(tuple(tokens[pos : pos + bs]))
            if entry is None:
                break
            result.blocks.append(entry.block)
            parent = entry.serial
            pos += bs
        result.parent = parent
        rest = tokens[pos:max_tokens]
        if rest:
            best, best_len = None, 0
            for entry in self._children.get(parent, {}).values():
                n = _common_prefix(entry.tokens, rest)
                if n > best_len:
                    best, best_len = entry, n
            result.partial, result.partial_tokens = best, best_len
        for block in reversed(result.blocks):
            self._touch(block)
        if result.partial is not None:
            self._touch(result.partial.block)
        return result

    def insert(self, parent: Hashable, tokens: Sequence[int], block: int) -> int:
        """Index `block` (held by the caller) as holding `tokens` after `parent`. Returns the serial
        to use as the next block's parent; if an equal entry exists, the block stays uncached and the
        existing entry's serial is returned."""
        key = tuple(tokens)
        assert 0 < len(key) <= self.block_size
        assert self._ref[block] > 0, "only a held block can be inserted"
        siblings = self._children.setdefault(parent, {})
        existing = siblings.get(key)
        if existing is not None:
            return existing.serial
        if block in self._entry_of_block:
            # Already indexed elsewhere (e.g. an imported block re-offered): keep the first index.
            return self._entry_of_block[block].serial
        entry = CacheEntry(serial=next(self._serials), block=block, parent=parent, tokens=key)
        siblings[key] = entry
        self._entry_of_block[block] = entry
        return entry.serial

    def flush(self) -> int:
        """Drop every cache entry; evictable blocks return to the free list, held blocks stay held
        (they are freed by their owners). Returns the number of entries dropped."""
        entries = list(self._entry_of_block.values())
        for entry in entries:
            self._uncache(entry)
        return len(entries)

    def _touch(self, block: int) -> None:
        if block in self._evictable:
            self._evictable.move_to_end(block)

    def _uncache(self, entry: CacheEntry) -> None:
        siblings = self._children.get(entry.parent)
        if siblings is not None and siblings.get(entry.tokens) is entry:
            del siblings[entry.tokens]
            if not siblings:
                del self._children[entry.parent]
        del self._entry_of_block[entry.block]
        if self._ref[entry.block] == 0:
            del self._evictable[entry.block]
            self._free.append(entry.block)

    def _evict(self, entry: CacheEntry) -> None:
        """Uncache `entry` and, recursively, its descendants (unreachable once it is gone)."""
        stack = [entry]
        while stack:
            current = stack.pop()
            stack.extend(self._children.get(current.serial, {}).values())
            if current.block in self._entry_of_block:
                self._uncache(current)

    def check_invariants(self) -> None:
        """Every block is exactly one of: scratch, free, evictable (cached, unheld), held."""
        free = set(self._free)
        assert len(free) == len(self._free), "duplicate block in the free list"
        for block in range(1, self.num_blocks):
            held = self._ref[block] > 0
            states = [block in free, block in self._evictable, held]
            assert sum(states) == 1, f"block {block}: free={states[0]} evictable={states[1]} held={held}"
            if block in self._evictable:
                assert block in self._entry_of_block


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
