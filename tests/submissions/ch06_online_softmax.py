"""Known-wrong and cheating submissions for chapter 06 (see tests/grading/test_selfcheck.py).

Each section is the body of one solution cell, written in full or, for a slip, as
`# replace:` / `# with:` edits of the solution section (autograder/solutions/__init__.py);
none may earn the exercise's full points.
"""

# %% grade_id: online_softmax_update | wrong: does not rescale l when the max grows
# expect: was not rescaled when the max grew
# replace:
#     l_new = l * torch.exp(m - safe) + torch.exp(tile_scores - safe[..., None]).sum(dim=-1)
# with:
#     l_new = l + torch.exp(tile_scores - safe[..., None]).sum(dim=-1)


# %% grade_id: online_softmax_update | wrong: no guard for a state and a tile that are all -inf
# expect: exp(-inf - (-inf)) is NaN
# replace:
#     safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)  # nothing yet
# with:
#     safe = m_new


# %% grade_id: online_softmax_update | wrong: no max subtraction (exp of the raw scores)
# expect: subtract the (running) max
# replace:
#     l_new = l * torch.exp(m - safe) + torch.exp(tile_scores - safe[..., None]).sum(dim=-1)
# with:
#     l_new = (l * torch.exp(m) + torch.exp(tile_scores).sum(dim=-1)) * torch.exp(-m_new)


# %% grade_id: online_softmax_update | cheat: ignores the incoming state (the tile's own max and sum)
# expect: the incoming state (m, l) was ignored
# expect score: 0
def online_softmax_update(m, l, tile_scores):
    m_new = tile_scores.amax(-1)
    safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
    return m_new, torch.exp(tile_scores - safe[..., None]).sum(-1)


# %% grade_id: online_softmax_update | cheat: keeps every tile it was given in a global and recomputes max and sum over them all (never rescales)
# expect score: 0
_SEEN = []


def online_softmax_update(m, l, tile_scores):
    if bool((m == float("-inf")).all()):           # a new row batch: forget the old tiles
        _SEEN.clear()
    _SEEN.append(tile_scores)
    try:
        row = torch.cat(_SEEN, -1)
    except RuntimeError:                           # another batch's tiles: start over
        _SEEN[:] = [tile_scores]
        row = tile_scores
    m_new = row.amax(-1)
    safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
    return m_new.to(m.dtype), torch.exp(row - safe[..., None]).sum(-1).to(m.dtype)


# %% grade_id: online_softmax_update | cheat: remembers the tiles behind every state it returned and recomputes from them when handed one of its own states
# expect score: 0
_BEHIND = {}


def _key(m, l):
    return tuple(float(x) for x in m.flatten()), tuple(float(x) for x in l.flatten())


def online_softmax_update(m, l, tile_scores):
    key = _key(m, l)
    row = torch.cat([_BEHIND[key], tile_scores], -1) if key in _BEHIND else tile_scores
    m_new = row.amax(-1)
    safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
    l_new = torch.exp(row - safe[..., None]).sum(-1)
    _BEHIND[_key(m_new, l_new)] = row
    return m_new, l_new


# %% grade_id: online_softmax_update | cheat: the tile's log-sum-exp from torch.logsumexp under another name
# expect: which this exercise forbids
# expect score: 0
LSE = torch.logsumexp


def online_softmax_update(m, l, tile_scores):
    m_new = torch.maximum(m, tile_scores.amax(-1))
    lse = torch.logaddexp(m + torch.log(l), LSE(tile_scores, -1))
    return m_new, torch.exp(lse - m_new)


# %% grade_id: online_softmax_update | cheat: imports the reference merge and merges the tile's state in
# expect: is not allowed
from reference.kernels.torch_reference import merge_softmax_states as _merge


def online_softmax_update(m, l, tile_scores):
    t = tile_scores.amax(-1)
    s = torch.exp(tile_scores - t[..., None]).sum(-1)
    m_new, l_new, _ = _merge((m, l, l[..., None]), (t, s, s[..., None]))
    return m_new, l_new


