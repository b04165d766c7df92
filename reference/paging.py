"""Paged KV-cache bookkeeping: fixed-size blocks, block tables, reference counts, copy-on-write.

The K/V pool is cut into `num_blocks` physical blocks of `block_size` token slots each. Every
sequence owns a block table (logical block i -> physical block id), so token position p of a
sequence lives in slot ``block_table[p // block_size] * block_size + p % block_size`` of a pool
shaped ``[num_blocks * block_size, ...]`` (or ``[num_blocks, block_size, ...]``).

Blocks are shared by reference counting: `fork` lets a child sequence point at all of its parent's
blocks (parallel sampling, beam search), and with prefix caching a new prompt points at the blocks
that already hold its longest cached run of full blocks (see `reference.prefix_cache`). Full blocks
are never written again, so sharing them is free; a shared *partial* tail is copied the first time
one of its holders appends (copy-on-write), and `append_token` returns that copy for the runner to
perform on the K/V tensors. This module moves no tensors itself.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence

from reference.prefix_cache import PrefixCache, chain_hash, full_block_hashes


class OutOfBlocks(RuntimeError):
    """The pool has too few free blocks for the request; no state was changed."""


def _as_token_ids(token_ids) -> list[int]:
    """A fresh list of non-negative int token ids (accepts lists, tuples, 1-D tensors)."""
    if hasattr(token_ids, "tolist"):
        token_ids = token_ids.tolist()
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence):
        raise TypeError(f"token_ids must be a sequence of ints, got {type(token_ids).__name__}")
    for t in token_ids:
        _check_token_id(t)
    return list(token_ids)


def _check_token_id(token_id) -> None:
    if isinstance(token_id, bool) or not isinstance(token_id, int):
        raise TypeError(f"token ids must be ints, got {type(token_id).__name__}: {token_id!r}")
    if not 0 <= token_id < 2 ** 63:
        raise ValueError(f"token ids must lie in [0, 2**63), got {token_id}")


class BlockManager:
    """Block tables, a free list and reference counts over a pool of `num_blocks` blocks.

    num_blocks: physical blocks in the pool; block_size: token slots per block (vLLM's default 16).
    enable_prefix_caching: reuse full prompt blocks whose chained hash is cached, and keep freed
    full blocks cached (idle) until the pool needs them back (LRU eviction).
    """

    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.cache = PrefixCache()
        self._free: deque[int] = deque(range(num_blocks))   # never used, or released uncached
        self._refs = [0] * num_blocks
        self._tables: dict[Hashable, list[int]] = {}
        self._tokens: dict[Hashable, list[int]] = {}
        self._hashes: dict[Hashable, list[int]] = {}        # chained hash of each full block
        self.prefix_hits = 0      # full prompt blocks found in the prefix cache
        self.prefix_misses = 0    # full prompt blocks that had to be computed
        self.evictions = 0        # idle cached blocks taken back for new data

    # ----- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks available to new data: the free list plus idle (evictable) cached blocks."""
        return len(self._free) + self.cache.num_idle

    @property
    def free_block_ids(self) -> list[int]:
        """The free list, next block handed out first (idle cached blocks are not in it)."""
        return list(self._free)

    @property
    def hit_rate(self) -> float:
        """prefix_hits / (prefix_hits + prefix_misses), over full prompt blocks; 0.0 before any."""
        looked_up = self.prefix_hits + self.prefix_misses
        return self.prefix_hits / looked_up if looked_up else 0.0

    def blocks_needed(self, n_tokens: int) -> int:
        """Blocks that hold `n_tokens` tokens: ceil(n_tokens / block_size)."""
        return -(-n_tokens // self.block_size)

    def can_allocate(self, n_tokens: int) -> bool:
        """Whether a prompt of `n_tokens` fits even without any prefix-cache hit."""
        return self.blocks_needed(n_tokens) <= self.num_free_blocks

    def cached_prefix_tokens(self, token_ids: Sequence[int]) -> int:
        """How many leading tokens `allocate(seq_id, token_ids)` would find cached (changes nothing).

        A multiple of block_size, always < len(token_ids); 0 without prefix caching.
        """
        if not self.enable_prefix_caching:
            return 0
        tokens = _as_token_ids(token_ids)
        hashes = full_block_hashes(tokens, self.block_size)[:(len(tokens) - 1) // self.block_size]
        return len(self._cached_prefix(hashes)) * self.block_size

    def can_append(self, seq_id: Hashable) -> bool:
        """Whether `append_token(seq_id, ...)` would succeed now."""
        return self._blocks_for_append(seq_id) <= self.num_free_blocks

    def block_table(self, seq_id: Hashable) -> list[int]:
        """A copy of the sequence's block table: logical block i -> physical block id."""
        return list(self._table(seq_id))

    def num_tokens(self, seq_id: Hashable) -> int:
        """Tokens the sequence holds (prompt plus appended)."""
        self._table(seq_id)
        return len(self._tokens[seq_id])

    def ref_count(self, block_id: int) -> int:
        """How many block tables hold `block_id`."""
        return self._refs[block_id]

    def slot(self, seq_id: Hashable, position: int) -> int:
        """Physical slot of token `position` (0-based) of the sequence: block_id * block_size + offset."""
        table, n = self._table(seq_id), len(self._tokens[seq_id])
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < n:
            raise ValueError(f"position must be an int in [0, {n}) for sequence {seq_id!r}, got {position!r}")
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def slot_mapping(self, seq_id: Hashable, start: int = 0, end: int | None = None) -> list[int]:
        """Slots of positions start..end-1 (default: every token of the sequence)."""
        end = self.num_tokens(seq_id) if end is None else end
        return [self.slot(seq_id, p) for p in range(start, end)]

    def slots(self, seq_id: Hashable, start: int, end: int) -> list[int]:
        """`slot_mapping(seq_id, start, end)` worked out a block at a time rather than a slot at a
        time: positions start..end-1 that share a block are one run of consecutive slots."""
        table, n, size = self._table(seq_id), len(self._tokens[seq_id]), self.block_size
        if start < end and not (0 <= start and end <= n):
            raise ValueError(f"positions {start}..{end - 1} are not all in [0, {n}) for sequence {seq_id!r}")
        slots = []
        for i in range(start // size, -(-end // size)):        # the blocks holding start..end-1
            first = table[i] * size
            slots += range(first + max(start - i * size, 0), first + min(end - i * size, size))
        return slots

    # ----- state changes -------------------------------------------------------------------
    def allocate(self, seq_id: Hashable, token_ids: Sequence[int]) -> int:
        """Give a new sequence blocks for its prompt, reusing cached full prefix blocks.

        Returns the number of leading prompt tokens whose K/V already sit in the pool (a multiple
        of block_size, always < len(token_ids) so the runner still computes the last token and its
        logits). Raises OutOfBlocks, changing nothing, when the pool cannot hold the rest.
        New full blocks are entered in the prefix cache at once: the runner must write their K/V in
        the step that first attends to them, before any later prompt can hit them.
        """
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already has blocks; free it first or pick a new id")
        tokens = _as_token_ids(token_ids)
        if not tokens:
            raise ValueError(f"cannot allocate an empty prompt for sequence {seq_id!r}")
        hashes = full_block_hashes(tokens, self.block_size) if self.enable_prefix_caching else []
        hits = self._cached_prefix(hashes[:(len(tokens) - 1) // self.block_size])
        new_blocks = self.blocks_needed(len(tokens)) - len(hits)
        available = self.num_free_blocks - sum(self.cache.is_idle(b) for b in hits)
        if new_blocks > available:
            raise OutOfBlocks(f"sequence {seq_id!r} needs {new_blocks} new blocks of {self.block_size} "
                              f"tokens, only {available} are free")
        for block_id in hits:
            if self.cache.is_idle(block_id):
                self.cache.unpark(block_id)
            self._refs[block_id] += 1
        table = hits + [self._take_block() for _ in range(new_blocks)]
        for i in range(len(hits), len(hashes)):
            self.cache.register(hashes[i], table[i])
        self.prefix_hits += len(hits)
        self.prefix_misses += len(hashes) - len(hits)
        self._tables[seq_id], self._tokens[seq_id], self._hashes[seq_id] = table, tokens, hashes
        return len(hits) * self.block_size

    def append_token(self, seq_id: Hashable, token_id: int) -> tuple[int, int] | None:
        """Make room for one more token (its K/V go to `slot(seq_id, num_tokens - 1)` afterwards).

        Takes a new block when the tail block is full. When the partial tail is shared with another
        sequence (after `fork`), moves this sequence to a new tail block and returns (src, dst): the
        runner must copy block src's K/V into block dst (its first `(num_tokens - 1) % block_size`
        slots hold data) before writing the new token. Returns None when no copy is needed. Raises
        OutOfBlocks, changing nothing, when a block is needed and none is free.
        """
        needed = self._blocks_for_append(seq_id)
        _check_token_id(token_id)
        if needed > self.num_free_blocks:
            raise OutOfBlocks(f"sequence {seq_id!r} needs a new block and none is free")
        table, tokens = self._tables[seq_id], self._tokens[seq_id]
        copy = None
        if len(tokens) % self.block_size == 0:
            table.append(self._take_block())
        elif needed:
            src, dst = table[-1], self._take_block()
            self._refs[src] -= 1
            table[-1] = dst
            copy = (src, dst)
        tokens.append(token_id)
        if self.enable_prefix_caching and len(tokens) % self.block_size == 0:
            self._name_full_tail(seq_id)
        return copy

    def append_tokens(self, seq_id: Hashable, token_ids: Sequence[int]) -> tuple[int, list[tuple[int, int]]]:
        """`append_token` for each id in order, stopping at the first that finds no free block.

        Returns (how many were appended, the copy-on-write (src, dst) pairs to perform, in order);
        the state afterwards is what those `append_token` calls leave. The work is done a block at
        a time: one `append_token` where a block may be taken, then the rest of that block at once.
        A bad token id raises TypeError / ValueError before anything is appended.
        """
        self._table(seq_id)                      # an unknown seq_id raises here
        tokens = self._tokens[seq_id]
        for token_id in token_ids:
            _check_token_id(token_id)
        done, copies = 0, []
        while done < len(token_ids):
            try:
                copy = self.append_token(seq_id, token_ids[done])   # takes a block if one is needed
            except OutOfBlocks:
                break
            done += 1
            if copy is not None:
                copies.append(copy)
            fill = token_ids[done:done + (-len(tokens)) % self.block_size]   # the rest of that block
            tokens.extend(fill)
            done += len(fill)
            if fill and self.enable_prefix_caching and len(tokens) % self.block_size == 0:
                self._name_full_tail(seq_id)
        return done, copies

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """Start `child_id` as a copy of `parent_id` sharing every block (no data is copied)."""
        table = self._table(parent_id)
        if child_id in self._tables:
            raise ValueError(f"sequence {child_id!r} already exists; fork into a new id")
        for block_id in table:
            self._refs[block_id] += 1
        self._tables[child_id] = list(table)
        self._tokens[child_id] = list(self._tokens[parent_id])
        self._hashes[child_id] = list(self._hashes[parent_id])

    def free(self, seq_id: Hashable) -> None:
        """Drop the sequence; blocks nobody references go back to the pool (cached ones stay idle).

        Blocks are released tail first, so an idle cached prefix is evicted from its end first.
        """
        table = self._table(seq_id)
        del self._tables[seq_id], self._tokens[seq_id], self._hashes[seq_id]
        for block_id in reversed(table):
            self._release(block_id)

    def truncate(self, seq_id: Hashable, n_tokens: int) -> None:
        """Keep the sequence's first n_tokens tokens and forget the rest (rejected speculative drafts).

        Blocks past the new end are released as in `free`. A tail block left partly filled will be
        written again, so it stops naming its old prefix in the prefix cache, unless another
        sequence still holds it (then it is that sequence's data, and the next append copies it).
        """
        table, tokens = self._table(seq_id), self._tokens[seq_id]
        if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or not 1 <= n_tokens <= len(tokens):
            raise ValueError(f"n_tokens must be an int in [1, {len(tokens)}] for sequence {seq_id!r}, got {n_tokens!r}")
        keep = self.blocks_needed(n_tokens)
        for block_id in reversed(table[keep:]):
            self._release(block_id)
        del table[keep:], tokens[n_tokens:], self._hashes[seq_id][n_tokens // self.block_size:]
        tail = table[-1]
        if n_tokens % self.block_size and self._refs[tail] == 1 and self.cache.is_cached(tail):
            self.cache.unregister(tail)

    # ----- internals -----------------------------------------------------------------------
    def _table(self, seq_id: Hashable) -> list[int]:
        try:
            return self._tables[seq_id]
        except (KeyError, TypeError):
            raise ValueError(f"unknown sequence {seq_id!r}: allocate or fork it first") from None

    def _release(self, block_id: int) -> None:
        """Drop one reference; at zero the block is parked (cached) or returned to the free list."""
        self._refs[block_id] -= 1
        if self._refs[block_id] == 0:
            if self.cache.is_cached(block_id):
                self.cache.park(block_id)
            else:
                self._free.append(block_id)

    def _blocks_for_append(self, seq_id: Hashable) -> int:
        """1 when appending needs a block (full tail, or a shared partial tail to copy), else 0."""
        table, n = self._table(seq_id), len(self._tokens[seq_id])
        return int(n % self.block_size == 0 or self._refs[table[-1]] > 1)

    def _name_full_tail(self, seq_id: Hashable) -> None:
        """The tail block has just filled up: enter it in the prefix cache under its chained hash."""
        tokens, hashes = self._tokens[seq_id], self._hashes[seq_id]
        hashes.append(chain_hash(hashes[-1] if hashes else None, tokens[-self.block_size:]))
        self.cache.register(hashes[-1], self._tables[seq_id][-1])

    def _cached_prefix(self, hashes: list[int]) -> list[int]:
        """Block ids holding the longest run of leading hashes found in the cache."""
        hits = []
        for block_hash in hashes:
            block_id = self.cache.lookup(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def _take_block(self) -> int:
        """A block for new data with refcount 1: from the free list, else evict the LRU idle block."""
        if self._free:
            block_id = self._free.popleft()
        else:
            block_id = self.cache.evict_oldest()
            self.evictions += 1
        self._refs[block_id] = 1
        return block_id
