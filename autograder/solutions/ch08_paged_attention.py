"""Solutions of exercises/ch08_paged_attention.ipynb, one section per solution cell.

Loaded with ``autograder.solutions.load_solutions("ch08_paged_attention")``; never imported as a
module by the grader (each section is injected into the notebook and graded).
"""

# %% grade_id: PagedKVCache
class PagedKVCache:
    """Block bookkeeping of a paged KV cache: block tables, a free list, reference counts.

    The pool holds num_blocks blocks of block_size token slots. Token `position` of a sequence
    lives in slot table[position // block_size] * block_size + position % block_size. No tensors
    here: append_token returns the copy the caller must make on the K/V pool, (src, dst), when
    copy-on-write moves a sequence off a shared partial tail block.
    Errors: ValueError for an unknown or already existing sequence id, n_tokens < 1, a position
    outside the sequence; RuntimeError (the state left unchanged) when too few blocks are free.
    """

    def __init__(self, num_blocks: int, block_size: int):
        """An empty pool: every block free, no sequences."""
        self.block_size = block_size
        self.free = list(range(num_blocks))      # free block ids; any order works
        self.refs = [0] * num_blocks              # how many block tables hold each block
        self.tables = {}                          # seq_id -> list of block ids
        self.lengths = {}                         # seq_id -> tokens held

    @property
    def num_free_blocks(self) -> int:
        """Blocks that no sequence holds."""
        return len(self.free)

    def ref_count(self, block: int) -> int:
        """How many sequences' block tables hold `block` (0 for a free block)."""
        return self.refs[block]

    def allocate(self, seq_id, n_tokens: int) -> None:
        """Start a new sequence holding n_tokens tokens (its prompt) in ceil(n_tokens /
        block_size) free blocks, each with refcount 1. RuntimeError, changing nothing, when
        fewer blocks are free."""
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id!r} already exists")
        if n_tokens < 1:
            raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
        needed = -(-n_tokens // self.block_size)
        if needed > len(self.free):
            raise RuntimeError(f"sequence {seq_id!r} needs {needed} blocks, {len(self.free)} are free")
        self.tables[seq_id] = [self.free.pop() for _ in range(needed)]
        for block in self.tables[seq_id]:
            self.refs[block] = 1
        self.lengths[seq_id] = n_tokens

    def append_token(self, seq_id) -> tuple[int, int] | None:
        """Make room for one more token; it goes to slot(seq_id, old length) afterwards.

        When the tail block is full, the token starts a new block. A partial tail block that
        other sequences share (refcount > 1) is copied on write: the sequence moves to a
        free block dst, src's refcount drops by one, and (src, dst) is returned for the caller
        to copy src's K/V into dst. Otherwise returns None. RuntimeError, changing nothing, when
        a block is needed and none is free.
        """
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id!r}")
        table, n = self.tables[seq_id], self.lengths[seq_id]
        tail_full = n % self.block_size == 0
        tail_shared = not tail_full and self.refs[table[-1]] > 1
        copy = None
        if tail_full or tail_shared:
            if not self.free:
                raise RuntimeError(f"sequence {seq_id!r} needs a new block and none is free")
            block = self.free.pop()
            self.refs[block] = 1
            if tail_full:
                table.append(block)
            else:
                self.refs[table[-1]] -= 1
                copy = (table[-1], block)
                table[-1] = block
        self.lengths[seq_id] = n + 1
        return copy

    def share_prefix(self, parent_id, child_id) -> None:
        """Start child_id with the parent's tokens by pointing at all of the parent's blocks
        (no block is taken; each of them gains one reference)."""
        if parent_id not in self.tables:
            raise ValueError(f"unknown sequence {parent_id!r}")
        if child_id in self.tables:
            raise ValueError(f"sequence {child_id!r} already exists")
        for block in self.tables[parent_id]:
            self.refs[block] += 1
        self.tables[child_id] = list(self.tables[parent_id])
        self.lengths[child_id] = self.lengths[parent_id]

    def release(self, seq_id) -> None:
        """Forget the sequence: each of its blocks loses one reference, and blocks whose
        refcount drops to 0 become free."""
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id!r}")
        for block in self.tables.pop(seq_id):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.append(block)
        del self.lengths[seq_id]

    def slot(self, seq_id, position: int) -> int:
        """Physical slot of token `position` (0-based, below the sequence's length):
        block_table[position // block_size] * block_size + position % block_size."""
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id!r}")
        if not 0 <= position < self.lengths[seq_id]:
            raise ValueError(f"position {position} outside sequence {seq_id!r} "
                             f"of {self.lengths[seq_id]} tokens")
        table = self.tables[seq_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size


# %% grade_id: fragmentation
def fragmentation(events: list, num_slots: int, block_size: int) -> dict:
    """Replay an allocation log on a contiguous pool and on a paged pool of num_slots slots.

    events: tuples ("arrive", req_id, prompt_len, max_len), ("grow", req_id, n_tokens),
    ("finish", req_id). The contiguous pool reserves max_len slots first-fit (the lowest free
    run that is long enough); the paged pool takes ceil(tokens / block_size) blocks of
    block_size slots. A pool that cannot admit an arriving request refuses it and ignores later
    events naming it. Returns {"contiguous": stats, "paged": stats} after the last event, each
    stats a dict: live (tokens held), tail_slack (held but unused slots), holes (free slots
    below the end of the highest reservation; 0 for the paged pool), free (slots nobody holds),
    utilisation (live / num_slots), refused (request ids refused, in order).
    """
    regions, refused_c = {}, []            # req -> [start, reserved, used]
    paged, refused_p = {}, []              # req -> tokens
    num_blocks = num_slots // block_size

    def blocks(tokens):
        return -(-tokens // block_size)

    def first_fit(need):
        cursor = 0
        for start, reserved, _ in sorted(regions.values()):
            if start - cursor >= need:
                return cursor
            cursor = start + reserved
        return cursor if num_slots - cursor >= need else None

    for event in events:
        kind, req = event[0], event[1]
        if kind == "arrive":
            prompt_len, max_len = event[2], event[3]
            start = first_fit(max_len)
            if start is None:
                refused_c.append(req)
            else:
                regions[req] = [start, max_len, prompt_len]
            if blocks(prompt_len) + sum(blocks(n) for n in paged.values()) <= num_blocks:
                paged[req] = prompt_len
            else:
                refused_p.append(req)
        elif kind == "grow":
            if req in regions:
                regions[req][2] += event[2]
            if req in paged:
                paged[req] += event[2]
        elif kind == "finish":
            regions.pop(req, None)
            paged.pop(req, None)
        else:
            raise ValueError(f"unknown event {event!r}")
    live_c = sum(used for _, _, used in regions.values())
    held_c = sum(reserved for _, reserved, _ in regions.values())
    top = max((s + reserved for s, reserved, _ in regions.values()), default=0)
    live_p = sum(paged.values())
    held_p = sum(blocks(n) for n in paged.values()) * block_size
    return {"contiguous": {"live": live_c, "tail_slack": held_c - live_c, "holes": top - held_c,
                           "free": num_slots - held_c, "utilisation": live_c / num_slots,
                           "refused": refused_c},
            "paged": {"live": live_p, "tail_slack": held_p - live_p, "holes": 0,
                      "free": num_slots - held_p, "utilisation": live_p / num_slots,
                      "refused": refused_p}}


# %% grade_id: paged_attention_gather
import math

import torch
from torch import Tensor


def paged_attention_gather(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                           context_lens: Tensor) -> Tensor:
    """Decode attention that reads each sequence's keys and values through its block table.

    q: [B, Hq, D], one query per sequence. k_cache, v_cache: [num_blocks, block_size, Hkv, D],
    one layer of the paged pool. block_tables: int32 [B, max_blocks], physical block ids padded
    with -1. context_lens: int32 [B], keys visible to each sequence (positions 0 .. len - 1).
    Position p of sequence b lives in slot block_tables[b, p // block_size] * block_size
    + p % block_size of the pool seen as [num_blocks * block_size, Hkv, D]. Query head h reads
    K/V head h // (Hq // Hkv). Returns softmax(q k^T / sqrt(D)) v, [B, Hq, D], q's dtype.
    scaled_dot_product_attention is not allowed.
    """
    block_size, n_kv_heads, head_dim = k_cache.shape[1:]
    group = q.shape[1] // n_kv_heads
    k_slots = k_cache.reshape(-1, n_kv_heads, head_dim)
    v_slots = v_cache.reshape(-1, n_kv_heads, head_dim)
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        positions = torch.arange(int(context_lens[b]))
        blocks = block_tables[b].long()[positions // block_size]
        slots = blocks * block_size + positions % block_size
        k = k_slots[slots].transpose(0, 1).repeat_interleave(group, dim=0)   # [Hq, n, D]
        v = v_slots[slots].transpose(0, 1).repeat_interleave(group, dim=0)
        scores = torch.einsum("hd,hnd->hn", q[b], k) / math.sqrt(head_dim)
        weights = torch.softmax(scores, dim=-1)
        out[b] = torch.einsum("hn,hnd->hd", weights, v)
    return out


# %% grade_id: paged_decode_kernel
import triton
import triton.language as tl


@triton.jit
def paged_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr,
                        context_lens_ptr, n_q_heads, n_kv_heads, max_blocks, sm_scale,
                        BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Paged decode attention: one program per (sequence, query head), row = b * n_q_heads + h.

    Contiguous float32 tensors: q and out [B, Hq, D]; k_cache and v_cache [num_blocks,
    BLOCK_SIZE, Hkv, D]; block_tables int32 [B, max_blocks] (padded with -1); context_lens
    int32 [B]. The program walks the sequence's block table, one block of BLOCK_SIZE keys at a
    time, reading K/V head h // (n_q_heads // n_kv_heads) at positions 0 .. context_len - 1
    only, keeps an online softmax (running max m, sum l, output o), and stores o / l into
    out[b, h, :], where score = (q . k) * sm_scale.
    """
    row = tl.program_id(0)
    batch = row // n_q_heads
    kv_head = (row % n_q_heads) // (n_q_heads // n_kv_heads)
    dims = tl.arange(0, HEAD_DIM)
    offsets = tl.arange(0, BLOCK_SIZE)
    q = tl.load(q_ptr + row * HEAD_DIM + dims)
    context_len = tl.load(context_lens_ptr + batch)
    m_i = float("-inf")
    l_i = 0.0
    o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for logical in range(0, tl.cdiv(context_len, BLOCK_SIZE)):
        block = tl.load(block_tables_ptr + batch * max_blocks + logical).to(tl.int64)
        visible = logical * BLOCK_SIZE + offsets < context_len
        slots = block * BLOCK_SIZE + offsets
        kv = (slots[:, None] * n_kv_heads + kv_head) * HEAD_DIM + dims[None, :]
        k = tl.load(k_cache_ptr + kv, mask=visible[:, None], other=0.0)
        v = tl.load(v_cache_ptr + kv, mask=visible[:, None], other=0.0)
        scores = tl.where(visible, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        rescale = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new)
        l_i = l_i * rescale + tl.sum(p, axis=0)
        o_i = o_i * rescale + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    tl.store(out_ptr + row * HEAD_DIM + dims, o_i / l_i)
