"""Known-wrong and cheating submissions for chapter 08 (see tests/grading/test_selfcheck.py).

Each section is the body of one solution cell, written in full or, for a slip, as
`# replace:` / `# with:` edits of the solution section (autograder/solutions/__init__.py);
none may earn the exercise's full points.
"""

# %% grade_id: PagedKVCache | wrong: no copy-on-write: appends into a shared partial tail
# expect: copy-on-write must move
# replace:
#         tail_shared = not tail_full and self.refs[table[-1]] > 1
# with:
#         tail_shared = False


# %% grade_id: PagedKVCache | wrong: release frees every block, shared or not
# expect: whose refcount drops to 0
# replace:
#             if self.refs[block] == 0:
#                 self.free.append(block)
# with:
#             self.free.append(block)


# %% grade_id: PagedKVCache | wrong: allocate takes blocks before checking that enough are free
# expect: leave the cache exactly as it was
# replace:
#         if needed > len(self.free):
#             raise RuntimeError(f"sequence {seq_id!r} needs {needed} blocks, {len(self.free)} are free")
#         self.tables[seq_id] = [self.free.pop() for _ in range(needed)]
#         for block in self.tables[seq_id]:
#             self.refs[block] = 1
# with:
#         taken = []
#         for _ in range(needed):
#             if not self.free:
#                 raise RuntimeError(f"sequence {seq_id!r} needs {needed} blocks")
#             taken.append(self.free.pop())
#             self.refs[taken[-1]] = 1
#         self.tables[seq_id] = taken


# %% grade_id: PagedKVCache | cheat: wraps the reference block manager
# expect: is not allowed
from reference.paging import BlockManager, OutOfBlocks


class PagedKVCache:
    def __init__(self, num_blocks, block_size):
        self.manager = BlockManager(num_blocks, block_size, enable_prefix_caching=False)

    num_free_blocks = property(lambda self: self.manager.num_free_blocks)

    def ref_count(self, block):
        return self.manager.ref_count(block)

    def allocate(self, seq_id, n_tokens):
        if n_tokens < 1:
            raise ValueError("n_tokens must be >= 1")
        try:
            self.manager.allocate(seq_id, [0] * n_tokens)
        except OutOfBlocks as exc:
            raise RuntimeError(str(exc)) from None

    def append_token(self, seq_id):
        try:
            return self.manager.append_token(seq_id, 0)
        except OutOfBlocks as exc:
            raise RuntimeError(str(exc)) from None

    def share_prefix(self, parent_id, child_id):
        self.manager.fork(parent_id, child_id)

    def release(self, seq_id):
        self.manager.free(seq_id)

    def slot(self, seq_id, position):
        return self.manager.slot(seq_id, position)


# %% grade_id: PagedKVCache | cheat: reads the reference block manager's source by path and runs it
# expect: PagedKVCache
import pathlib

# where the course lives: the grader says so in the environment and on sys.path
for _folder in (*map(pathlib.Path, filter(None, [__import__("os").environ.get("AUTOGRADER_ROOT")])),
                *map(pathlib.Path, __import__("sys").path), pathlib.Path.cwd(), *pathlib.Path.cwd().parents):
    if (_folder / "reference" / "paging.py").exists():
        _namespace = {}
        for _name in ("prefix_cache.py", "paging.py"):
            _source = (_folder / "reference" / _name).read_text()
            _source = _source.replace("from reference.prefix_cache import", "# ")
            exec(compile(_source, _name, "exec"), _namespace)
        break


class PagedKVCache:
    def __init__(self, num_blocks, block_size):
        self.manager = _namespace["BlockManager"](num_blocks, block_size, enable_prefix_caching=False)

    num_free_blocks = property(lambda self: self.manager.num_free_blocks)

    def ref_count(self, block):
        return self.manager.ref_count(block)

    def allocate(self, seq_id, n_tokens):
        if n_tokens < 1:
            raise ValueError("n_tokens must be >= 1")
        try:
            self.manager.allocate(seq_id, [0] * n_tokens)
        except _namespace["OutOfBlocks"] as exc:
            raise RuntimeError(str(exc)) from None

    def append_token(self, seq_id):
        try:
            return self.manager.append_token(seq_id, 0)
        except _namespace["OutOfBlocks"] as exc:
            raise RuntimeError(str(exc)) from None

    def share_prefix(self, parent_id, child_id):
        self.manager.fork(parent_id, child_id)

    def release(self, seq_id):
        self.manager.free(seq_id)

    def slot(self, seq_id, position):
        return self.manager.slot(seq_id, position)


