"""Paged KV-cache block accounting with a prefix cache (vLLM's block manager, by counts).

The pool tracks how many fixed-size blocks are free, referenced by running sequences, or cached:
a full prompt block is registered under its chained hash (see :mod:`.hashing`) once computed, and
stays reusable after its sequences finish until the space is needed (LRU eviction), so a later
request with the same prefix skips that part of its prefill. Block contents are never modelled,
only their number, which is all that timing and capacity depend on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from gigacluster.inference.errors import EngineStateError


class BlockPool:
    """Counts of KV blocks: free, privately held, shared by hash (ref-counted), cached-evictable."""

    def __init__(self, total_blocks: int) -> None:
        if total_blocks < 1:
            raise EngineStateError(f"block pool needs at least one block, got {total_blocks}")
        self.total_blocks = total_blocks
        self._free = total_blocks  # empty blocks
        self._ref: dict[int, int] = {}  # hash -> sequences referencing it
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced, LRU first
        self.hit_tokens = 0
        self.lookup_tokens = 0

    @property
    def available(self) -> int:
        """Blocks a new allocation may take (empty plus evictable cached ones)."""
        return self._free + len(self._evictable)

    @property
    def used(self) -> int:
        """Blocks held by running sequences."""
        return self.total_blocks - self.available

    @property
    def cached(self) -> int:
        """Blocks holding a reusable prefix (referenced or not)."""
        return len(self._ref) + len(self._evictable)

    def match(self, hashes: Sequence[int], max_blocks: int) -> int:
        """Number of leading ``hashes`` (at most ``max_blocks``) present in the cache; no side effect."""
        n = 0
        ref, ev = self._ref, self._evictable
        for h in hashes[:max_blocks]:
            if h in ref or h in ev:
                n += 1
            else:
                break
        return n

    def acquire(self, hashes: Sequence[int], n_private: int) -> bool:
        """Reference cached ``hashes`` and allocate ``n_private`` empty blocks, or do nothing and
        return False when the blocks are not available."""
        ev = self._evictable
        revived = sum(1 for h in hashes if h in ev)
        # Revived blocks leave the evictable set, so they cannot also serve the private allocation.
        if n_private > self.available - revived:
            return False
        ref = self._ref
        for h in hashes:
            if h in ev:
                del ev[h]
                ref[h] = 1
            else:
                ref[h] += 1
        self._take(n_private)
        return True

    def allocate(self, n: int) -> bool:
        """Allocate ``n`` private blocks (decode growth); False when not available."""
        if n > self.available:
            return False
        self._take(n)
        return True

    def _take(self, n: int) -> None:
        from_free = min(n, self._free)
        self._free -= from_free
        for _ in range(n - from_free):
            self._evictable.popitem(last=False)  # evict the least recently used cached block

    def register(self, hashes: Sequence[int]) -> int:
        """Turn privately held, just-computed blocks into cached ones under ``hashes``.

        Returns how many of them were duplicates of a block already cached (the private copy is
        freed and the sequence references the cached one instead).
        """
        dup = 0
        ref, ev = self._ref, self._evictable
        for h in hashes:
            if h in ref:
                ref[h] += 1
                dup += 1
            elif h in ev:
                del ev[h]
                ref[h] = 1
                dup += 1
            else:
                ref[h] = 1
        self._free += dup
        return dup

    def release(self, hashes: Sequence[int], n_private: int) -> None:
        """A sequence gives back its shared references and private blocks."""
        ref, ev = self._ref, self._evictable
        for h in hashes:
            c = ref[h] - 1
            if c:
                ref[h] = c
            else:
                del ref[h]
                ev[h] = None  # most recently used end
        self._free += n_private