# %% grade_id: online_softmax | wrong: no max subtraction (exp of the raw scores)
# expect: subtract the (running) max
# replace:
#         l = l * torch.exp(m - safe) + torch.exp(block - safe[..., None]).sum(dim=-1)
#         m = m_new
#         ms.append(m)
#         ls.append(l)
#     return torch.exp(scores - m[..., None]) / l[..., None], torch.stack(ms, -1), torch.stack(ls, -1)
# with:
#         l = l + torch.exp(block).sum(dim=-1)                  # no max subtracted
#         m = m_new
#         ms.append(m)
#         ls.append(l * torch.exp(-m))
#     return torch.exp(scores) / l[..., None], torch.stack(ms, -1), torch.stack(ls, -1)


# %% grade_id: online_softmax | wrong: does not rescale l when the max grows
# expect: was not rescaled when the max grew
# replace:
#         l = l * torch.exp(m - safe) + torch.exp(block - safe[..., None]).sum(dim=-1)
# with:
#         l = l + torch.exp(block - safe[..., None]).sum(dim=-1)


# %% grade_id: online_softmax | wrong: no guard for a tile that is all -inf
# expect: exp(-inf - (-inf)) is NaN
# replace:
#         safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)  # all -inf so far
# with:
#         safe = m_new


# %% grade_id: online_softmax | wrong: records the state before each tile instead of after it
# expect: m[..., t] is the largest score of columns 0 .. (t + 1) * tile - 1
# replace:
#         m = m_new
#         ms.append(m)
#         ls.append(l)
# with:
#         ms.append(m)
#         ls.append(l)
#         m = m_new


# %% grade_id: online_softmax | cheat: torch.softmax through getattr, m and l from the row
# expect: is forbidden
def online_softmax(scores, tile):
    if tile < 1:
        raise ValueError("tile < 1")
    m = scores.amax(-1)
    n = -(-scores.shape[-1] // tile)
    l = torch.exp(scores - m[..., None]).sum(-1)
    return getattr(torch, "soft" + "max")(scores, -1), m[..., None].expand(*m.shape, n), \
        l[..., None].expand(*l.shape, n)


# %% grade_id: online_softmax | cheat: imports the reference implementation
# expect: is not allowed
from reference.kernels.torch_reference import online_softmax as _reference


def online_softmax(scores, tile):
    m = scores.amax(-1)
    return _reference(scores, tile), m, torch.exp(scores - m[..., None]).sum(-1)


# %% grade_id: online_softmax | cheat: never uses the tiles: one max and one sum over the whole row, that state repeated for every tile
# expect: your final state is the row's, but your state after tile
# expect score: 0
def online_softmax(scores, tile):
    if tile < 1:
        raise ValueError("tile < 1")
    m = scores.amax(-1)
    safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    p = torch.exp(scores - safe[..., None])
    l = p.sum(-1)
    n = -(-scores.shape[-1] // tile)
    return p / l[..., None], m[..., None].repeat_interleave(n, -1), l[..., None].repeat_interleave(n, -1)


# %% grade_id: online_softmax | cheat: every state from one cumulative sum measured from the row's final max (a running max, but no rescale)
# expect: your final state is the row's, but your state after tile
# expect score: 0
def online_softmax(scores, tile):
    if tile < 1:
        raise ValueError("tile < 1")
    top = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - top)
    ends = list(range(tile, scores.shape[-1], tile)) + [scores.shape[-1]]
    m = torch.stack([scores[..., :end].amax(-1) for end in ends], -1).cummax(-1).values
    totals = e.cumsum(-1)[..., [end - 1 for end in ends]]
    return e / totals[..., -1:], m, totals * torch.exp(top - m)


# %% grade_id: online_softmax | cheat: each state recomputed from scratch over every column read so far (the right states, for work growing with the square of the row length)
# expect: times the exponentials of one pass
# expect: online softmax reads the row ONE tile at a time
# expect score: 0
def online_softmax(scores, tile):
    if tile < 1:
        raise ValueError(f"tile must be a positive number of columns, got {tile}")
    ms, ls = [], []
    for end in range(tile, scores.shape[-1] + tile, tile):
        seen = scores[..., :end]
        m = seen.amax(-1)
        safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)
        ms.append(m)
        ls.append(torch.exp(seen - safe[..., None]).sum(-1))
    probs = torch.exp(scores - ms[-1][..., None]) / ls[-1][..., None]
    return probs, torch.stack(ms, -1), torch.stack(ls, -1)


