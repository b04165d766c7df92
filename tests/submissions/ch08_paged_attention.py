"""Known-wrong and cheating submissions for chapter 08 (see tests/test_selfcheck.py).

Each section is the body of one solution cell; none may earn the exercise's full points.
"""

# %% grade_id: PagedKVCache | wrong: no copy-on-write: appends into a shared partial tail
# expect: copy-on-write must move
class PagedKVCache:

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free = list(range(num_blocks))      # free block ids; any order works
        self.refs = [0] * num_blocks              # how many block tables hold each block
        self.tables = {}                          # seq_id -> list of block ids
        self.lengths = {}                         # seq_id -> tokens held

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def ref_count(self, block: int) -> int:
        return self.refs[block]

    def allocate(self, seq_id, n_tokens: int) -> None:
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
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id!r}")
        table, n = self.tables[seq_id], self.lengths[seq_id]
        tail_full = n % self.block_size == 0
        tail_shared = False
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
        if parent_id not in self.tables:
            raise ValueError(f"unknown sequence {parent_id!r}")
        if child_id in self.tables:
            raise ValueError(f"sequence {child_id!r} already exists")
        for block in self.tables[parent_id]:
            self.refs[block] += 1
        self.tables[child_id] = list(self.tables[parent_id])
        self.lengths[child_id] = self.lengths[parent_id]

    def release(self, seq_id) -> None:
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id!r}")
        for block in self.tables.pop(seq_id):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.append(block)
        del self.lengths[seq_id]

    def slot(self, seq_id, position: int) -> int:
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id!r}")
        if not 0 <= position < self.lengths[seq_id]:
            raise ValueError(f"position {position} outside sequence {seq_id!r} "
                             f"of {self.lengths[seq_id]} tokens")
        table = self.tables[seq_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size


# %% grade_id: PagedKVCache | wrong: release frees every block, shared or not
# expect: whose refcount drops to 0
class PagedKVCache:

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free = list(range(num_blocks))      # free block ids; any order works
        self.refs = [0] * num_blocks              # how many block tables hold each block
        self.tables = {}                          # seq_id -> list of block ids
        self.lengths = {}                         # seq_id -> tokens held

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def ref_count(self, block: int) -> int:
        return self.refs[block]

    def allocate(self, seq_id, n_tokens: int) -> None:
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
        if parent_id not in self.tables:
            raise ValueError(f"unknown sequence {parent_id!r}")
        if child_id in self.tables:
            raise ValueError(f"sequence {child_id!r} already exists")
        for block in self.tables[parent_id]:
            self.refs[block] += 1
        self.tables[child_id] = list(self.tables[parent_id])
        self.lengths[child_id] = self.lengths[parent_id]

    def release(self, seq_id) -> None:
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id!r}")
        for block in self.tables.pop(seq_id):
            self.refs[block] -= 1
            self.free.append(block)
        del self.lengths[seq_id]

    def slot(self, seq_id, position: int) -> int:
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id!r}")
        if not 0 <= position < self.lengths[seq_id]:
            raise ValueError(f"position {position} outside sequence {seq_id!r} "
                             f"of {self.lengths[seq_id]} tokens")
        table = self.tables[seq_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size


# %% grade_id: PagedKVCache | wrong: allocate takes blocks before checking that enough are free
# expect: leave the cache exactly as it was
class PagedKVCache:

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free = list(range(num_blocks))      # free block ids; any order works
        self.refs = [0] * num_blocks              # how many block tables hold each block
        self.tables = {}                          # seq_id -> list of block ids
        self.lengths = {}                         # seq_id -> tokens held

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def ref_count(self, block: int) -> int:
        return self.refs[block]

    def allocate(self, seq_id, n_tokens: int) -> None:
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id!r} already exists")
        if n_tokens < 1:
            raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
        needed = -(-n_tokens // self.block_size)
        taken = []
        for _ in range(needed):
            if not self.free:
                raise RuntimeError(f"sequence {seq_id!r} needs {needed} blocks")
            taken.append(self.free.pop())
            self.refs[taken[-1]] = 1
        self.tables[seq_id] = taken
        self.lengths[seq_id] = n_tokens

    def append_token(self, seq_id) -> tuple[int, int] | None:
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
        if parent_id not in self.tables:
            raise ValueError(f"unknown sequence {parent_id!r}")
        if child_id in self.tables:
            raise ValueError(f"sequence {child_id!r} already exists")
        for block in self.tables[parent_id]:
            self.refs[block] += 1
        self.tables[child_id] = list(self.tables[parent_id])
        self.lengths[child_id] = self.lengths[parent_id]

    def release(self, seq_id) -> None:
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id!r}")
        for block in self.tables.pop(seq_id):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.append(block)
        del self.lengths[seq_id]

    def slot(self, seq_id, position: int) -> int:
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id!r}")
        if not 0 <= position < self.lengths[seq_id]:
            raise ValueError(f"position {position} outside sequence {seq_id!r} "
                             f"of {self.lengths[seq_id]} tokens")
        table = self.tables[seq_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size


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
def fragmentation(events: list, num_slots: int, block_size: int) -> dict:
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
        total_free = num_slots - sum(reserved for _, reserved, _ in regions.values())
        return cursor if total_free >= need else None

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


# %% grade_id: fragmentation | wrong: the paged pool counts max_len blocks as held
# expect: tail slack is held minus live
def fragmentation(events: list, num_slots: int, block_size: int) -> dict:
    regions, refused_c = {}, []            # req -> [start, reserved, used]
    paged, refused_p = {}, []              # req -> tokens
    num_blocks = num_slots // block_size
    reserved = {}

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
                reserved[req] = max_len
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
    held_p = sum(blocks(reserved[r]) for r in paged) * block_size
    return {"contiguous": {"live": live_c, "tail_slack": held_c - live_c, "holes": top - held_c,
                           "free": num_slots - held_c, "utilisation": live_c / num_slots,
                           "refused": refused_c},
            "paged": {"live": live_p, "tail_slack": held_p - live_p, "holes": 0,
                      "free": num_slots - held_p, "utilisation": live_p / num_slots,
                      "refused": refused_p}}


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
import math

import torch
from torch import Tensor


def paged_attention_gather(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                           context_lens: Tensor) -> Tensor:
    block_size, n_kv_heads, head_dim = k_cache.shape[1:]
    group = q.shape[1] // n_kv_heads
    k_slots = k_cache.reshape(-1, n_kv_heads, head_dim)
    v_slots = v_cache.reshape(-1, n_kv_heads, head_dim)
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        positions = torch.arange(int((block_tables[b] >= 0).sum()) * block_size)
        blocks = block_tables[b].long()[positions // block_size]
        slots = blocks * block_size + positions % block_size
        k = k_slots[slots].transpose(0, 1).repeat_interleave(group, dim=0)   # [Hq, n, D]
        v = v_slots[slots].transpose(0, 1).repeat_interleave(group, dim=0)
        scores = torch.einsum("hd,hnd->hn", q[b], k) / math.sqrt(head_dim)
        weights = torch.softmax(scores, dim=-1)
        out[b] = torch.einsum("hn,hnd->hd", weights, v)
    return out


# %% grade_id: paged_attention_gather | wrong: slot = block id + offset (forgets * block_size)
# expect: multiply it by block_size
import math

import torch
from torch import Tensor


def paged_attention_gather(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                           context_lens: Tensor) -> Tensor:
    block_size, n_kv_heads, head_dim = k_cache.shape[1:]
    group = q.shape[1] // n_kv_heads
    k_slots = k_cache.reshape(-1, n_kv_heads, head_dim)
    v_slots = v_cache.reshape(-1, n_kv_heads, head_dim)
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        positions = torch.arange(int(context_lens[b]))
        blocks = block_tables[b].long()[positions // block_size]
        slots = blocks + positions % block_size
        k = k_slots[slots].transpose(0, 1).repeat_interleave(group, dim=0)   # [Hq, n, D]
        v = v_slots[slots].transpose(0, 1).repeat_interleave(group, dim=0)
        scores = torch.einsum("hd,hnd->hn", q[b], k) / math.sqrt(head_dim)
        weights = torch.softmax(scores, dim=-1)
        out[b] = torch.einsum("hn,hnd->hd", weights, v)
    return out


# %% grade_id: paged_attention_gather | wrong: repeat() instead of repeat_interleave (wrong K/V head)
# expect: h // (Hq // Hkv)
import math

import torch
from torch import Tensor


def paged_attention_gather(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                           context_lens: Tensor) -> Tensor:
    block_size, n_kv_heads, head_dim = k_cache.shape[1:]
    group = q.shape[1] // n_kv_heads
    k_slots = k_cache.reshape(-1, n_kv_heads, head_dim)
    v_slots = v_cache.reshape(-1, n_kv_heads, head_dim)
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        positions = torch.arange(int(context_lens[b]))
        blocks = block_tables[b].long()[positions // block_size]
        slots = blocks * block_size + positions % block_size
        k = k_slots[slots].transpose(0, 1).repeat(group, 1, 1)   # [Hq, n, D]
        v = v_slots[slots].transpose(0, 1).repeat(group, 1, 1)
        scores = torch.einsum("hd,hnd->hn", q[b], k) / math.sqrt(head_dim)
        weights = torch.softmax(scores, dim=-1)
        out[b] = torch.einsum("hn,hnd->hd", weights, v)
    return out


# %% grade_id: paged_attention_gather | cheat: SDPA through an alias
# expect: is forbidden
import math

import torch
from torch import Tensor


def paged_attention_gather(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                           context_lens: Tensor) -> Tensor:
    attend = getattr(F, "scaled_dot_product" + "_attention")
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
        out[b] = attend(q[b][:, None], k, v)[:, 0]
    return out


# %% grade_id: paged_decode_kernel | wrong: forgets to rescale the output when the max grows
# expect: exp(m_old - m_new)
import triton
import triton.language as tl


@triton.jit
def paged_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr,
                        context_lens_ptr, n_q_heads, n_kv_heads, max_blocks, sm_scale,
                        BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
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
        o_i = o_i + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    tl.store(out_ptr + row * HEAD_DIM + dims, o_i / l_i)


# %% grade_id: paged_decode_kernel | wrong: no mask on the last block (reads past context_len)
# expect: every slot of the sequence's blocks was read
import triton
import triton.language as tl


@triton.jit
def paged_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr,
                        context_lens_ptr, n_q_heads, n_kv_heads, max_blocks, sm_scale,
                        BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
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
        slots = block * BLOCK_SIZE + offsets
        kv = (slots[:, None] * n_kv_heads + kv_head) * HEAD_DIM + dims[None, :]
        k = tl.load(k_cache_ptr + kv, )
        v = tl.load(v_cache_ptr + kv, )
        scores = tl.sum(q[None, :] * k, axis=1) * sm_scale
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        rescale = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new)
        l_i = l_i * rescale + tl.sum(p, axis=0)
        o_i = o_i * rescale + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    tl.store(out_ptr + row * HEAD_DIM + dims, o_i / l_i)


# %% grade_id: paged_decode_kernel | wrong: K/V head h % Hkv (ignores GQA grouping)
# expect: h // (Hq // Hkv)
import triton
import triton.language as tl


@triton.jit
def paged_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr,
                        context_lens_ptr, n_q_heads, n_kv_heads, max_blocks, sm_scale,
                        BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
    row = tl.program_id(0)
    batch = row // n_q_heads
    kv_head = (row % n_q_heads) % n_kv_heads
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


# %% grade_id: paged_decode_kernel | wrong: a Python loop over single keys (correct but serial)
# expect: does not step one tile of BLOCK_SIZE keys
import triton
import triton.language as tl


@triton.jit
def paged_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr,
                        context_lens_ptr, n_q_heads, n_kv_heads, max_blocks, sm_scale,
                        BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
    row = tl.program_id(0)
    batch = row // n_q_heads
    kv_head = (row % n_q_heads) // (n_q_heads // n_kv_heads)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + row * HEAD_DIM + dims)
    context_len = tl.load(context_lens_ptr + batch)
    m_i = float("-inf")
    l_i = 0.0
    o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for position in range(0, context_len):
        block = tl.load(block_tables_ptr + batch * max_blocks + position // BLOCK_SIZE).to(tl.int64)
        slot = block * BLOCK_SIZE + position % BLOCK_SIZE
        k = tl.load(k_cache_ptr + (slot * n_kv_heads + kv_head) * HEAD_DIM + dims)
        v = tl.load(v_cache_ptr + (slot * n_kv_heads + kv_head) * HEAD_DIM + dims)
        score = tl.sum(q * k, axis=0) * sm_scale
        m_new = tl.maximum(m_i, score)
        rescale = tl.exp(m_i - m_new)
        p = tl.exp(score - m_new)
        l_i = l_i * rescale + p
        o_i = o_i * rescale + p * v
        m_i = m_new
    tl.store(out_ptr + row * HEAD_DIM + dims, o_i / l_i)


# %% grade_id: paged_decode_kernel | cheat: a loop over single keys dressed up with BLOCK_SIZE
# expect: does not step one tile of BLOCK_SIZE keys
import triton
import triton.language as tl


@triton.jit
def paged_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr,
                        context_lens_ptr, n_q_heads, n_kv_heads, max_blocks, sm_scale,
                        BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
    row = tl.program_id(0)
    batch = row // n_q_heads
    kv_head = (row % n_q_heads) // (n_q_heads // n_kv_heads)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + row * HEAD_DIM + dims)
    context_len = tl.load(context_lens_ptr + batch)
    m_i = float("-inf")
    l_i = 0.0
    o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for position in range(0, context_len + 0 * BLOCK_SIZE):
        block = tl.load(block_tables_ptr + batch * max_blocks + position // BLOCK_SIZE).to(tl.int64)
        slot = block * BLOCK_SIZE + position % BLOCK_SIZE
        k = tl.load(k_cache_ptr + (slot * n_kv_heads + kv_head) * HEAD_DIM + dims)
        v = tl.load(v_cache_ptr + (slot * n_kv_heads + kv_head) * HEAD_DIM + dims)
        score = tl.sum(q * k, axis=0) * sm_scale
        m_new = tl.maximum(m_i, score)
        rescale = tl.exp(m_i - m_new)
        p = tl.exp(score - m_new)
        l_i = l_i * rescale + p
        o_i = o_i * rescale + p * v
        m_i = m_new
    tl.store(out_ptr + row * HEAD_DIM + dims, o_i / l_i)


# %% grade_id: paged_decode_kernel | cheat: the kernel calls a Python helper that walks the stack to the launcher's tensors and answers with torch
# expect: A kernel cell is Triton code
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
