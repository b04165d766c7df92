"""Grader for exercises/ch05_flash_attention.ipynb.

Expected values come from ``reference.kernels.torch_reference`` (plain attention in float64) and
``reference.kernels.flash_attention.hbm_bytes``, computed here on inputs drawn from
``torch.Generator().manual_seed(seed)``. Wrong answers are compared with what the usual slips
produce (mask off by one, queries not aligned to the end, tail tile dropped, wrong K/V head) to
name the slip. The kernel runs in the learner's process under ``TRITON_INTERPRET=1``; the grader
owns its launcher, poisons every output and the spare rows and heads of its input buffers with NaN.
The grader owns the key loop of ``attend_tile``: one key tile per call, from states of keys the
learner never sees and states the grader picks, on interleaved problems, (acc, m, l) checked
after every tile. Tiled means tiled, a prerequisite (``PrerequisiteFailed``: without it the exercise scores 0):
``tiled_attention`` is graded under a memory limit of its own (``TILED_MEMORY_MB``) and, last,
on a float32 case, one query tile of all rows and 128-key tiles, whose whole score matrix is 5%
larger than that limit, so neither the whole matrix nor a query tile's whole rows of scores fit
and only a tiled computation finishes (the smaller cases check the largest allocation instead); softmax and the one-line normalisers
(logsumexp, logcumsumexp, log_softmax, softmin, SDPA, flex_attention) are forbidden.
One pass means one pass, a prerequisite too: on every call of ``attend_tile`` and
``tiled_attention`` the work the sandbox recorded (``learner.last_call_work``: matmul FLOPs, the
FLOPs of every elementwise product of two tensors however its factors were made, exponentials)
must stay within ``WORK_SLACK`` of one pass's, whose baseline allows the elementwise products of
its rescales and final normalisation (a max pass then a sum pass, or scores recomputed, do 1.5
times the products, written as matmuls or as copied factors multiplied and summed), and must
record at least ``WORK_FLOOR`` of the products and exponentials of its visible scores, reading
no more values one at a time (``float(t)``) than a row and a tile each (what it does not record
was computed outside torch). ``score_tile_kernel``, the first kernel, computes one
[BLOCK_M, BLOCK_N] tile of scores and its row max and sum of exponentials per program, launched
on fresh lengths with ragged edges, NaN-poisoned spare rows and columns, every entry checked.
Each kernel cell must be Triton code (``autograder.rules.kernel_rules``) with a reachable
``tl.dot``; the score tile has no loop and tiles sized by its constexprs, the flash kernel (its
plumbing given in the stub) a loop stepping whole key tiles, and its loads and stores, counted by
the interpreter, must be flash attention's: each program reads its query tile once and each key
tile it needs once (causal: the tiles past its last visible key not at all), one tile per load,
and stores out and lse once, never reading them back (no score matrix in memory).
"""
from __future__ import annotations

import ast
import math

import pytest
import torch

from autograder.boundary.causes import LearnerError
from autograder.rules.feedback import PrerequisiteFailed
from autograder.rules.feedback import assert_close, assert_equal
from autograder.rules.forbid import SOFTMAX_FAMILY
from autograder.rules.gpu_targets import Build, planned, require_gpu_build
from autograder.rules.inputs import climbing_scores, generator, large_rows, randint
from autograder.rules.kernel_rules import (
    cell_problem,
    fixed_size_aranges,
    kernel_source,
    key_loops,
    loop_problem,
    reachable_calls,
    require_traffic,
)
from autograder.rules.operations import require_one_pass
from autograder.rules.plugin import exercise
from reference.kernels.flash_attention import hbm_bytes
from reference.kernels.torch_reference import causal_mask

SOFTMAX_FORBIDDEN = [*SOFTMAX_FAMILY,  # and attention itself
    "torch.nn.functional.scaled_dot_product_attention",
    "torch.nn.attention.flex_attention.flex_attention"]


