"""Prefix caching for the paged KV cache: chained block hashes and an LRU of idle cached blocks.

A full block of `block_size` tokens is named by a hash chained over every full block before it:
``h_i = H(h_{i-1}, tokens of block i)``. Two prompts get the same ``h_i`` only when their first
``(i + 1) * block_size`` tokens agree, so the K/V held by the block named ``h_i`` (which depend on
every earlier token through attention) can be shared by both. Partial blocks are never named.

`PrefixCache` remembers which physical block holds each hash. A cached block whose reference count
drops to zero stays cached but *idle*: it is reusable by the next prompt with that prefix until the
allocator runs out of never-used blocks and evicts idle blocks, least recently released first.
This module keeps only the bookkeeping; `reference.paging.BlockManager` owns the reference counts.
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence


def chain_hash(parent: int | None, token_ids: Sequence[int]) -> int:
    """128-bit BLAKE2b hash of (parent block's hash, this block's token ids) as a Python int.

    A cryptographic hash makes an accidental collision (two different prefixes sharing a name,
    hence wrong K/V) negligible, which Python's built-in `hash` would not.
    """
    digest = hashlib.blake2b(digest_size=16)
    digest.update(b"root" if parent is None else parent.to_bytes(16, "little"))
    digest.update(array("q", token_ids).tobytes())
    return int.from_bytes(digest.digest(), "little")


def full_block_hashes(token_ids: Sequence[int], block_size: int, parent: int | None = None) -> list[int]:
    """Chained hashes of every full block of `token_ids` (a trailing partial block gets none)."""
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = chain_hash(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes


class PrefixCache:
    """Which physical block holds each chained hash, and which cached blocks are idle (refcount 0).

    Every hash maps to at most one block and every block holds at most one hash. Idle blocks are
    kept oldest-release first so `evict_oldest` implements LRU eviction.
    """

    def __init__(self) -> None:
        self._block_of: dict[int, int] = {}
        self._hash_of: dict[int, int] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()

    def lookup(self, block_hash: int) -> int | None:
        """The block id holding `block_hash`, or None."""
        return self._block_of.get(block_hash)

    def register(self, block_hash: int, block_id: int) -> bool:
        """Name `block_id` by `block_hash` unless another block already holds that hash.

        Returns True when `block_id` became the cached copy of that prefix.
        """
        if block_hash in self._block_of or block_id in self._hash_of:
            return False
        self._block_of[block_hash] = block_id
        self._hash_of[block_id] = block_hash
        return True

    def unregister(self, block_id: int) -> None:
        """`block_id` (referenced, not idle) is about to be overwritten: forget the prefix it named."""
        del self._block_of[self._hash_of.pop(block_id)]

    def is_cached(self, block_id: int) -> bool:
        """Whether `block_id` holds a registered hash (live or idle)."""
        return block_id in self._hash_of

    def is_idle(self, block_id: int) -> bool:
        return block_id in self._idle

    @property
    def num_idle(self) -> int:
        """Cached blocks no sequence references: reusable by a prefix hit, or evictable."""
        return len(self._idle)

    def idle_blocks(self) -> list[int]:
        """Idle block ids, the next to be evicted first."""
        return list(self._idle)

    def park(self, block_id: int) -> None:
        """A cached block's last reference went away: keep it, as the most recently released."""
        self._idle[block_id] = None

    def unpark(self, block_id: int) -> None:
        """An idle block was hit by a new prompt: it is referenced again, not evictable."""
        del self._idle[block_id]

    def evict_oldest(self) -> int:
        """Forget the least recently released idle block and return its id (now a plain free block)."""
        block_id, _ = self._idle.popitem(last=False)
        del self._block_of[self._hash_of.pop(block_id)]
        return block_id