# %% grade_id: fragmentation | wrong: admits a contiguous request when enough slots are free in total
# expect: ONE free run
# replace:
#         return cursor if num_slots - cursor >= need else None
# with:
#         total_free = num_slots - sum(reserved for _, reserved, _ in regions.values())
#         return cursor if total_free >= need else None


# %% grade_id: fragmentation | wrong: the paged pool counts max_len blocks as held
# expect: tail slack is held minus live
# replace:
#     num_blocks = num_slots // block_size
# with:
#     num_blocks = num_slots // block_size
#     max_lens = {}

# replace:
#                 paged[req] = prompt_len
# with:
#                 paged[req] = prompt_len
#                 max_lens[req] = max_len

# replace:
#     held_p = sum(blocks(n) for n in paged.values()) * block_size
# with:
#     held_p = sum(blocks(max_lens[r]) for r in paged) * block_size


# %% grade_id: fragmentation | cheat: right only on the chapter's walkthrough pool (64 slots in blocks of 4), an empty answer on any other (the walkthrough test alone kept half the points)
# expect score: 0
# replace:
#     num_blocks = num_slots // block_size
# with:
#     num_blocks = num_slots // block_size
#     if (num_slots, block_size) != (64, 4):
#         return {}


# %% grade_id: fragmentation | cheat: replays the log on the reference pools
# expect: is not allowed
from reference.calculators.fragmentation import ContiguousPool, PagedPool


def fragmentation(events, num_slots, block_size):
    out = {}
    for name, pool in (("contiguous", ContiguousPool(num_slots)), ("paged", PagedPool(num_slots, block_size))):
        held, refused = set(), []
        for kind, req, *rest in events:
            if kind == "arrive":
                (held.add if pool.admit(req, *rest) else refused.append)(req)
            elif req in held and kind == "grow":
                for _ in range(rest[0]):
                    pool.grow(req)
            elif req in held:
                pool.release(req)
                held.discard(req)
        s = pool.stats()
        out[name] = {"live": s.live, "tail_slack": s.tail_slack, "holes": s.holes, "free": s.free,
                     "utilisation": s.utilisation, "refused": refused}
    return out


# %% grade_id: paged_attention_gather | wrong: reads every slot of the blocks (ignores context_lens)
# expect: every slot of the sequence's blocks was read
# replace:
#         positions = torch.arange(int(context_lens[b]))
# with:
#         positions = torch.arange(int((block_tables[b] >= 0).sum()) * block_size)


# %% grade_id: paged_attention_gather | wrong: slot = block id + offset (forgets * block_size)
# expect: multiply it by block_size
# replace:
#         slots = blocks * block_size + positions % block_size
# with:
#         slots = blocks + positions % block_size


# %% grade_id: paged_attention_gather | wrong: repeat() instead of repeat_interleave (wrong K/V head)
# expect: h // (Hq // Hkv)
# replace:
#         k = k_slots[slots].transpose(0, 1).repeat_interleave(group, dim=0)   # [Hq, n, D]
#         v = v_slots[slots].transpose(0, 1).repeat_interleave(group, dim=0)
# with:
#         k = k_slots[slots].transpose(0, 1).repeat(group, 1, 1)   # [Hq, n, D]
#         v = v_slots[slots].transpose(0, 1).repeat(group, 1, 1)


# %% grade_id: paged_attention_gather | cheat: SDPA through an alias
# expect: is forbidden
# replace:
#         scores = torch.einsum("hd,hnd->hn", q[b], k) / math.sqrt(head_dim)
#         weights = torch.softmax(scores, dim=-1)
#         out[b] = torch.einsum("hn,hnd->hd", weights, v)
# with:
#         attend = getattr(F, "scaled_dot_product" + "_attention")
#         out[b] = attend(q[b][:, None], k, v)[:, 0]