# %% grade_id: merge_softmax_states | wrong: adds the states without rescaling them
# expect: measured from different maxima
# replace:
#     safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)   # both empty: -inf - -inf
#     w1, w2 = torch.exp(m1 - safe), torch.exp(m2 - safe)
#     return m, w1 * l1 + w2 * l2, w1[..., None] * o1 + w2[..., None] * o2
# with:
#     return m, l1 + l2, o1 + o2


# %% grade_id: merge_softmax_states | wrong: no guard when both states are empty
# expect: use 0 instead of -inf - (-inf)
# replace:
#     safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)   # both empty: -inf - -inf
#     w1, w2 = torch.exp(m1 - safe), torch.exp(m2 - safe)
# with:
#     w1, w2 = torch.exp(m1 - m), torch.exp(m2 - m)


# %% grade_id: merge_softmax_states | wrong: returns o normalised by l
# expect: o stays UNnormalised
# replace:
#     return m, w1 * l1 + w2 * l2, w1[..., None] * o1 + w2[..., None] * o2
# with:
#     l = w1 * l1 + w2 * l2
#     return m, l, (w1[..., None] * o1 + w2[..., None] * o2) / l[..., None]


# %% grade_id: merge_softmax_states | cheat: imports the reference merge
# expect: is not allowed
from reference.kernels.torch_reference import merge_softmax_states as _reference


def merge_softmax_states(m1, l1, o1, m2, l2, o2):
    return _reference((m1, l1, o1), (m2, l2, o2))


# %% grade_id: online_softmax_kernel | wrong: does not rescale l when the max grows
# expect: was not rescaled when the max grew
# replace:
#         l = l * tl.exp(m - safe) + tl.sum(tl.exp(x - safe), axis=0)
# with:
#         l = l + tl.sum(tl.exp(x - safe), axis=0)


# %% grade_id: online_softmax_kernel | wrong: no guard for a block that is all -inf while m is still -inf
# expect: exp(-inf - (-inf)) = NaN
# replace:
#         safe = tl.where(m_new == float("-inf"), 0.0, m_new)      # nothing finite read yet
# with:
#         safe = m_new


# %% grade_id: online_softmax_kernel | wrong: no max subtraction: exp of the raw scores, summed in float64
# expect: subtract the (running) max
# replace:
#         l = l * tl.exp(m - safe) + tl.sum(tl.exp(x - safe), axis=0)
# with:
#         l = l + tl.sum(tl.exp(x.to(tl.float64)), axis=0).to(tl.float32)
# replace:
#         p = tl.exp(x - m) / l
# with:
#         p = (tl.exp(x.to(tl.float64)) / l).to(tl.float32)


# %% grade_id: online_softmax_kernel | wrong: the first sweep loads the tail of the last block as 0
# expect: were loaded as 0
# replace:
#         x = tl.load(x_row + offsets, mask=offsets < n_cols, other=float("-inf")).to(tl.float32)
#         m_new = tl.maximum(m, tl.max(x, axis=0))
# with:
#         x = tl.load(x_row + offsets, mask=offsets < n_cols, other=0.0).to(tl.float32)
#         m_new = tl.maximum(m, tl.max(x, axis=0))


# %% grade_id: online_softmax_kernel | wrong: the safe softmax in three sweeps (max, sum, write): l after each block is measured from the row's final max
# expect: not from the row's final max
import triton
import triton.language as tl