def _attention64(q, k, v, visible=None):
    """(out, lse) of softmax(q k^T / sqrt(D)) v in float64; ``visible`` [Nq, Nk] bool or None."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


def _causal_slips(n_q: int, n_k: int) -> dict[str, torch.Tensor]:
    """Masks the usual causal slips produce, by the advice that fixes them."""
    rows = torch.arange(n_q)[:, None]
    cols = torch.arange(n_k)[None, :]
    slips = {"the causal diagonal is off by one: query i sees key j when j <= i + (Nk - Nq), "
             "the diagonal included (use <=, not <)": cols < rows + (n_k - n_q)}
    if n_q < n_k:
        slips["the Nq queries are the LAST Nq positions: query i sees keys j <= i + (Nk - Nq), "
              "not only j <= i"] = cols <= rows
    return slips


def _name_slip(got, slips: dict[str, torch.Tensor]) -> str | None:
    """The advice of the first slip whose output equals ``got`` (NaN where it has NaN)."""
    if not isinstance(got, torch.Tensor):
        return None
    for advice, expected in slips.items():
        if got.shape == expected.shape and torch.allclose(got.double(), expected, rtol=1e-3,
                                                          atol=1e-4, equal_nan=True):
            return advice
    return None


# ----------------------------------------------------------------------------- attend_tile

NO_ROW_YET = ("a row that has seen no visible key yet has m = -inf, and exp(-inf - (-inf)) is "
              "NaN: use 0 in place of an m_new that is still -inf (the state stays (0, -inf, 0))")
ONE_STEP = ("attend_tile folds in this one tile: its scores computed once (q kᵀ), exponentiated "
            "once and multiplied into v once, while (acc, m, l) stands for every key before it. "
            "The tile's scores computed a second time (one pass for the max, another for the "
            "exponentials), by a matmul or by products summed by hand, cost half as much again, "
            "and keys of earlier tiles computed again make each step cost as much as the whole "
            "loop so far")
TILE_IGNORED_STATE = ("the incoming state (acc, m, l) was ignored: fold the tile INTO it. The "
                      "grader passes states of keys you never see, so the state is all there is "
                      "of them")


def _exact(gen, *shape) -> torch.Tensor:
    """N(0, 1) rounded to multiples of 1/16: with the scale a power of two, every score of
    these is exact in float32, so the grader's float64 maxima are the learner's."""
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * 16).round() / 16


def _state64(q, k, v, visible, scale):
    """(acc, m, l) of each query row over the keys k, v where ``visible``, in float64."""
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(-1) if s.shape[-1] else s.new_full(s.shape[:-1], float("-inf"))
    safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    p = torch.exp(s - safe[..., None])
    return p @ v.double(), m, p.sum(-1)


class _KeyStream:
    """One attention problem the grader feeds to attend_tile key tile by key tile: ``hidden``
    keys first (the learner gets only their state), then tiles of widths drawn per step.
    Query row 0 sees none of the hidden keys nor the first tile (its state is empty when an
    all-hidden tile arrives: the guard); query row 1's scores climb by 128 per key, from below
    -1000 to above 1000 (exp of a raw score overflows and underflows in float64 too, ~709 and
    ~-745, and the max grows in every tile by more than exp's range: no shift but the running
    max keeps the sums finite); the other rows see keys under a causal-like mask with random
    holes."""

    def __init__(self, gen, dtype):
        self.dtype = dtype
        lead = [(randint(gen, 1, 3),), (randint(gen, 1, 2), randint(gen, 1, 2))][randint(gen, 0, 1)]
        n_q, dim = randint(gen, 2, 6), [4, 8, 16][randint(gen, 0, 2)]
        self.scale = [0.5, 0.25, 0.125][randint(gen, 0, 2)]
        self.n_hidden, n_k = randint(gen, 1, 6), randint(gen, 16, 36)
        widths = []
        while sum(widths) < n_k:
            widths.append(min(randint(gen, 1, 14), n_k - sum(widths)))
        self.widths = widths
        total = self.n_hidden + n_k
        self.q = _exact(gen, *lead, n_q, dim)
        self.k = _exact(gen, *lead, total, dim)
        self.v = torch.randn(*lead, total, dim, generator=gen, dtype=torch.float64)
        self.q[..., 1, :] = 0.0
        self.q[..., 1, 0] = 256.0 / self.scale             # scores of row 1: 128 * (j - total // 2)
        self.k[..., 0] = (torch.arange(total, dtype=torch.float64) - total // 2) / 2
        rows = torch.arange(n_q)[:, None]
        cols = torch.arange(total)[None, :]
        self.visible = (cols <= rows * 3 + self.n_hidden + randint(gen, 0, 8)) \
            & (torch.rand(n_q, total, generator=gen) < 0.85)
        self.visible[0] = cols[0] >= self.n_hidden + widths[0]
        self.visible[0, -1] = True
        self.visible[1] = True
        self.q, self.k, self.v = (t.to(dtype) for t in (self.q, self.k, self.v))
        self.start = self._state(self.n_hidden)

    def _state(self, end, begin=0):
        cut = slice(begin, end)
        return _state64(self.q, self.k[..., cut, :], self.v[..., cut, :], self.visible[:, cut],
                        self.scale)

    def bounds(self, t):
        start = self.n_hidden + sum(self.widths[:t])
        return start, start + self.widths[t]

    def state(self, t, begin=0):
        """The float64 state after the hidden keys (from ``begin``) and the first t tiles."""
        return self._state(self.n_hidden + sum(self.widths[:t]), begin)

    def cast(self, state):
        return tuple(x.to(self.dtype) for x in state)

    def describe(self):
        return (f"q {list(self.q.shape)}, {self.n_hidden} hidden keys, key tiles "
                f"{self.widths}, scale {self.scale}, {str(self.dtype)[6:]}")


def _step64(state, q, k, v, visible, scale, *, rescale_acc=True, rescale_l=True):
    """One attend_tile step in float64 from ``state``, optionally with a usual slip."""
    acc, m, l = (x.double() for x in state)
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    s = s.masked_fill(~visible, float("-inf"))
    m_new = torch.maximum(m, s.amax(-1))
    safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
    alpha = torch.exp(m - safe)
    p = torch.exp(s - safe[..., None])
    return ((acc * alpha[..., None] if rescale_acc else acc) + p @ v.double(), m_new,
            (l * alpha if rescale_l else l) + p.sum(-1))


def _attend_slip(stream, state_in, t, got, expected) -> str | None:
    """The advice of the usual slip of one attend_tile step that ``got`` matches."""
    if not (isinstance(got, (tuple, list)) and len(got) == 3
            and all(isinstance(x, torch.Tensor) and x.shape == e.shape for x, e in zip(got, expected))):
        return None
    got = tuple(x.double() for x in got)
    a, b = stream.bounds(t)
    q, k, v, seen = stream.q, stream.k[..., a:b, :], stream.v[..., a:b, :], stream.visible[:, a:b]
    bad = got[0].isnan().any(-1) | got[0].isinf().any(-1) | got[1].isnan() | got[2].isnan() \
        | got[2].isinf()
    if bad.any():
        empty = (state_in[1] == float("-inf")) & ~seen.any(-1)
        return NO_ROW_YET if bool(empty[bad].all()) else (
            "inf/NaN: subtract the running max before exp (exp of a score in the hundreds "
            "overflows, in the thousands in float64 too), and rescale l and acc by "
            "exp(m_old - m_new) when the max grows")
    empty = tuple(x.new_zeros(x.shape) for x in state_in)
    empty[1].fill_(float("-inf"))
    slips = {RESCALE_SLIPS["l"]: _step64(state_in, q, k, v, seen, stream.scale, rescale_acc=False),
             RESCALE_SLIPS[""]: _step64(state_in, q, k, v, seen, stream.scale, rescale_acc=False,
                                        rescale_l=False),
             TILE_IGNORED_STATE: _step64(empty, q, k, v, seen, stream.scale),
             "multiply the scores q k^T by scale (once)": _step64(state_in, q, k, v, seen, 1.0)}
    close = lambda xs, ys: all(torch.allclose(x, y, rtol=1e-4, atol=1e-5, equal_nan=True)
                               for x, y in zip(xs, ys))
    for advice, candidate in slips.items():
        if close(got, candidate) and not close(candidate, expected):
            return advice
    return None


def _check_attend(learner, stream, state_in, t, expected, how):
    a, b = stream.bounds(t)
    got = learner.call("attend_tile", *state_in, stream.q, stream.k[..., a:b, :],
                       stream.v[..., a:b, :], stream.scale, stream.visible[:, a:b])
    call = (f"attend_tile on key tile {t + 1} (keys {a}..{b - 1}) of {stream.describe()}, {how}")
    rows, dim = stream.q.numel() // stream.q.shape[-1], stream.q.shape[-1]
    visible = int(stream.visible[:, a:b].sum()) * (rows // stream.q.shape[-2])
    require_one_pass(learner, call, matmul_flops=4 * rows * (b - a) * dim,
                     elementwise_products=rows * (dim + 1), exp_elements=rows * (b - a + 1),
                     exp_rescales=rows, visible_scores=visible, head_dim=dim, reads=rows + 1,
                     why=ONE_STEP,
                     rule="one step: the tile's scores computed and exponentiated once")
    if not (isinstance(got, (tuple, list)) and len(got) == 3):
        raise AssertionError(f"{call}: returned {type(got).__name__}; return (acc, m, l)")
    hint = _attend_slip(stream, state_in, t, got, expected)
    for name, value, exp in zip(("acc", "m", "l"), got, expected):
        assert_close(value, exp, name=f"{name} after {call}", rtol=1e-5, atol=1e-5, hint=hint)
        if value.dtype != stream.dtype:
            raise AssertionError(f"{name} after {call} has dtype {value.dtype}; keep the state in "
                                 f"the dtype it came in ({stream.dtype})")
    return tuple(got)


def _interleave(gen, streams):
    """(stream, tile index) pairs alternating between the streams in a random order."""
    next_tile, order = [0] * len(streams), []
    while any(n < len(s.widths) for n, s in zip(next_tile, streams)):
        ready = [i for i, s in enumerate(streams) if next_tile[i] < len(s.widths)]
        i = ready[randint(gen, 0, len(ready) - 1)]
        order.append((i, next_tile[i]))
        next_tile[i] += 1
    return order


@exercise("attend_tile", points=2, forbid=SOFTMAX_FORBIDDEN)
def test_attend_tile_driven_key_tile_by_key_tile(learner, seed):
    """The grader owns the key loop: three attention problems of fresh sizes, each starting
    from the state of keys the learner never sees, fed one key tile per call (widths drawn per
    step) in an interleaved order, each call from the learner's own previous state; (acc, m, l)
    after every tile is compared with float64 over every key before it."""
    gen = generator(seed + 5)
    streams = [_KeyStream(gen, dtype) for dtype in (torch.float32, torch.float64, torch.float32)]
    states = [s.cast(s.start) for s in streams]
    for i, t in _interleave(gen, streams):
        s = streams[i]
        states[i] = _check_attend(learner, s, states[i], t, s.state(t + 1),
                                  "fed after your own state of the keys before")


@exercise("attend_tile", points=2, forbid=SOFTMAX_FORBIDDEN)
def test_attend_tile_from_states_the_grader_picks(learner, seed):
    """Every call starts from a state the grader computed, now and then over a different set
    of earlier keys: the step may rely on nothing but the state and the tile."""
    gen = generator(seed + 6)
    streams = [_KeyStream(gen, dtype) for dtype in (torch.float32, torch.float32, torch.float64)]
    begin = [0] * len(streams)
    for i, t in _interleave(gen, streams):
        s = streams[i]
        if t and randint(gen, 0, 2) == 0:
            begin[i] = randint(gen, 0, s.n_hidden - 1)      # forget some of the earliest keys
        _check_attend(learner, s, s.cast(s.state(t, begin[i])), t, s.state(t + 1, begin[i]),
                      "fed after a state the grader picked")


# ------------------------------------------------------------------------- tiled_attention

RESCALE_SLIPS = {  # what is rescaled by exp(m_old - m_new) -> the advice when that is the slip
    "l": "when a key tile raises a row's max from m_old to m_new, multiply acc (as well as l) by "
         "exp(m_old - m_new) before adding the tile's terms",
    "": "when a key tile raises a row's max from m_old to m_new, multiply l and acc by "
        "exp(m_old - m_new) before adding the tile's terms: both were summed with the old max",
}


def _without_rescale(q, k, v, block_k: int, visible, rescaled: str) -> torch.Tensor:
    """The running softmax over key tiles of ``block_k`` in float64 with the slip of not
    rescaling acc (``rescaled="l"``: l is) or either sum (``rescaled=""``)."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    m = scores.new_full(scores.shape[:-1], float("-inf"))
    total, acc = torch.zeros_like(m), torch.zeros_like(q)
    for j in range(0, k.shape[-2], block_k):
        tile = scores[..., j:j + block_k]
        m_new = torch.maximum(m, tile.amax(-1))
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(tile - safe[..., None])
        total = total * (torch.exp(m - safe) if "l" in rescaled else 1) + p.sum(-1)
        acc, m = acc + p @ v[..., j:j + block_k, :], m_new
    return acc / total[..., None]