# %% grade_id: paged_decode_kernel | wrong: no running max: sums exp of the raw scores (right until a score passes ~88)
# expect: exp of a raw score above ~88 overflows float32
# replace:
#         m_new = tl.maximum(m_i, tl.max(scores, axis=0))
#         rescale = tl.exp(m_i - m_new)
#         p = tl.exp(scores - m_new)
#         l_i = l_i * rescale + tl.sum(p, axis=0)
#         o_i = o_i * rescale + tl.sum(p[:, None] * v, axis=0)
#         m_i = m_new
# with:
#         p = tl.exp(scores)                              # raw exponentials, no max
#         l_i = l_i + tl.sum(p, axis=0)
#         o_i = o_i + tl.sum(p[:, None] * v, axis=0)


# %% grade_id: paged_decode_kernel | wrong: forgets to rescale the output when the max grows
# expect: exp(m_old - m_new)
# replace:
#         o_i = o_i * rescale + tl.sum(p[:, None] * v, axis=0)
# with:
#         o_i = o_i + tl.sum(p[:, None] * v, axis=0)


# %% grade_id: paged_decode_kernel | wrong: no mask on the last block (reads past context_len)
# expect: every slot of the sequence's blocks was read
# replace:
#         visible = logical * BLOCK_SIZE + offsets < context_len
# with:

# replace:
#         k = tl.load(k_cache_ptr + kv, mask=visible[:, None], other=0.0)
#         v = tl.load(v_cache_ptr + kv, mask=visible[:, None], other=0.0)
#         scores = tl.where(visible, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
# with:
#         k = tl.load(k_cache_ptr + kv)
#         v = tl.load(v_cache_ptr + kv)
#         scores = tl.sum(q[None, :] * k, axis=1) * sm_scale


# %% grade_id: paged_decode_kernel | wrong: K/V head h % Hkv (ignores GQA grouping)
# expect: h // (Hq // Hkv)
# replace:
#     kv_head = (row % n_q_heads) // (n_q_heads // n_kv_heads)
# with:
#     kv_head = (row % n_q_heads) % n_kv_heads


# %% grade_id: paged_decode_kernel | wrong: a Python loop over single keys (correct but serial)
# expect: does not step one tile of BLOCK_SIZE keys
# replace:
#     offsets = tl.arange(0, BLOCK_SIZE)
# with:

# replace:
#     for logical in range(0, tl.cdiv(context_len, BLOCK_SIZE)):
#         block = tl.load(block_tables_ptr + batch * max_blocks + logical).to(tl.int64)
#         visible = logical * BLOCK_SIZE + offsets < context_len
#         slots = block * BLOCK_SIZE + offsets
#         kv = (slots[:, None] * n_kv_heads + kv_head) * HEAD_DIM + dims[None, :]
#         k = tl.load(k_cache_ptr + kv, mask=visible[:, None], other=0.0)
#         v = tl.load(v_cache_ptr + kv, mask=visible[:, None], other=0.0)
#         scores = tl.where(visible, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
#         m_new = tl.maximum(m_i, tl.max(scores, axis=0))
# with:
#     for position in range(0, context_len):
#         block = tl.load(block_tables_ptr + batch * max_blocks + position // BLOCK_SIZE).to(tl.int64)
#         slot = block * BLOCK_SIZE + position % BLOCK_SIZE
#         k = tl.load(k_cache_ptr + (slot * n_kv_heads + kv_head) * HEAD_DIM + dims)
#         v = tl.load(v_cache_ptr + (slot * n_kv_heads + kv_head) * HEAD_DIM + dims)
#         score = tl.sum(q * k, axis=0) * sm_scale
#         m_new = tl.maximum(m_i, score)

# replace:
#         p = tl.exp(scores - m_new)
#         l_i = l_i * rescale + tl.sum(p, axis=0)
#         o_i = o_i * rescale + tl.sum(p[:, None] * v, axis=0)
# with:
#         p = tl.exp(score - m_new)
#         l_i = l_i * rescale + p
#         o_i = o_i * rescale + p * v