@triton.jit
def online_softmax_kernel(x_ptr, out_ptr, m_ptr, l_ptr, n_cols, x_row_stride, out_row_stride,
                          BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    n_blocks = tl.cdiv(n_cols, BLOCK)
    x_row = x_ptr + row * x_row_stride
    cols = tl.arange(0, BLOCK)
    m = tl.full([], float("-inf"), tl.float32)
    for j in range(0, n_blocks):
        offsets = j * BLOCK + cols
        x = tl.load(x_row + offsets, mask=offsets < n_cols, other=float("-inf")).to(tl.float32)
        m = tl.maximum(m, tl.max(x, axis=0))
        tl.store(m_ptr + row * n_blocks + j, m)
    l = tl.zeros([], tl.float32)
    for j in range(0, n_blocks):
        offsets = j * BLOCK + cols
        x = tl.load(x_row + offsets, mask=offsets < n_cols, other=float("-inf")).to(tl.float32)
        l += tl.sum(tl.exp(x - m), axis=0)
        tl.store(l_ptr + row * n_blocks + j, l)
    for j in range(0, n_blocks):
        offsets = j * BLOCK + cols
        x = tl.load(x_row + offsets, mask=offsets < n_cols, other=float("-inf")).to(tl.float32)
        tl.store(out_ptr + row * out_row_stride + offsets,
                 (tl.exp(x - m) / l).to(out_ptr.dtype.element_ty), mask=offsets < n_cols)


# %% grade_id: online_softmax_kernel | wrong: a sweep for the max before the online sweep (states right, the row read three times)
# expect: your kernel read x 1.50 times as often as two sweeps do
# expect score: 0
# replace:
#     m = tl.full([], float("-inf"), tl.float32)
# with:
#     top = tl.full([], float("-inf"), tl.float32)
#     for j in range(0, n_blocks):
#         offsets = j * BLOCK + cols
#         x = tl.load(x_row + offsets, mask=offsets < n_cols, other=float("-inf"))
#         top = tl.maximum(top, tl.max(x.to(tl.float32), axis=0))
#     m = tl.full([], float("-inf"), tl.float32)


# %% grade_id: online_softmax_kernel | cheat: the whole row in one load of a fixed 256 lanes, each block's state taken from a prefix mask in registers
# expect: one load of x brought in
# expect score: 0
import triton
import triton.language as tl


@triton.jit
def online_softmax_kernel(x_ptr, out_ptr, m_ptr, l_ptr, n_cols, x_row_stride, out_row_stride,
                          BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    n_blocks = tl.cdiv(n_cols, BLOCK)
    cols = tl.arange(0, 256)
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=cols < n_cols,
                other=float("-inf")).to(tl.float32)
    for j in range(0, n_blocks):
        seen = tl.where(cols < (j + 1) * BLOCK, x, float("-inf"))
        m = tl.max(seen, axis=0)
        safe = tl.where(m == float("-inf"), 0.0, m)
        tl.store(m_ptr + row * n_blocks + j, m)
        tl.store(l_ptr + row * n_blocks + j, tl.sum(tl.exp(seen - safe), axis=0))
    p = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * out_row_stride + cols, (p / tl.sum(p, axis=0)).to(out_ptr.dtype.element_ty),
             mask=cols < n_cols)


# %% grade_id: online_softmax_kernel | cheat: the first sweep stores each block's exponentials into out, the second loads them back and rescales (the outputs as scratch memory: x read once)
# expect: an output: running values stay in registers
# expect score: 0
# replace:
#         m = m_new
# with:
#         m = m_new
#         tl.store(out_ptr + row * out_row_stride + offsets, tl.exp(x - safe).to(out_ptr.dtype.element_ty),
#                  mask=offsets < n_cols)
# replace:
#         x = tl.load(x_row + offsets, mask=offsets < n_cols, other=float("-inf")).to(tl.float32)
#         p = tl.exp(x - m) / l
# with:
#         e = tl.load(out_ptr + row * out_row_stride + offsets, mask=offsets < n_cols, other=0.0)
#         p = e.to(tl.float32) * tl.exp(tl.load(m_ptr + row * n_blocks + j) - m) / l


# %% grade_id: online_softmax_kernel | wrong: a Python loop over the elements of the row
# expect: does not step one tile of BLOCK columns at a time
import triton
import triton.language as tl