def _check_tiled(learner, q, k, v, block_q, block_k, causal, what):
    n_q, n_k = q.shape[2], k.shape[2]
    visible = causal_mask(n_q, n_k) if causal else None
    expected, expected_lse = _attention64(q, k, v, visible)
    call = (f"tiled_attention(q {list(q.shape)}, k/v {list(k.shape)}, block_q={block_q}, "
            f"block_k={block_k}, causal={causal}) {what}")
    result = learner.call("tiled_attention", q, k, v, block_q, block_k, causal=causal)
    _require_tile_sized_peak(learner, q, n_k, block_q, block_k, call)
    _require_one_pass_over_keys(learner, q, n_k, block_k, call, visible, block_q)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError(f"{call} returned {type(result).__name__}; return the pair (out, lse)")
    out, lse = result
    slips = {advice: _attention64(q, k, v, mask)[0] for advice, mask in
             (_causal_slips(n_q, n_k) if causal else {}).items()}
    slips["divide the scores by sqrt(D) (once)"] = _attention64(q / math.sqrt(q.shape[-1]), k, v, visible)[0]
    for rescaled, advice in RESCALE_SLIPS.items():
        slips[advice] = _without_rescale(q, k, v, block_k, visible, rescaled)
    hint = _name_slip(out, slips)
    if hint is None and isinstance(out, torch.Tensor) and not torch.isfinite(out).all():
        hint = ("inf/NaN in the output: subtract the running max before exp (exp of scores in the "
                "hundreds overflows, in the thousands in float64 too), and rescale l and acc by "
                "exp(m_old - m_new) when the max grows")
    assert_close(out, expected.to(q.dtype), name=f"out of {call}", rtol=2e-4, atol=2e-5, hint=hint)
    assert_close(lse, expected_lse.to(q.dtype), name=f"lse of {call}", rtol=2e-4, atol=2e-5,
                 hint="lse = m + log(l) with the final running max m and sum l of each row, in "
                      "the same units as the scores (after the 1/sqrt(D) scale)")


def _require_tile_sized_peak(learner, q, n_k, block_q, block_k, call):
    """Bounded memory on every size, not only on the large case a cell could recognise: the
    largest tensor the call's operations allocated (recorded by the sandbox's operation limit,
    ``learner.largest_allocation``) must not be a whole [Nq, Nk] score matrix where that is
    larger than what tiling needs (a tile of scores, the output, lse; in float64, twice over)."""
    batch, heads, n_q, dim = q.shape
    peak = getattr(learner, "largest_allocation", 0)
    needed = 16 * batch * heads * max(n_q * dim, block_q * block_k, block_q * dim, n_q)
    whole = 4 * batch * heads * n_q * n_k
    if peak >= whole > needed:
        raise PrerequisiteFailed(
            f"{call} allocated a tensor of {peak} bytes, the size of the whole [Nq, Nk] score "
            f"matrix ({whole} bytes in float32), where one [block_q, block_k] tile of scores, "
            f"the running state and the output need at most {needed}: work tile by tile on "
            "every input, small ones too",
            rule="the whole score matrix is not allowed; work tile by tile")


ONE_PASS = ("Flash attention is ONE pass over the keys: each key tile's scores are computed "
            "once (q kᵀ), exponentiated once and multiplied into v once, and when a tile raises "
            "a row's max the sums so far are rescaled by exp(m_old - m_new). A first pass for "
            "the max and a second for the sums (or scores computed again) gives the same numbers "
            "for 1.5 times the products, whether they are written as matmuls, broadcast products "
            "or factors copied to full size, multiplied and summed, and a kernel written that way "
            "reads K twice")