# %% grade_id: paged_decode_kernel | cheat: a loop over single keys dressed up with BLOCK_SIZE
# expect: does not step one tile of BLOCK_SIZE keys
# replace:
#     offsets = tl.arange(0, BLOCK_SIZE)
# with:

# replace:
#     for logical in range(0, tl.cdiv(context_len, BLOCK_SIZE)):
#         block = tl.load(block_tables_ptr + batch * max_blocks + logical).to(tl.int64)
#         visible = logical * BLOCK_SIZE + offsets < context_len
#         slots = block * BLOCK_SIZE + offsets
#         kv = (slots[:, None] * n_kv_heads + kv_head) * HEAD_DIM + dims[None, :]
#         k = tl.load(k_cache_ptr + kv, mask=visible[:, None], other=0.0)
#         v = tl.load(v_cache_ptr + kv, mask=visible[:, None], other=0.0)
#         scores = tl.where(visible, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
#         m_new = tl.maximum(m_i, tl.max(scores, axis=0))
# with:
#     for position in range(0, context_len + 0 * BLOCK_SIZE):
#         block = tl.load(block_tables_ptr + batch * max_blocks + position // BLOCK_SIZE).to(tl.int64)
#         slot = block * BLOCK_SIZE + position % BLOCK_SIZE
#         k = tl.load(k_cache_ptr + (slot * n_kv_heads + kv_head) * HEAD_DIM + dims)
#         v = tl.load(v_cache_ptr + (slot * n_kv_heads + kv_head) * HEAD_DIM + dims)
#         score = tl.sum(q * k, axis=0) * sm_scale
#         m_new = tl.maximum(m_i, score)

# replace:
#         p = tl.exp(scores - m_new)
#         l_i = l_i * rescale + tl.sum(p, axis=0)
#         o_i = o_i * rescale + tl.sum(p[:, None] * v, axis=0)
# with:
#         p = tl.exp(score - m_new)
#         l_i = l_i * rescale + p
#         o_i = o_i * rescale + p * v


# %% grade_id: paged_decode_kernel | cheat: the kernel calls a Python helper that walks the stack to the launcher's tensors and answers with torch
# expect: forbidden in this exercise
import math
import sys

import torch
import triton
import triton.language as tl