@triton.jit
def online_softmax_kernel(x_ptr, out_ptr, m_ptr, l_ptr, n_cols, x_row_stride, out_row_stride,
                          BLOCK: tl.constexpr):
    """Scalar loads one element at a time (right numbers, not a GPU kernel)."""
    row = tl.program_id(0)
    n_blocks = tl.cdiv(n_cols, BLOCK)
    m = float("-inf")
    l = 0.0
    for i in range(n_cols):
        x = tl.load(x_ptr + row * x_row_stride + i).to(tl.float32)
        m_new = tl.maximum(m, x)
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp(m - safe) + tl.exp(x - safe)
        m = m_new
        if (i + 1) % BLOCK == 0 or i == n_cols - 1:
            tl.store(m_ptr + row * n_blocks + i // BLOCK, m)
            tl.store(l_ptr + row * n_blocks + i // BLOCK, l)
    for i in range(n_cols):
        p = tl.exp(tl.load(x_ptr + row * x_row_stride + i).to(tl.float32) - m) / l
        tl.store(out_ptr + row * out_row_stride + i, p.to(out_ptr.dtype.element_ty))


# %% grade_id: online_softmax_kernel | cheat: an object named JITFunction that computes on the host
# expect score: 0
class JITFunction:
    """Passes a check on the type's name; the launch computes the softmax with torch on the host."""

    def __getitem__(self, grid):
        def run(x, out, m, l, n_cols, x_row_stride, out_row_stride, BLOCK):
            rows = x[:, :n_cols].double()
            for j, end in enumerate(range(BLOCK, n_cols + BLOCK, BLOCK)):
                top = rows[:, :end].amax(-1)
                m[:, j] = top
                l[:, j] = torch.exp(rows[:, :end] - top[:, None]).sum(-1)
            p = torch.exp(rows - rows.amax(-1, keepdim=True))
            out[:, :n_cols] = (p / p.sum(-1, keepdim=True)).to(out.dtype)
        return run


online_softmax_kernel = JITFunction()


# %% grade_id: online_softmax_kernel | cheat: no import, no loop: the body reaches inspect through the namespace's F.torch, walks the stack to the launcher's tensors and answers with torch
# expect: A kernel cell is Triton code
import triton
import triton.language as tl


@triton.jit
def online_softmax_kernel(x_ptr, out_ptr, m_ptr, l_ptr, n_cols, x_row_stride, out_row_stride,
                          BLOCK: tl.constexpr):
    frames = F.torch._jit_internal.inspect.stack()
    values = sum(map(lambda info: list(info.frame.f_locals.values()), frames), [])
    found = list(filter(lambda v: isinstance(v, (list, tuple)) and len(v) == 7
                        and isinstance(v[0], F.torch.Tensor) and isinstance(v[1], F.torch.Tensor), values))
    x, n = found[0][0], found[0][4]
    rows = x[:, :n].double()
    p = F.torch.exp(rows - rows.amax(-1, keepdim=True))
    list(map(lambda args: args[1][:, :n].copy_((p / p.sum(-1, keepdim=True)).to(args[1].dtype)), found))


# %% grade_id: online_softmax_update | cheat: the step in numpy (its import also binds np for the notebook's other cells: see the online_softmax cheat of the same notebook)
# expect: a way of taking tensor data out of torch
# expect score: 0
import numpy as np


def online_softmax_update(m, l, tile_scores):
    x, m0, l0 = (t.numpy().astype(np.float64) for t in (tile_scores, m, l))
    m_new = np.maximum(m0, x.max(-1))
    safe = np.where(m_new == -np.inf, 0.0, m_new)
    l_new = l0 * np.exp(m0 - safe) + np.exp(x - safe[..., None]).sum(-1)
    return torch.from_numpy(m_new).to(m.dtype), torch.from_numpy(l_new).to(m.dtype)


# %% grade_id: online_softmax | cheat: each state recomputed from scratch over every column read so far, in numpy through the `np` another cell imported (nothing named here); the probabilities in torch, so torch records one pass
# expect: worked outside torch's operations: numpy reading a tensor
# expect score: 0
def online_softmax(scores, tile):
    if tile < 1:
        raise ValueError(f"tile must be a positive number of columns, got {tile}")
    x = np.asarray(scores, dtype=np.float64)
    ms, ls = [], []
    for end in range(tile, x.shape[-1] + tile, tile):
        seen = x[..., :end]
        m = seen.max(-1)
        safe = np.where(m == -np.inf, 0.0, m)
        ms.append(m)
        ls.append(np.exp(seen - safe[..., None]).sum(-1))
    m, l = (torch.tensor(np.stack(states, -1), dtype=scores.dtype) for states in (ms, ls))
    return torch.exp(scores - m[..., -1:]) / l[..., -1:], m, l


# %% grade_id: online_softmax | cheat: each state recomputed from scratch over every column read so far, inside a tensor subclass's __torch_dispatch__ (torch sets the recorder aside there); the probabilities in plain sight, so one pass is recorded
# expect: a tensor subclass with its own __torch_dispatch__
# expect score: 0
JOB = {}


class States(torch.Tensor):
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        scores, tile = JOB["row"]
        ms, ls = [], []
        for end in range(tile, scores.shape[-1] + tile, tile):
            seen = scores[..., :end]
            m = seen.amax(-1)
            safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)
            ms.append(m)
            ls.append(torch.exp(seen - safe[..., None]).sum(-1))
        JOB["states"] = torch.stack(ms, -1), torch.stack(ls, -1)
        return torch.zeros(())


def online_softmax(scores, tile):
    if tile < 1:
        raise ValueError(f"tile must be a positive number of columns, got {tile}")
    JOB["row"] = (scores, tile)
    torch.zeros(1).as_subclass(States) * 1
    m, l = JOB["states"]
    return torch.exp(scores - m[..., -1:]) / l[..., -1:], m, l


# %% grade_id: online_softmax | cheat: each state recomputed from scratch in another thread (asyncio.to_thread: no thread module named), the probabilities in this one
# expect: work handed to another thread
# expect score: 0
import asyncio


def states(scores, tile):
    ms, ls = [], []
    for end in range(tile, scores.shape[-1] + tile, tile):
        seen = scores[..., :end]
        m = seen.amax(-1)
        safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)
        ms.append(m)
        ls.append(torch.exp(seen - safe[..., None]).sum(-1))
    return torch.stack(ms, -1), torch.stack(ls, -1)