def _require_one_pass_over_keys(learner, q, n_k, block_k, call, visible=None, block_q=None):
    """One pass, on every case: the call's products (matmuls, broadcast products and every
    elementwise product of two tensors) within ``WORK_SLACK`` of q kᵀ and p v once each
    (4 Nq Nk D FLOPs per head; a causal call may skip masked tiles) plus the elementwise
    products one pass may do: per row and key tile acc * alpha (D) and l * alpha (1), and as
    many again where the output is kept normalised after every tile (FlashAttention 1's
    O = (l alpha O + p v) / l_new), per row the final acc / l (D); its exponentials of each
    score once plus a rescale factor per row and key tile. And at least ``WORK_FLOOR`` of the
    products and exponentials of the scores ``visible`` ([Nq, Nk] bool, None: all), however
    many tiles a causal call skips, with at most a value per row and per (query tile, key tile)
    read out as a Python number: work not recorded was done outside torch."""
    batch, heads, n_q, dim = q.shape
    rows = batch * heads * n_q
    pairs, row_tiles = rows * n_k, rows * -(-n_k // block_k)
    seen = pairs if visible is None else batch * heads * int(visible.sum())
    tiles = batch * heads * -(-n_q // (block_q or n_q)) * -(-n_k // block_k)
    require_one_pass(learner, call, matmul_flops=4 * pairs * dim,
                     elementwise_products=2 * row_tiles * (dim + 1) + rows * dim,
                     exp_elements=pairs + row_tiles, exp_rescales=row_tiles,
                     visible_scores=seen, head_dim=dim, reads=rows + tiles, why=ONE_PASS,
                     rule="one pass over the keys: every score computed and exponentiated once")


def _tiled_case(gen, causal, magnitude=1.0):
    batch, heads, dim = randint(gen, 1, 2), randint(gen, 1, 3), [8, 16, 32][randint(gen, 0, 2)]
    n_k = randint(gen, 1, 70)
    n_q = randint(gen, 1, n_k) if causal else randint(gen, 1, 70)
    q, k, v = (torch.randn(batch, heads, n, dim, generator=gen, dtype=torch.float64).float()
               for n in (n_q, n_k, n_k))
    return q * magnitude, k, v, randint(gen, 3, 20), randint(gen, 3, 20)


LARGE_KEYS = 32768     # keys of the case too large to hold as one score matrix
LARGE_BLOCK_K = 128    # its key tiles (the fastest tested); its query tile is all of its queries
CHECKED_ROWS = 48      # query rows of that case compared with float64 attention
TILED_MEMORY_MB = 2048  # the sandbox's memory limit (MB) while tiled_attention is graded


def _large_case_queries(learner) -> int:
    """Query rows of the large case: enough that its [Nq, Nk] score matrix exceeds the sandbox's
    memory limit by 5% in float32 (the case's dtype; and twice that in float64), so only a tiled
    computation finishes, whatever the worker already uses; 64 where the learner runs without a
    limit (``check()`` in a notebook)."""
    memory_mb = getattr(learner, "memory_limit_mb", None)
    if not memory_mb:
        return 64
    return int(memory_mb * 2**20 * 1.05 / (4 * LARGE_KEYS)) + 1


@exercise("tiled_attention", points=3, forbid=SOFTMAX_FORBIDDEN, timeout=60,
          memory_mb=TILED_MEMORY_MB)
def test_tiled_attention_matches_attention(learner, seed):
    gen = generator(seed)
    for _ in range(4):
        _check_tiled(learner, *_tiled_case(gen, causal=False), causal=False, what="")
    q, k, v, _, _ = _tiled_case(gen, causal=False)
    _check_tiled(learner, q, k, v, q.shape[2] + 5, 1, causal=False, what="(one query tile, 1-key tiles)")
    q, k, v = (torch.randn(1, 1, n, 8, generator=gen, dtype=torch.float64).float()
               for n in (randint(gen, 40, 56), 64, 64))
    _check_tiled(learner, q, k, v, 8, 8, causal=False, what="(many short keys)")


@exercise("tiled_attention", points=3, forbid=SOFTMAX_FORBIDDEN, timeout=60,
          memory_mb=TILED_MEMORY_MB)
def test_tiled_attention_causal(learner, seed):
    gen = generator(seed + 1)
    for _ in range(4):
        _check_tiled(learner, *_tiled_case(gen, causal=True), causal=True, what="")
    q, k, v = (torch.randn(1, 2, n, 16, generator=gen, dtype=torch.float64).float() for n in (1, 37, 37))
    _check_tiled(learner, q, k, v, 4, 8, causal=True, what="(one decode query)")


def _large_scores_case(gen, causal):
    """(q, k, v, block_q, block_k) with D = 16 whose scores sit near +-1000 per row (an offset
    drawn per row) and climb or fall by 32 per key (a direction drawn per row): see
    ``climbing_scores``. Only the running max keeps the sums finite."""
    batch, heads, dim = randint(gen, 1, 2), randint(gen, 1, 2), 16
    n_k = randint(gen, 48, 70)
    n_q = randint(gen, 1, n_k) if causal else randint(gen, 1, 70)
    q, k, v = (torch.randn(batch, heads, n, dim, generator=gen, dtype=torch.float64)
               for n in (n_q, n_k, n_k))
    rows = (batch, heads, n_q)
    offsets, directions = large_rows(gen, rows)
    q, k = climbing_scores(q, k, torch.arange(n_k), offsets, directions)
    return q, k, v.float(), randint(gen, 3, 20), randint(gen, 3, 20)


@exercise("tiled_attention", points=3, forbid=SOFTMAX_FORBIDDEN, timeout=60,
          memory_mb=TILED_MEMORY_MB)
def test_tiled_attention_large_scores(learner, seed):
    gen = generator(seed + 2)
    for causal in (False, True):
        q, k, v, bq, bk = _large_scores_case(gen, causal=causal)
        _check_tiled(learner, q, k, v, bq, bk, causal=causal,
                     what="with scores in the thousands (exp overflows above ~88 in float32, "
                          "~709 in float64)")


@exercise("tiled_attention", points=3, forbid=SOFTMAX_FORBIDDEN, timeout=60,
          memory_mb=TILED_MEMORY_MB, costly=True)
def test_tiled_attention_never_holds_the_whole_score_matrix(learner, seed):
    """The prerequisite of the exercise (``PrerequisiteFailed``: every test scores 0 without it):
    one query tile of all Nq rows and key tiles of 128, float32, where the whole [Nq, Nk] score
    matrix, in float32 or float64, does not fit in the memory limit, and neither does one query
    tile's whole rows of scores; the [Nq, 128] tiles do. The slowest test of the exercise (half
    a billion scores), so it runs last and not at all once another test found the method
    missing (``costly``)."""
    gen = generator(seed + 3)
    n_q, dim = _large_case_queries(learner), 8
    q = torch.randn(1, 1, n_q, dim, generator=gen, dtype=torch.float64).float()
    k, v = (torch.randn(1, 1, LARGE_KEYS, dim, generator=gen, dtype=torch.float64).float()
            for _ in "kv")
    block_q, block_k = n_q, LARGE_BLOCK_K
    call = (f"tiled_attention(q [1, 1, {n_q}, {dim}], k/v [1, 1, {LARGE_KEYS}, {dim}] float32, "
            f"block_q={block_q}, block_k={block_k})")
    try:
        result = learner.call("tiled_attention", q, k, v, block_q, block_k, causal=False)
    except LearnerError as exc:
        if "memory" not in str(exc):
            raise
        whole = n_q * LARGE_KEYS * 4 / 2**30
        raise PrerequisiteFailed(
            f"{call}: {exc}. Not allowed: the whole [Nq, Nk] score matrix ({whole:.1f} GiB here "
            f"in float32, {2 * whole:.1f} GiB in float64), or a query tile's whole rows of "
            "scores over all Nk keys; work tile by tile: hold one [block_q, block_k] tile of "
            "scores at a time, with the running max, sum and output per row. The exercise "
            "scores 0 until this case runs within the memory limit",
            rule="the whole score matrix is not allowed; work tile by tile") from None
    _require_one_pass_over_keys(learner, q, LARGE_KEYS, block_k, call)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError(f"{call} returned {type(result).__name__}; return the pair (out, lse)")
    rows = torch.randperm(n_q, generator=gen)[:CHECKED_ROWS]
    expected, expected_lse = _attention64(q[:, :, rows], k, v)
    out, lse = result
    if not (isinstance(out, torch.Tensor) and out.shape == q.shape and isinstance(lse, torch.Tensor)
            and lse.shape == q.shape[:3]):
        raise AssertionError(f"{call} returned out {getattr(out, 'shape', out)!s:.60} and lse "
                             f"{getattr(lse, 'shape', lse)!s:.60}; expected [1, 1, {n_q}, {dim}] "
                             f"and [1, 1, {n_q}]")
    assert_close(out[:, :, rows], expected, name=f"out of {call} (rows {rows[:4].tolist()}...)",
                 rtol=2e-4, atol=2e-5)
    assert_close(lse[:, :, rows], expected_lse, name=f"lse of {call}", rtol=2e-4, atol=2e-5)


# ----------------------------------------------------------------------- score_tile_kernel

TILE = 16                       # BLOCK_M = BLOCK_N of the score-tile launches
SPARE = TILE    # NaN rows below and columns beside every buffer's entries: a tile's worth, so an
                # unmasked load or store lands in the buffer (and shows) instead of past its end
SCORE_TILE_CASES = ("ragged", "one_partial_tile", "negative_scores")


def _score_tile_problem(gen, case):
    """(q, k, scale) of one case, float32: fresh lengths that are not multiples of TILE (within
    one tile for ``one_partial_tile``); ``negative_scores`` shifts every score by about -30, so
    a key lane loaded as 0 and counted would be the max of its tile."""
    if case == "one_partial_tile":
        n_q, n_k = randint(gen, 1, TILE - 1), randint(gen, 1, TILE - 1)
    else:
        n_q, n_k = (randint(gen, 1, 3) * TILE + randint(gen, 1, TILE - 1) for _ in "qk")
    head_dim = [16, 32][randint(gen, 0, 1)]
    scale = 1 / math.sqrt(head_dim)
    q, k = (torch.randn(n, head_dim, generator=gen, dtype=torch.float64) for n in (n_q, n_k))
    if case == "negative_scores":
        k[:, 0] = 1.0
        q[:, 0] = -30.0 / scale
    return q.float(), k.float(), scale


def _poisoned(values: torch.Tensor) -> torch.Tensor:
    """A NaN buffer SPARE rows and columns larger than ``values``, holding them top left."""
    buffer = torch.full((values.shape[0] + SPARE, values.shape[1] + SPARE), float("nan"))
    buffer[:values.shape[0], :values.shape[1]] = values
    return buffer


def _tile_stats64(s64: torch.Tensor, n_tiles: int, padded_with=None):
    """(m, l) [n_q, n_tiles] of each row's scores in each key tile, float64; ``padded_with``:
    the score the lanes past the last key would get if they counted (a slip)."""
    n_q, n_k = s64.shape
    lanes = float("-inf") if padded_with is None else padded_with
    full = s64.new_full((n_q, n_tiles * TILE), lanes)
    full[:, :n_k] = s64
    tiles = full.view(n_q, n_tiles, TILE)
    m = tiles.amax(-1)
    return m, torch.exp(tiles - m[..., None]).sum(-1)


def _row_stride_used(written: torch.Tensor, rows: int, cols: int, stride: int) -> int | None:
    """The row stride a store used when the entries ``written`` (a bool mask of the buffer) are
    exactly rows x cols entries laid out with another stride than the buffer's ``stride``."""
    if int(written.sum()) != rows * cols or bool(written[:rows, :cols].all()):
        return None
    flat = torch.nonzero(written.reshape(-1)).flatten()
    for guess in range(cols, stride):
        want = (torch.arange(rows)[:, None] * guess + torch.arange(cols)[None, :]).flatten()
        if want.numel() == flat.numel() and torch.equal(want.sort().values, flat):
            return guess
    return None


def _score_tile_hint(s, m, l, s64, scale) -> str | None:
    """The advice of the usual slip that the kernel's scores s or statistics (m, l) match."""
    (n_q, n_k), n_tiles = s64.shape, m.shape[1] - SPARE
    got = m[:n_q, :n_tiles], l[:n_q, :n_tiles]
    if s[:n_q, :n_k].isnan().any() or got[0].isnan().any() or got[1].isnan().any():
        return ("NaN: the spare rows and columns of the buffers hold NaN. Mask the loads of query "
                "rows >= n_queries and keys >= n_keys, and step between rows with the strides "
                "passed in (a row is stride elements long, more than HEAD_DIM)")
    close = lambda a, b: torch.allclose(a.double(), b, rtol=1e-3, atol=1e-6)
    if close(s[:n_q, :n_k], s64 / scale) and not close(s64 / scale, s64):
        return "multiply q kᵀ by scale (once)"
    expected, padded = _tile_stats64(s64, n_tiles), _tile_stats64(s64, n_tiles, padded_with=0.0)
    if all(map(close, got, padded)) and not all(map(close, expected, padded)):
        return ("the lanes past n_keys counted in the max and the sum (as scores of 0): set their "
                "scores to -inf with tl.where before tl.max and tl.sum")
    if close(got[0], expected[0]) and close(got[1], expected[1] * torch.exp(expected[0])):
        return "l is measured from the tile's max: l = sum exp(s - m), not sum exp(s)"
    return None


ONE_TILE = "one [BLOCK_M, BLOCK_N] tile of scores per program, sized by the launcher, with tl.dot"


def _require_one_tile(learner) -> None:
    """Static look, before every launch: Triton code, a reachable tl.dot, tiles sized by the
    launcher's constexprs, no loop (one program computes its one tile with tile operations);
    the last three are the method (``PrerequisiteFailed``: the exercise scores 0, and its build
    for the GPUs is not run)."""
    source = kernel_source(learner, "score_tile_kernel")
    if source is None:
        raise AssertionError("`score_tile_kernel` is not defined (run its cell first)")
    problem = cell_problem(source, "score_tile_kernel")
    if problem:
        raise AssertionError(problem)
    if not any(isinstance(c.func, ast.Attribute) and c.func.attr == "dot"
               for c in reachable_calls(source, "score_tile_kernel")):
        raise PrerequisiteFailed("compute the tile of scores with one tl.dot of the query tile and "
                                 "the transposed key tile, not with elementwise products and sums",
                                 rule=ONE_TILE)
    fixed = fixed_size_aranges(source, "score_tile_kernel")
    if fixed:
        raise PrerequisiteFailed(f"{fixed[0]}: size every tile by the launcher's BLOCK_M, BLOCK_N "
                                 "and HEAD_DIM, which the grader picks", rule=ONE_TILE)
    if key_loops(source, "score_tile_kernel"):
        raise PrerequisiteFailed("no loops in this kernel: each program computes its one "
                                 "[BLOCK_M, BLOCK_N] tile with tile operations (tl.dot, tl.max, "
                                 "tl.sum)", rule=ONE_TILE)


@exercise("score_tile_kernel", points=2, timeout=60)
@pytest.mark.parametrize("case", SCORE_TILE_CASES)
def test_score_tile_kernel_writes_every_tile_and_nothing_else(learner, seed, case):
    _require_one_tile(learner)
    q, k, scale = _score_tile_problem(generator(seed + 7 + len(case)), case)
    (n_q, head_dim), n_k = q.shape, k.shape[0]
    n_tiles = -(-n_k // TILE)
    q_buf, k_buf = _poisoned(q), _poisoned(k)
    s_buf = torch.full((n_q + SPARE, n_k + SPARE), float("nan"))
    m_buf, l_buf = (torch.full((n_q + SPARE, n_tiles + SPARE), float("nan")) for _ in "ml")
    grid = (-(-n_q // TILE), n_tiles)
    got = learner.launch("score_tile_kernel", grid, q_buf, k_buf, s_buf, m_buf, l_buf,
                         q_buf.stride(0), k_buf.stride(0), s_buf.stride(0), m_buf.stride(0),
                         n_q, n_k, scale, HEAD_DIM=head_dim, BLOCK_M=TILE, BLOCK_N=TILE)
    s, m, l = got[2], got[3], got[4]
    s64 = (q.double() @ k.double().T) * scale
    m64, l64 = _tile_stats64(s64, n_tiles)
    name = (f"score_tile_kernel ({case}: {n_q} queries, {n_k} keys, HEAD_DIM {head_dim}, "
            f"BLOCK_M = BLOCK_N = {TILE})")
    strides = {"scores": "stride_sm", "m": "stride_tm", "l": "stride_tm"}
    for what, buffer, cols in (("scores", s, n_k), ("m", m, n_tiles), ("l", l, n_tiles)):
        outside = torch.ones_like(buffer, dtype=torch.bool)
        outside[:n_q, :cols] = False
        written = ~buffer.isnan()
        wrong = _row_stride_used(written, n_q, cols, buffer.stride(0))
        if wrong is not None:
            raise AssertionError(
                f"{name}: the {what} were stored {wrong} elements per row apart, but the rows of "
                f"that buffer are {strides[what]} = {buffer.stride(0)} elements apart (it has spare "
                f"columns): store row r's entries at r * {strides[what]} + column")
        if not buffer[outside].isnan().all():
            keys = " and key < n_keys" if what == "scores" else ""
            raise AssertionError(
                f"{name}: the kernel wrote {what} outside its [{n_q}, {cols}] entries (into the "
                "buffer's spare rows and columns, or past a row's end into the next row): mask "
                f"the store with query < n_queries{keys}")
    hint = _score_tile_hint(s, m, l, s64, scale)
    assert_close(s[:n_q, :n_k], s64.float(), name=f"scores of {name}", rtol=1e-4, atol=1e-4,
                 hint=hint)
    assert_close(m[:n_q, :n_tiles], m64.float(), name=f"tile maxima m of {name}", rtol=1e-4,
                 atol=1e-4, hint=hint)
    assert_close(l[:n_q, :n_tiles], l64.float(), name=f"tile sums l of {name}", rtol=1e-4,
                 atol=1e-5, hint=hint)


def _score_tile_build(label: str, head_dim: int, block: int) -> Build:
    """A launch like the tests' (a tile's worth of spare rows and columns in every buffer, ragged
    lengths) at these sizes, fp32 throughout."""
    n_q, n_k = 37, 50
    q, k = torch.empty(n_q + SPARE, head_dim + SPARE), torch.empty(n_k + SPARE, head_dim + SPARE)
    s, stats = torch.empty(n_q + SPARE, n_k + SPARE), torch.empty(n_q + SPARE, -(-n_k // block) + SPARE)
    return Build(label, (q, k, s, stats, stats, q.stride(0), k.stride(0), s.stride(0), stats.stride(0),
                         n_q, n_k, head_dim ** -0.5), {"HEAD_DIM": head_dim, "BLOCK_M": block, "BLOCK_N": block})


SCORE_TILE_BUILDS = planned("score_tile_kernel", [
    _score_tile_build("grader: fp32 D=16, 16x16 tiles", 16, TILE),
    _score_tile_build("grader: fp32 D=32, 16x16 tiles", 32, TILE),
    _score_tile_build("GPU tile: fp32 D=64, 64x64 tiles", 64, 64)])
SCORE_TILE_BUILD_ADVICE = ("A program holds its query tile [BLOCK_M, HEAD_DIM] and its key tile [BLOCK_N, "
                           "HEAD_DIM], which tl.dot reads through shared memory (4 bytes an element in fp32), "
                           "and the score tile [BLOCK_M, BLOCK_N] in registers. The interpreter runs the "
                           "kernel's body as Python; a GPU compiler takes Triton only: a constant of the "
                           "cell is read as a tl.constexpr (NAME = tl.constexpr(-1e30)) or written in place")


@exercise("score_tile_kernel", points=2, timeout=60, costly=True)
def test_score_tile_kernel_compiles_for_a_real_gpu(learner, seed):
    """Built (not run) for a T4, an A100 and an H100 at the tests' launches and at a GPU-sized tile:
    it must compile and fit one of them; the report shows shared memory, registers and spills."""
    require_gpu_build(learner, "score_tile_kernel", SCORE_TILE_BUILDS, SCORE_TILE_BUILD_ADVICE)


# -------------------------------------------------------------- flash_attention_fwd_kernel

BLOCK_M = BLOCK_N = HEAD_DIM = 16
SPARE_ROWS, SPARE_HEADS = 16, 2     # NaN-poisoned room in every input buffer (like a KV cache's)
KERNEL_CASES = {      # name: (query heads, group, Nq, Nk, causal, scores in the thousands)
    "tail_tiles": (2, 1, 37, 50, False, False),
    "causal_square": (2, 1, 45, 45, True, False),
    "gqa_3_causal_prefix": (6, 3, 20, 53, True, False),
    "large_scores": (2, 1, 33, 50, False, True),
}
LARGE_SCORES = ("scores in the thousands, climbing or falling by 32 per key (exp overflows above "
                "~88 in float32, ~709 in float64)")


def _buffer(gen, heads: int, rows: int) -> torch.Tensor:
    """[heads + SPARE_HEADS, rows + SPARE_ROWS, HEAD_DIM] NaN, random where a kernel may read."""
    buf = torch.full((heads + SPARE_HEADS, rows + SPARE_ROWS, HEAD_DIM), float("nan"))
    buf[:heads, :rows] = torch.randn(heads, rows, HEAD_DIM, generator=gen, dtype=torch.float64).float()
    return buf


def _kernel_hint(got, q, k, v, group, causal, large=False) -> str | None:
    if large and isinstance(got, torch.Tensor) and not torch.isfinite(got).all():
        return ("inf or NaN on scores in the thousands: exp of a raw score overflows above "
                "~88 in float32 (~709 in float64). Keep a running max m per row and take "
                "exp(s - m); when a key tile raises it, rescale l and acc by exp(m_old - m_new)")
    n_q, n_k = q.shape[1], k.shape[1]
    k_all, v_all = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    visible = causal_mask(n_q, n_k) if causal else torch.ones(n_q, n_k, dtype=torch.bool)
    slips = {advice: _attention64(q, k_all, v_all, mask)[0]
             for advice, mask in (_causal_slips(n_q, n_k) if causal else {}).items()}
    if n_k % BLOCK_N:
        dropped = visible & (torch.arange(n_k) < n_k // BLOCK_N * BLOCK_N)
        if dropped.any(1).all():
            slips["the last, partial key tile was skipped: loop over cdiv(n_keys, BLOCK_N) tiles "
                  "and mask the keys >= n_keys"] = _attention64(q, k_all, v_all, dropped)[0]
    hint = _name_slip(got, slips)
    if hint is None and isinstance(got, torch.Tensor) and torch.isnan(got).any():
        hint = ("NaN in the output: the spare rows and heads of the buffers hold NaN. Mask the "
                "loads of rows >= n_queries and keys >= n_keys (and give masked scores -inf); "
                + ("query head h reads K/V head h // group; " if group > 1 else "")
                + "move between heads and rows with the strides passed in")
    elif hint is None and isinstance(got, torch.Tensor) and torch.isinf(got).any():
        hint = "inf in the output: subtract the running max before tl.exp"
    return hint or ("when a tile raises a row's max from m_old to m_new, multiply l and acc by "
                    "exp(m_old - m_new) before adding the tile's terms")


KEY_TILES = "a loop over whole key tiles sized by the launcher, tile products with tl.dot"


def _require_tiles(learner) -> None:
    """Static look at the kernel, before every kernel test: tile products with tl.dot, tiles sized
    by the block constexprs, no loop inside a loop. A kernel that loads all of K in one fixed-size
    tile, or loops over single elements, earns nothing even where its numbers are right
    (``PrerequisiteFailed``: its build for the GPUs is not run either)."""
    source = kernel_source(learner, "flash_attention_fwd_kernel")
    if source is None:
        raise AssertionError("`flash_attention_fwd_kernel` is not defined (run its cell first)")
    problem = cell_problem(source, "flash_attention_fwd_kernel")
    if problem:
        raise AssertionError(problem)
    tree = ast.parse(source)
    kernel = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                   and n.name == "flash_attention_fwd_kernel"), None)
    if kernel is None:
        raise AssertionError("no `def flash_attention_fwd_kernel` in your cell")
    calls = [n for n in ast.walk(kernel) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    dots = [c for c in reachable_calls(source, "flash_attention_fwd_kernel")
            if isinstance(c.func, ast.Attribute) and c.func.attr == "dot"]
    if not dots:
        raise PrerequisiteFailed("compute the score tile and the P V product with tl.dot (tile x "
                                 "tile products on the tensor cores), not with elementwise loops "
                                 "or sums; a tl.dot counts only where it runs, not under a "
                                 "condition on constexprs that never holds", rule=KEY_TILES)
    allowed = {"BLOCK_M", "BLOCK_N", "HEAD_DIM"}
    for call in calls:
        if call.func.attr == "arange":
            sizes = {n.id for n in ast.walk(call.args[-1]) if isinstance(n, ast.Name)} if call.args else set()
            if not sizes or not sizes <= allowed:
                raise PrerequisiteFailed(
                    f"line {call.lineno}: tl.arange must span BLOCK_M, BLOCK_N or HEAD_DIM: a "
                    "fixed-size tile holding all of K or Q works only up to that size; loop over "
                    "key tiles of BLOCK_N instead", rule=KEY_TILES)
    loops = loop_problem(source, "flash_attention_fwd_kernel", "BLOCK_N")
    if loops:
        raise PrerequisiteFailed(f"{loops}: loop over the key tiles, `for start_n in range(0, end, "
                                 "BLOCK_N)`, each step handling a whole [BLOCK_M, BLOCK_N] tile "
                                 "with tile operations", rule=KEY_TILES)


def _require_flash_traffic(learner, q_buf, k_buf, n_q: int, n_k: int, group: int, causal: bool) -> None:
    """PrerequisiteFailed unless each program (query tile t, head h) loaded its query tile once
    and each K/V element of head h // group at most once, only up to the end of the key tile
    holding the tile's last visible key (causal), one tile per load, and stored out and lse once."""
    tiles = torch.arange(-(-n_q // BLOCK_M))
    last = torch.clamp((tiles + 1) * BLOCK_M, max=n_q) + (n_k - n_q) if causal else \
        torch.full_like(tiles, n_k)
    ends = torch.clamp(-(-last // BLOCK_N) * BLOCK_N, max=n_k)
    kv_reads = torch.zeros(k_buf.shape, dtype=torch.int32)
    kv_reads[:k_buf.shape[0] - SPARE_HEADS, :n_k] = group * (torch.arange(n_k)[:, None] < ends).sum(1)[:, None]
    q_reads = torch.zeros(q_buf.shape, dtype=torch.int32)
    q_reads[:q_buf.shape[0] - SPARE_HEADS, :n_q] = 1
    advice = ("a program loads its query tile once and each key tile it needs once, keeping the "
              "running max, sum and output per row (no first pass for the max)"
              + ("; causal: the key tiles after the query tile's last visible key are skipped, "
                 "not loaded" if causal else ""))
    require_traffic(learner, "flash_attention_fwd_kernel",
                    rule="flash attention reads K and V once per query tile",
                    reads={"Q": (0, q_reads, "in all", advice),
                           "K": (1, kv_reads, "per query tile", advice),
                           "V": (2, kv_reads, "per query tile", advice)},
                    outputs={"out": 3, "lse": 4},
                    tiles={"Q": (BLOCK_M * HEAD_DIM, f"BLOCK_M={BLOCK_M} rows of HEAD_DIM={HEAD_DIM}"),
                           "K": (BLOCK_N * HEAD_DIM, f"BLOCK_N={BLOCK_N} keys of HEAD_DIM={HEAD_DIM}"),
                           "V": (BLOCK_N * HEAD_DIM, f"BLOCK_N={BLOCK_N} keys of HEAD_DIM={HEAD_DIM}")})


@exercise("flash_attention_fwd_kernel", points=4, timeout=60)
@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_flash_kernel_matches_attention(learner, seed, case):
    _require_tiles(learner)
    heads, group, n_q, n_k, causal, large = KERNEL_CASES[case]
    gen = generator(seed + len(case))
    q_buf, out = _buffer(gen, heads, n_q), torch.full((heads, n_q + SPARE_ROWS, HEAD_DIM), float("nan"))
    k_buf, v_buf = _buffer(gen, heads // group, n_k), _buffer(gen, heads // group, n_k)
    if large:
        rows = (heads, n_q)
        offsets, directions = large_rows(gen, rows)
        q_buf[:heads, :n_q], k_buf[:heads // group, :n_k] = climbing_scores(
            q_buf[:heads, :n_q], k_buf[:heads // group, :n_k], torch.arange(n_k), offsets,
            directions)
    lse = torch.full((heads, n_q), float("nan"))
    grid = (-(-n_q // BLOCK_M), heads)
    args = (q_buf, k_buf, v_buf, out, lse, *q_buf.stride()[:2], *k_buf.stride()[:2],
            *v_buf.stride()[:2], *out.stride()[:2], n_q, n_k, group, 1 / math.sqrt(HEAD_DIM))
    got = learner.launch("flash_attention_fwd_kernel", grid, *args, CAUSAL=causal,
                         HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    got_out, got_lse = got[3], got[4]
    q, k, v = q_buf[:heads, :n_q], k_buf[:heads // group, :n_k], v_buf[:heads // group, :n_k]
    expected, expected_lse = _attention64(q, k.repeat_interleave(group, 0), v.repeat_interleave(group, 0),
                                          causal_mask(n_q, n_k) if causal else None)
    name = (f"{case}: {heads} query heads, group {group}, Nq={n_q}, Nk={n_k}, causal={causal}"
            + (f", {LARGE_SCORES}" if large else ""))
    rtol = 1e-3 if large else 1e-4   # fp32 scores in the thousands: ~1e-4 absolute
    assert_close(got_out[:heads, :n_q], expected.float(), name=f"out ({name})", rtol=rtol,
                 atol=1e-5, hint=_kernel_hint(got_out[:heads, :n_q], q, k, v, group, causal, large))
    assert_close(got_lse, expected_lse.float(), name=f"lse ({name})", rtol=rtol, atol=1e-5,
                 hint="store m + log(l) of each row (natural log, scores already scaled)")
    spare = got_out[:, n_q:]
    if not torch.isnan(spare).all():
        raise AssertionError(f"{name}: the kernel wrote rows >= n_queries of out; mask the store")
    _require_flash_traffic(learner, q_buf, k_buf, n_q, n_k, group, causal)


def _flash_build(label: str, head_dim: int, block: int, causal: bool) -> Build:
    """A launch like the tests' (their strides and lengths) at these sizes, fp32 throughout."""
    q, k = torch.empty(3, 37 + SPARE_ROWS, head_dim), torch.empty(3, 50 + SPARE_ROWS, head_dim)
    args = (q, k, k, q, torch.empty(3, 37), *q.stride()[:2], *k.stride()[:2], *k.stride()[:2], *q.stride()[:2],
            37, 50, 1, head_dim ** -0.5)
    return Build(label, args, {"CAUSAL": causal, "HEAD_DIM": head_dim, "BLOCK_M": block, "BLOCK_N": block})


FLASH_BUILDS = planned("flash_attention_fwd_kernel", [
    _flash_build("grader: fp32 D=16, 16x16 tiles", 16, 16, False),
    _flash_build("grader: fp32 D=16, 16x16 tiles, causal", 16, 16, True),
    _flash_build("GPU tile: fp32 D=64, 32x32 tiles, causal", 64, 32, True)])
FLASH_BUILD_ADVICE = ("Shared memory holds what tl.dot reads: the Q tile [BLOCK_M, HEAD_DIM], one K and one V "
                      "tile [BLOCK_N, HEAD_DIM] and P [BLOCK_M, BLOCK_N], 4 bytes an element in fp32, and as "
                      "many K/V tiles as a pipelined loop keeps in flight. Load one K and one V tile per step; "
                      "on a smaller GPU launch with BLOCK_N = 32")


@exercise("flash_attention_fwd_kernel", points=4, timeout=60, costly=True)
def test_flash_kernel_compiles_for_a_real_gpu(learner, seed):
    """Built (not run) for a T4, an A100 and an H100 at the tests' launches and at a GPU-sized tile:
    it must compile and fit one of them; the report shows shared memory, registers and spills."""
    require_gpu_build(learner, "flash_attention_fwd_kernel", FLASH_BUILDS, FLASH_BUILD_ADVICE)


# ------------------------------------------------------------------------- flash_hbm_bytes

@exercise("flash_hbm_bytes", points=2)
def test_flash_hbm_bytes_matches_the_counts(learner, seed):
    gen = generator(seed + 4)
    for _ in range(6):
        args = dict(n_queries=randint(gen, 1, 20_000), n_keys=randint(gen, 1, 20_000),
                    head_dim=[64, 128][randint(gen, 0, 1)], block_m=[64, 128][randint(gen, 0, 1)],
                    element_bytes=[1, 2, 4][randint(gen, 0, 2)])
        args["n_queries"] += args["n_queries"] % args["block_m"] == 0    # a partial last tile
        expected = hbm_bytes(args["n_queries"], args["n_keys"], args["head_dim"],
                             args["element_bytes"], args["block_m"])
        call = f"flash_hbm_bytes({', '.join(f'{k}={v}' for k, v in args.items())})"
        got = learner.call("flash_hbm_bytes", **args)
        if not isinstance(got, dict) or set(got) != {"naive", "flash"}:
            raise AssertionError(f"{call} returned {got!r}; return a dict with keys 'naive' and 'flash'")
        nq, nk, d, b, bm = (args[k] for k in ("n_queries", "n_keys", "head_dim", "element_bytes", "block_m"))
        kv = 2 * nk * d * b
        naive_slips = {expected["naive"] - 2 * nq * nk * b: "S and P each cross HBM twice (written, "
                       "then read): four trips of an [n_queries, n_keys] matrix"}
        flash_slips = {expected["flash"] - 4 * nq: "add one float32 log-sum-exp (4 bytes) per query row",
                       expected["flash"] - 4 * nq + nq * b: "the log-sum-exp is float32: 4 bytes per "
                       "row whatever element_bytes is",
                       expected["flash"] - kv * (-(-nq // bm) - 1): "K and V are read once per query "
                       "tile, not once in total",
                       expected["flash"] - kv * (-(-nq // bm) - nq // bm): "round the number of "
                       "query tiles up: the last, partial tile reads K and V too"}
        assert_equal(got["naive"], expected["naive"], name=f"{call}['naive']",
                     hint=naive_slips.get(got["naive"]))
        assert_equal(got["flash"], expected["flash"], name=f"{call}['flash']",
                     hint=flash_slips.get(got["flash"]))


@exercise("flash_hbm_bytes", points=2)
def test_flash_hbm_bytes_rejects_bad_sizes(learner, seed):
    for bad in (dict(block_m=0), dict(head_dim=0), dict(n_keys=-randint(generator(seed), 1, 99))):
        args = dict(n_queries=128, n_keys=128, head_dim=64, block_m=64) | bad
        try:
            result = learner.call("flash_hbm_bytes", **args)
        except LearnerError as exc:
            if "ValueError" not in str(exc):
                raise AssertionError(f"flash_hbm_bytes({args}) should raise ValueError; instead {exc}") from None
            continue
        raise AssertionError(f"flash_hbm_bytes({args}) returned {result!r}; it should raise ValueError")