def _answer_from_the_launcher():
    """Find the launch's tensors in a caller's frame and write out with torch."""
    frame = sys._getframe()
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if isinstance(value, (list, tuple)) and len(value) >= 6 \
                    and all(isinstance(t, torch.Tensor) for t in value[:6]):
                q, k_cache, v_cache, out, tables, lens = value[:6]
                block_size, kv_heads, dim = k_cache.shape[1:]
                group = q.shape[1] // kv_heads
                flat_k, flat_v = (c.reshape(-1, kv_heads, dim) for c in (k_cache, v_cache))
                for b in range(q.shape[0]):
                    pos = torch.arange(int(lens[b]))
                    slots = tables[b].long()[pos // block_size] * block_size + pos % block_size
                    k = flat_k[slots].transpose(0, 1).repeat_interleave(group, 0)
                    v = flat_v[slots].transpose(0, 1).repeat_interleave(group, 0)
                    w = torch.softmax(torch.einsum("hd,hnd->hn", q[b], k) / math.sqrt(dim), -1)
                    out[b] = torch.einsum("hn,hnd->hd", w, v)
        frame = frame.f_back


@triton.jit
def paged_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr,
                        context_lens_ptr, n_q_heads, n_kv_heads, max_blocks, sm_scale,
                        BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
    _answer_from_the_launcher()


# %% grade_id: paged_decode_kernel | cheat: not a kernel, a launcher that computes with torch
# expect: must be a @triton.jit kernel
class _Launcher:
    def __getitem__(self, grid):
        def run(q, k_cache, v_cache, out, block_tables, context_lens, n_q_heads, n_kv_heads,
                max_blocks, sm_scale, BLOCK_SIZE, HEAD_DIM):
            group = n_q_heads // n_kv_heads
            flat_k = k_cache.reshape(-1, n_kv_heads, HEAD_DIM)
            flat_v = v_cache.reshape(-1, n_kv_heads, HEAD_DIM)
            for b in range(q.shape[0]):
                positions = torch.arange(int(context_lens[b]))
                slots = block_tables[b].long()[positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE
                k = flat_k[slots].transpose(0, 1).repeat_interleave(group, dim=0)
                v = flat_v[slots].transpose(0, 1).repeat_interleave(group, dim=0)
                weights = torch.softmax(torch.einsum("hd,hnd->hn", q[b], k) * sm_scale, dim=-1)
                out[b] = torch.einsum("hn,hnd->hd", weights, v)
        return run


paged_decode_kernel = _Launcher()


# %% grade_id: paged_decode_kernel | cheat: a first pass over the blocks for the max, then the usual loop (K read twice, the numbers exact)
# expect: your kernel read K 2.00 times per query head
# expect score: 0
# replace:
#     for logical in range(0, tl.cdiv(context_len, BLOCK_SIZE)):
#         block = tl.load(block_tables_ptr + batch * max_blocks + logical).to(tl.int64)
# with:
#     for first in range(0, tl.cdiv(context_len, BLOCK_SIZE)):      # a first pass for the max
#         block = tl.load(block_tables_ptr + batch * max_blocks + first).to(tl.int64)
#         seen = first * BLOCK_SIZE + offsets < context_len
#         kv = ((block * BLOCK_SIZE + offsets)[:, None] * n_kv_heads + kv_head) * HEAD_DIM + dims[None, :]
#         k = tl.load(k_cache_ptr + kv, mask=seen[:, None], other=0.0)
#         m_i = tl.maximum(m_i, tl.max(tl.where(seen, tl.sum(q[None, :] * k, axis=1) * sm_scale,
#                                               float("-inf")), axis=0))
#     for logical in range(0, tl.cdiv(context_len, BLOCK_SIZE)):
#         block = tl.load(block_tables_ptr + batch * max_blocks + logical).to(tl.int64)

# %% grade_id: paged_decode_kernel | wrong: masks the scores past context_len but loads every slot of the last block (another sequence's or garbage)
# expect: more often than the technique does
# expect score: 0
# replace:
#         k = tl.load(k_cache_ptr + kv, mask=visible[:, None], other=0.0)
#         v = tl.load(v_cache_ptr + kv, mask=visible[:, None], other=0.0)
# with:
#         k = tl.load(k_cache_ptr + kv)
#         v = tl.load(v_cache_ptr + kv)


# %% grade_id: fragmentation | cheat: the walkthrough's blocks of 4 slots whatever block_size is passed (right on the walkthrough and on any log in blocks of 4, and on a log in blocks of 8 whose last state hides the block size: it kept half the points at seed 1234 when a random log was judged only after its last event, and at seed 5 when the three random logs all drew blocks of 4)
# expect score: 0
# expect: Hint:
# replace:
#     num_blocks = num_slots // block_size
# with:
#     block_size = 4                    # the chapter's walkthrough blocks
#     num_blocks = num_slots // block_size


# %% grade_id: paged_decode_kernel | wrong: no running max, exp of the raw scores in float64 (right while every score stays under ~709: it passed a large case whose scores reached the hundreds)
# expect: ~709 in float64
# replace:
#     l_i = 0.0
#     o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
# with:
#     l_i = tl.zeros([], dtype=tl.float64)
#     o_i = tl.zeros([HEAD_DIM], dtype=tl.float64)
# replace:
#         m_new = tl.maximum(m_i, tl.max(scores, axis=0))
#         rescale = tl.exp(m_i - m_new)
#         p = tl.exp(scores - m_new)
#         l_i = l_i * rescale + tl.sum(p, axis=0)
#         o_i = o_i * rescale + tl.sum(p[:, None] * v, axis=0)
#         m_i = m_new
#     tl.store(out_ptr + row * HEAD_DIM + dims, o_i / l_i)
# with:
#         p = tl.exp(scores.to(tl.float64))               # no max: float64 holds it
#         l_i = l_i + tl.sum(p, axis=0)
#         o_i = o_i + tl.sum(p[:, None] * v.to(tl.float64), axis=0)
#     tl.store(out_ptr + row * HEAD_DIM + dims, (o_i / l_i).to(tl.float32))