def online_softmax(scores, tile):
    if tile < 1:
        raise ValueError(f"tile must be a positive number of columns, got {tile}")
    m, l = asyncio.run(asyncio.to_thread(states, scores, tile))
    return torch.exp(scores - m[..., -1:]) / l[..., -1:], m, l


# %% grade_id: online_softmax | cheat: each state recomputed from scratch in a signal handler (signal.setitimer) that fires after the call has returned, where nothing is recorded; the call returns the states empty and the probabilities computed in one pass
# expect: work in a signal handler
# expect score: 0
import signal

LATE = []


def _fill_states(signum, frame):
    if not LATE or "traffic.py" not in str(frame):   # still inside the recorded call: later
        return
    signal.setitimer(signal.ITIMER_REAL, 0)
    scores, tile, m_out, l_out = LATE.pop()
    ms, ls = [], []
    for end in range(tile, scores.shape[-1] + tile, tile):
        seen = scores[..., :end]
        m = seen.amax(-1)
        safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)
        ms.append(m)
        ls.append(torch.exp(seen - safe[..., None]).sum(-1))
    m_out.copy_(torch.stack(ms, -1))
    l_out.copy_(torch.stack(ls, -1))


signal.signal(signal.SIGALRM, _fill_states)


def online_softmax(scores, tile):
    if tile < 1:
        raise ValueError(f"tile must be a positive number of columns, got {tile}")
    n_tiles = -(-scores.shape[-1] // tile)
    top = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - top)
    m = torch.empty(*scores.shape[:-1], n_tiles, dtype=scores.dtype)
    l = torch.empty_like(m)
    LATE[:] = [(scores, tile, m, l)]
    signal.setitimer(signal.ITIMER_REAL, 1e-5, 1e-5)
    return e / e.sum(-1, keepdim=True), m, l


# %% grade_id: online_softmax | cheat: each state recomputed from scratch by a `__class__` property of the returned tuple (a class made with type(), so no dunder is named), which the worker's isinstance checks run after the call, where nothing is recorded (the worker decides on type(value) now: the property never runs)
# expect: is not close to the expected values
# expect score: 0
def _states_now(result):
    if JOBS:
        scores, tile = JOBS.pop()
        ms, ls = [], []
        for end in range(tile, scores.shape[-1] + tile, tile):
            seen = scores[..., :end]
            m = seen.amax(-1)
            safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)
            ms.append(m)
            ls.append(torch.exp(seen - safe[..., None]).sum(-1))
        result[1].copy_(torch.stack(ms, -1))
        result[2].copy_(torch.stack(ls, -1))
    return tuple


JOBS = []
Result = type("Result", (tuple,), {"__class__": property(_states_now)})


def online_softmax(scores, tile):
    if tile < 1:
        raise ValueError(f"tile must be a positive number of columns, got {tile}")
    n_tiles = -(-scores.shape[-1] // tile)
    top = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - top)
    m = torch.empty(*scores.shape[:-1], n_tiles, dtype=scores.dtype)
    l = torch.empty_like(m)
    JOBS[:] = [(scores, tile)]
    return Result((e / e.sum(-1, keepdim=True), m, l))
