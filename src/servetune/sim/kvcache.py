"""Paged KV pool with block-hash prefix caching and LRU eviction (vLLM v1's block pool).

Only counts and hashes are kept, never block ids: what the scheduler needs is how many
blocks are free and which full blocks hold reusable content.

- A full block's hash names its content. As in vLLM's hash chain, a block's hash depends on
  every token before it, so prompts share hashes only over a shared prefix: block i of a
  request in prefix group g is ``(g, i)`` while the block lies wholly inside the group's
  shared prefix, else private to the request.
- ``refs``: cached blocks in use, with their reference counts (a prefix hit adds one).
- ``lru``: free blocks that still hold cached content, oldest first; allocation evicts from
  the front (vLLM's free-block queue; freed blocks are appended tail-block first, so a
  request's last blocks are evicted before its first).
- ``free_plain``: free blocks with no content. Allocation takes these before evicting, an
  approximation of vLLM's single queue in which never-used blocks sit at the front.

Invariant: free_plain + len(lru) + len(refs) + blocks held privately by running requests
equals ``total``. vLLM v1 reserves one "null" block, so ``total`` is the planner's
kv_blocks - 1 (vllm/v1/core/block_pool.py).
"""

from __future__ import annotations

from collections import OrderedDict

# Block hashes are ints: shared-prefix blocks (group + 1) << 32 | i, private blocks
# -((request + 1) << 32 | i). Distinct for < 2^32 blocks per request.
_SHIFT = 32


def shared_hash(group: int, i: int) -> int:
    return ((group + 1) << _SHIFT) | i


def private_hash(request: int, i: int) -> int:
    return -(((request + 1) << _SHIFT) | i)


class PagedKV:
    """Counts of free, cached and referenced blocks (see module docstring)."""

    __slots__ = ("total", "free_plain", "lru", "refs", "caching", "evictions")

    def __init__(self, total_blocks: int, prefix_caching: bool) -> None:
        self.total = total_blocks
        self.free_plain = total_blocks
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.refs: dict[int, int] = {}
        self.caching = prefix_caching
        self.evictions = 0

    @property
    def available(self) -> int:
        """Blocks an allocation can take now (plain free + evictable cached)."""
        return self.free_plain + len(self.lru)

    def take(self, n: int) -> None:
        """Allocate n blocks: plain ones first, then evict the least recently freed."""
        plain = min(n, self.free_plain)
        self.free_plain -= plain
        lru = self.lru
        for _ in range(n - plain):
            lru.popitem(last=False)
        self.evictions += n - plain

    def hit(self, h: int) -> bool:
        """Take a reference on cached block `h` if present (a prefix-cache hit)."""
        refs = self.refs
        c = refs.get(h)
        if c is not None:
            refs[h] = c + 1
            return True
        if h in self.lru:
            del self.lru[h]
            refs[h] = 1
            return True
        return False

    def contains(self, h: int) -> bool:
        return h in self.refs or h in self.lru

    def register(self, h: int) -> bool:
        """A private block just became full with content `h`: cache it (the block moves from
        the request's private count to `refs`). False when that content is already cached
        (another request computed it concurrently): the block stays a private duplicate."""
        if not self.caching or h in self.refs or h in self.lru:
            return False
        self.refs[h] = 1
        return True

    def release(self, hashes: list[int], private: int, cache: list[int]) -> None:
        """Free a request's blocks: its referenced cached blocks (`hashes`), `private` blocks
        without a registered hash, of which those named in `cache` (full blocks whose
        content is new to the cache) are kept as cached-free; the rest become plain."""
        refs, lru = self.refs, self.lru
        kept = 0
        if self.caching:
            for h in reversed(cache):  # tail first: evicted before the prefix
                if h not in refs and h not in lru:
                    lru[h] = None
                    kept += 1
        self.free_plain += private - kept
        for h in reversed(hashes):
            c = refs[h] - 1
            if c:
                refs[h] = c
            else:
                del refs[h]
                lru[h] = None
