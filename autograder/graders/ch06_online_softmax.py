"""Grader for exercises/ch06_online_softmax.ipynb.

Expected values are a float64 softmax (``torch.softmax`` here, in the grader) and
``reference.kernels.torch_reference.merge_softmax_states``, on inputs drawn from
``torch.Generator().manual_seed(seed)``. Wrong answers are compared with what the usual slips
produce (no rescale, no max subtraction, no guard, state ignored, tail masked with 0) to name the
slip. The grader owns the loop: ``online_softmax_update`` is fed one tile per call, from states of
columns the learner never sees and states the grader picks, on interleaved row batches, and its
(m, l) is checked after every tile; ``online_softmax`` returns the state after every tile, each
compared with the state of the columns read by then (right last state, wrong earlier ones:
``PrerequisiteFailed``). Both must do the work of one pass (``learner.last_call_work``: each
score exponentiated once while read, within ``WORK_SLACK``): states recomputed from every column
read so far are a failed prerequisite too, seen on a row of many tiles; so is a call that records
fewer exponentials than its finite scores (``WORK_FLOOR``) or reads more values one at a time
than a row and a tile each (the work went outside torch, where the grader does not see it).
Every row batch shows every property (``_rows``). The kernel, ``online_softmax_kernel``, takes
rows of 3 to 6 blocks and runs in the learner's process under ``TRITON_INTERPRET=1`` (natively
where CUDA is available); this file owns its launcher (grid, BLOCK, strides) and poisons every
output element with NaN. The kernel stores its row's state (m, l) after every block, each
compared with the state of the columns read by then, and its loads and stores, counted by the
interpreter, must be those of two sweeps: each entry of x read twice by its row's program, one
block per load, each output stored once and never loaded back (``kernel_rules.require_traffic``:
a separate sweep for the max, or the whole row in one load, fails).
"""
from __future__ import annotations

import pytest
import torch

from autograder.boundary.causes import LearnerError
from autograder.rules.feedback import PrerequisiteFailed, assert_close
from autograder.rules.forbid import SOFTMAX_FAMILY
from autograder.rules.gpu_targets import Build, planned, require_gpu_build
from autograder.rules.inputs import generator, large_rows, randint
from autograder.rules.kernel_rules import (cell_problem, kernel_source, require_tile_loop,
                                             require_traffic)
from autograder.rules.operations import require_one_pass
from autograder.rules.plugin import exercise
from reference.kernels.torch_reference import merge_softmax_states as reference_merge

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SOFTMAX_FUNCTIONS = list(SOFTMAX_FAMILY)
NO_RESCALE = ("ℓ was not rescaled when the max grew: before adding a tile's terms, multiply the "
              "running sum by exp(m_old - m_new)")
NO_MAX = "subtract the (running) max before exp: exp of a score above ~88 overflows float32"
IGNORED_STATE = ("the incoming state (m, l) was ignored: fold the tile INTO it. The grader passes "
                 "states of columns you never see, so (m, l) is all there is of them")
NO_MAX_UPDATE = ("m_new = max(m, max of the tile): the running max never decreases, and stays "
                 "-inf only while every score read is -inf")
EMPTY_TILE = ("a tile whose scores are all -inf leaves m = -inf, and exp(-inf - (-inf)) is NaN: "
              "use 0 in place of an m that is still -inf (the rescale of an empty sum is 0)")


def _no_rescale(x, tile):
    """What online softmax gives when l is never rescaled (the classic slip)."""
    m = torch.full(x.shape[:-1], float("-inf"), dtype=torch.float64)
    l = torch.zeros_like(m)
    for start in range(0, x.shape[-1], tile):
        m = torch.maximum(m, x[..., start:start + tile].amax(-1))
        safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)
        l = l + torch.exp(x[..., start:start + tile] - safe[..., None]).sum(-1)
    return torch.exp(x - m[..., None]) / l[..., None]


def _row_state(s64: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, l) of every row of ``s64`` [..., n] (float64; n may be 0): the max and the sum of
    exp(s - m), (-inf, 0) for a row with nothing finite."""
    if s64.shape[-1] == 0:
        return torch.full(s64.shape[:-1], float("-inf"), dtype=torch.float64), \
            torch.zeros(s64.shape[:-1], dtype=torch.float64)
    m = s64.amax(-1)
    safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    return m, torch.exp(s64 - safe[..., None]).sum(-1)


def _rows(gen, shape: tuple[int, ...], n: int, first: int, dtype=torch.float32) -> torch.Tensor:
    """Scores [*shape, n] (prod(shape) >= 3) in which every property of the exercises shows:
    row 0 climbs from about -1000 to +1000 (its max grows in every tile by far more than exp
    can take: no raw exp, every old sum rescaled), row 1 starts with ``first`` columns of -inf
    and keeps a third of -inf after them, row 2 ~ 3 N(0, 1) with a fifth of -inf, the others
    ~ N(0, 1) times a random scale up to 30. Every row keeps a finite entry."""
    x = torch.randn(*shape, n, generator=gen, dtype=torch.float64)
    flat = x.view(-1, n)
    scales = torch.rand(flat.shape[0], 1, generator=gen, dtype=torch.float64) * 30 + 0.5
    flat.mul_(scales)
    flat[0] = torch.linspace(-1000.0, 1000.0, n, dtype=torch.float64) + flat[0].clamp(-20, 20)
    holes = torch.rand(flat.shape[0], n, generator=gen) < torch.tensor([0.0, 0.33, 0.2] + [0.0] * (
        flat.shape[0] - 3))[:, None]
    flat[holes] = float("-inf")
    flat[1, :first] = float("-inf")
    flat[1, -1] = 1.0 if first < n else flat[1, -1]
    flat[2, 0] = 0.5
    return x.to(dtype)


def _state_slip(m_in, l_in, tile, got, expected) -> str | None:
    """The advice of the usual slip of one update step that ``got`` (m, l) matches."""
    m_in, l_in, tile = m_in.double(), l_in.double(), tile.double()
    if not (isinstance(got, (tuple, list)) and len(got) == 2
            and all(isinstance(t, torch.Tensor) and t.shape == m_in.shape for t in got)):
        return None
    g_m, g_l = (t.double() for t in got)
    m_e, _ = expected
    bad = g_m.isnan() | g_l.isnan() | (g_l == float("inf"))
    if bad.any():   # only where state and tile are all -inf: the guard; elsewhere: overflow
        empty = (m_in == float("-inf")) & (tile == float("-inf")).all(-1)
        return EMPTY_TILE if bool(empty[bad].all()) else NO_MAX
    safe = torch.where(m_e == float("-inf"), torch.zeros_like(m_e), m_e)
    slips = {NO_RESCALE: (m_e, l_in + torch.exp(tile - safe[..., None]).sum(-1)),
             IGNORED_STATE: _row_state(tile)}
    for advice, (m_s, l_s) in slips.items():
        if not (torch.equal(m_s, m_e) and torch.allclose(l_s, expected[1], rtol=1e-4))\
                and torch.equal(g_m, m_s) and torch.allclose(g_l, l_s, rtol=1e-4, atol=1e-6):
            return advice
    if not torch.equal(g_m, m_e):
        return NO_MAX_UPDATE
    return None


def _check_step(learner, m_in, l_in, tile, expected, what) -> tuple[torch.Tensor, torch.Tensor]:
    """Call the learner's update on (m_in, l_in, tile); compare with ``expected`` (float64)."""
    got = learner.call("online_softmax_update", m_in, l_in, tile)
    call = f"online_softmax_update(m, l {list(m_in.shape)} {str(m_in.dtype)[6:]}, tile {list(tile.shape)}) {what}"
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise AssertionError(f"{call} returned {type(got).__name__}; return the pair (m_new, l_new)")
    rows = m_in.numel()
    require_one_pass(learner, call, exp_elements=rows * (tile.shape[-1] + 1), exp_rescales=rows,
                     visible_scores=int(torch.isfinite(tile).sum()), reads=rows + 1, why=ONE_STEP,
                     rule="one step: the tile's scores exponentiated once")
    hint = _state_slip(m_in, l_in, tile, got, expected)
    for name, value, exp, rtol in (("m_new", got[0], expected[0], 0.0), ("l_new", got[1], expected[1], 1e-5)):
        assert_close(value, exp, name=f"{name} of {call}", rtol=rtol, atol=1e-6 if rtol else 0.0, hint=hint)
        if value.dtype != m_in.dtype:
            raise AssertionError(f"{name} of {call} has dtype {value.dtype}; keep the state in m's "
                                 f"dtype ({m_in.dtype})")
    return got[0], got[1]


class _Stream:
    """One row batch the grader feeds to the update tile by tile: ``hidden`` columns the learner
    never sees (their state is the first one passed), then tiles of random widths."""

    def __init__(self, gen, dtype):
        shape = [(randint(gen, 3, 6),), (randint(gen, 1, 2), randint(gen, 3, 4))][randint(gen, 0, 1)]
        widths = []
        n = randint(gen, 24, 48)
        while sum(widths) < n:
            widths.append(min(randint(gen, 1, 9), n - sum(widths)))
        self.widths = widths
        self.dtype = dtype
        self.x = _rows(gen, shape, n, widths[0], dtype)
        self.hidden = self._hidden(gen)

    def _hidden(self, gen):
        """Scores of columns before the first tile: random length, row 1 none (its state is
        the empty one, so its first, all -inf tile needs the guard), row 0 near -1100."""
        h = torch.randn(*self.x.shape[:-1], randint(gen, 1, 6), generator=gen, dtype=torch.float64) * 5
        flat = h.view(-1, h.shape[-1])
        flat[0] -= 1100.0
        flat[1] = float("-inf")
        return h.to(self.dtype).double()      # scores the dtype can hold, so m is exact

    def tile(self, t):
        start = sum(self.widths[:t])
        return self.x[..., start:start + self.widths[t]]

    def state(self, t):
        """The float64 state after the hidden columns and the first t tiles."""
        seen = self.x[..., :sum(self.widths[:t])].double()
        return _row_state(torch.cat([self.hidden, seen], -1))

    def cast(self, state):
        return tuple(v.to(self.dtype) for v in state)


def _interleaved(gen, streams):
    """(stream index, tile index) in an order that alternates between the streams at random."""
    left = [len(s.widths) for s in streams]
    order, next_tile = [], [0] * len(streams)
    while any(left):
        ready = [i for i, n in enumerate(left) if n]
        i = ready[randint(gen, 0, len(ready) - 1)]
        order.append((i, next_tile[i]))
        next_tile[i] += 1
        left[i] -= 1
    return order


UPDATE_FORBIDDEN = SOFTMAX_FUNCTIONS
ONE_STEP = ("online_softmax_update folds in this one tile: each of its scores exponentiated once, "
            "while (m, l) stands for every column before it. Columns of earlier tiles computed "
            "again make each step cost as much as all the steps before it")


# --------------------------------------------------------------- online_softmax_update

@exercise("online_softmax_update", points=2, forbid=UPDATE_FORBIDDEN)
def test_update_driven_tile_by_tile_from_its_own_states(learner, seed):
    """The grader owns the loop: three row batches (fresh sizes, tile widths drawn per step),
    each starting from the state of columns the learner never sees, fed one tile per call in
    an interleaved order; each call gets the learner's own previous state for that batch, and
    (m, l) after every tile is compared with the float64 state of everything before it."""
    gen = generator(seed)
    streams = [_Stream(gen, dtype) for dtype in (torch.float32, torch.float32, torch.float64)]
    states = [s.cast(s.state(0)) for s in streams]
    for i, t in _interleaved(gen, streams):
        s = streams[i]
        states[i] = _check_step(learner, *states[i], s.tile(t), s.state(t + 1),
                                f"(row batch {i + 1}, tile {t + 1} of {len(s.widths)}, fed after "
                                "your own state of the tiles before)")


@exercise("online_softmax_update", points=2, forbid=UPDATE_FORBIDDEN)
def test_update_from_states_the_grader_picks(learner, seed):
    """Every call starts from a state the grader computed (in float64, then cast), and now and
    then from the state of a fresh set of unseen columns: the step may rely on nothing but
    (m, l) and the tile."""
    gen = generator(seed + 1)
    streams = [_Stream(gen, dtype) for dtype in (torch.float32, torch.float64, torch.float32)]
    for i, t in _interleaved(gen, streams):
        s = streams[i]
        if t and randint(gen, 0, 2) == 0:
            s.hidden = s._hidden(gen)
        _check_step(learner, *s.cast(s.state(t)), s.tile(t), s.state(t + 1),
                    f"(row batch {i + 1}, tile {t + 1} of {len(s.widths)}, fed after a state the "
                    "grader picked)")


# ------------------------------------------------------------------------ online_softmax

ONE_PASS = ("online softmax reads the row ONE tile at a time: the state after tile t is the "
            "state after tile t - 1 updated with tile t alone, so each column is exponentiated "
            "once while it is read (and once more in the final sweep), work linear in the row "
            "length. Each state recomputed from every column read so far gives the same states "
            "for work that grows with the square of the row length")
ONE_PASS_TILES = (16, 24)   # tiles of the case where a from-scratch recompute costs ~9 passes


def _check_online(learner, x, tile, what):
    call = f"online_softmax(scores {list(x.shape)} {str(x.dtype)[6:]} ({what}), tile={tile})"
    got = learner.call("online_softmax", x, tile)
    if not (isinstance(got, tuple) and len(got) == 3):
        raise AssertionError(f"{call} returned {type(got).__name__}; return the tuple (probs, m, l)")
    probs, m, l = got
    x64 = x.double()
    n_tiles = -(-x.shape[-1] // tile)
    rows = x.numel() // x.shape[-1]
    require_one_pass(learner, call, exp_elements=rows * (2 * x.shape[-1] + n_tiles),
                     exp_rescales=rows * n_tiles, visible_scores=int(torch.isfinite(x).sum()),
                     reads=rows + n_tiles, why=ONE_PASS,
                     rule="one pass: each state updated from the previous one with one tile")
    m_e, l_e = (torch.stack(v, -1) for v in zip(*(_row_state(x64[..., :min(t * tile, x.shape[-1])])
                                                  for t in range(1, n_tiles + 1))))
    hint = None
    if isinstance(probs, torch.Tensor) and probs.shape == x.shape:
        bad = ~torch.isfinite(probs).all(-1)
        for value in (m, l):
            if isinstance(value, torch.Tensor) and value.shape[:-1] == x.shape[:-1]:
                bad |= (value.isnan() | (value == float("inf"))).flatten(len(x.shape) - 1).any(-1)
        empty_first = (x[..., :tile] == float("-inf")).all(-1)
        if bad.any():   # NaN only where a first tile is all -inf: the guard; elsewhere: overflow
            hint = EMPTY_TILE if bool(empty_first[bad].all()) else NO_MAX
        elif torch.allclose(probs.double(), _no_rescale(x64, tile), rtol=1e-4, atol=1e-6):
            hint = NO_RESCALE
    states = f"one state per tile: shape {list(x.shape[:-1]) + [n_tiles]}"
    for name, value in (("m", m), ("l", l)):
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(m_e.shape):
            raise AssertionError(f"{name} of {call} has shape {list(getattr(value, 'shape', []))}; "
                                 f"it holds the running {name} after every tile, {states}")
    final_ok = (torch.equal(m[..., -1].double(), m_e[..., -1])
                and torch.allclose(l[..., -1].double(), l_e[..., -1], rtol=1e-4, atol=1e-6))
    earlier_ok = (torch.equal(m.double(), m_e)
                  and torch.allclose(l.double(), l_e, rtol=1e-4, atol=1e-6, equal_nan=False))
    if final_ok and not earlier_ok and n_tiles > 1:
        bad = next(t for t in range(n_tiles) if not (
            torch.equal(m[..., t].double(), m_e[..., t])
            and torch.allclose(l[..., t].double(), l_e[..., t], rtol=1e-4, atol=1e-6)))
        raise PrerequisiteFailed(
            f"{call}: your final state is the row's, but your state after tile {bad + 1} is not "
            f"the state of the {(bad + 1) * tile} columns read by then (m[..., {bad}], "
            f"l[..., {bad}]). The online softmax reads the row tile by tile: each state is the "
            "previous one updated with the next tile alone; a max and a sum taken over the "
            "whole row (or measured from its final max) are not. The exercise scores 0 until "
            "every state is the state of the columns read so far",
            rule="the states must be those of the columns read so far, tile by tile")
    assert_close(m, m_e, name=f"m of {call}", rtol=0, atol=0,
                 hint="m[..., t] is the largest score of columns 0 .. (t + 1) * tile - 1")
    assert_close(l, l_e, name=f"l of {call}", rtol=1e-4, atol=1e-6,
                 hint=hint or NO_RESCALE + " (l[..., t] is measured from m[..., t])")
    assert_close(probs, torch.softmax(x64, dim=-1), name=f"probs of {call}", rtol=1e-4, atol=1e-6,
                 hint=hint)
    for name, value in (("probs", probs), ("m", m), ("l", l)):
        if value.dtype != x.dtype:
            raise AssertionError(f"{name} of {call} has dtype {value.dtype}; return scores' dtype {x.dtype}")


def _check_bad_tile(learner, gen):
    tile = -randint(gen, 0, 3)
    try:
        learner.call("online_softmax", torch.zeros(2, 5), tile)
    except LearnerError as exc:
        if "ValueError" in str(exc):
            return
        raise AssertionError(f"online_softmax(scores, tile={tile}) should raise ValueError; "
                             f"instead {exc}") from None
    raise AssertionError(f"online_softmax(scores, tile={tile}) returned; it should raise ValueError "
                         "(a tile needs at least one column)")


def _online_cases(gen, dtype):
    """Three calls on fresh sizes: each row batch shows every property (``_rows``), its tile
    drawn per call, never dividing N, so the last tile is shorter; the last call reads many
    tiles (ONE_PASS_TILES), where recomputing each state from scratch costs several passes."""
    shapes = [(randint(gen, 3, 6),), (randint(gen, 1, 2), randint(gen, 3, 4)),
              (randint(gen, 3, 5),)]
    for shape, tiles in zip(shapes, [(3, 7), (3, 7), ONE_PASS_TILES]):
        tile = randint(gen, 2, 9)
        n = tile * randint(gen, *tiles) + randint(gen, 1, tile - 1)
        yield _rows(gen, shape, n, tile, dtype), tile


@exercise("online_softmax", points=2, forbid=SOFTMAX_FUNCTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_online_softmax_states_after_every_tile(learner, seed, dtype):
    gen = generator(seed + (2 if dtype == torch.float32 else 3))
    for x, tile in _online_cases(gen, dtype):
        _check_online(learner, x, tile, str(dtype).removeprefix("torch."))
    _check_bad_tile(learner, gen)


# ------------------------------------------------------------------ merge_softmax_states

def _state(x, v, keep):
    """(m, l, o) of every row over the keys where ``keep`` [R, N] is True, in float64."""
    s = x.masked_fill(~keep, float("-inf"))
    m = s.amax(-1)
    w = torch.exp(s - torch.where(m == float("-inf"), 0.0, m)[:, None])
    return m, w.sum(-1), torch.einsum("rn,rnd->rd", w, v)


def _check_merge(learner, gen, splits, scale, what):
    rows, n, d = len(splits), randint(gen, 10, 30), randint(gen, 2, 6)
    splits = [min(s, n) for s in splits]
    x = torch.randn(rows, n, generator=gen, dtype=torch.float64) * scale
    v = torch.randn(rows, n, d, generator=gen, dtype=torch.float64)
    first = torch.arange(n)[None, :] < torch.tensor(splits)[:, None]
    a, b = _state(x, v, first), _state(x, v, ~first)
    got = learner.call("merge_softmax_states", *a, *b)
    call = f"merge_softmax_states of {rows} rows split at {splits} of {n} keys ({what})"
    if not (isinstance(got, tuple) and len(got) == 3):
        raise AssertionError(f"{call} returned {type(got).__name__}; return the tuple (m, l, o)")
    m, l, o = reference_merge(a, b)
    hint = None
    if all(isinstance(t, torch.Tensor) for t in got) and got[2].shape == o.shape:
        if torch.allclose(got[2].double(), a[2] + b[2]) and not torch.allclose(o, a[2] + b[2]):
            hint = ("the two states are measured from different maxima: multiply each by "
                    "exp(m_i - max(m1, m2)) before adding")
        elif torch.allclose(got[2].double(), o / l[:, None].clamp_min(1e-300)):
            hint = "o stays UNnormalised: do not divide by l (the caller divides at the very end)"
        elif got[2].isnan().any() or got[1].isnan().any():
            hint = "an empty state has m = -inf; where both m are -inf, use 0 instead of -inf - (-inf)"
    assert_close(got[0], m, name=f"m of {call}", rtol=0, atol=0, hint=hint)
    assert_close(got[1], l, name=f"l of {call}", rtol=1e-9, atol=1e-12, hint=hint)
    assert_close(got[2], o, name=f"o of {call}", rtol=1e-9, atol=1e-12, hint=hint)
    full = torch.softmax(x, -1)[:, :, None].mul(v).sum(1)
    assert_close(got[2] / got[1][:, None], full, name=f"o / l of {call}", rtol=1e-9, atol=1e-12,
                 hint="the merged state must give the attention output over all keys")


@exercise("merge_softmax_states", points=3)
def test_merge_matches_splitting_the_row(learner, seed):
    gen = generator(seed)
    _check_merge(learner, gen, [randint(gen, 1, 9) for _ in range(6)], 3.0, "random scores")
    _check_merge(learner, gen, [randint(gen, 1, 9) for _ in range(3)], 300.0, "scores ~ 300")


@exercise("merge_softmax_states", points=3)
def test_merge_with_an_empty_half(learner, seed):
    gen = generator(seed)
    _check_merge(learner, gen, [0, randint(gen, 1, 9), 10_000, 0], 3.0, "an empty half")
    a = (torch.full((2,), float("-inf"), dtype=torch.float64), torch.zeros(2, dtype=torch.float64),
         torch.zeros(2, 3, dtype=torch.float64))
    got = learner.call("merge_softmax_states", *a, *a)
    for name, value, expected in zip("mlo", got, a):
        assert_close(value, expected, name=f"{name} of merging two empty states (-inf, 0, 0)", rtol=0,
                     atol=0, hint="where both m are -inf, use 0 instead of -inf - (-inf), which is NaN")


# ----------------------------------------------------------------- online_softmax_kernel

KERNEL = "online_softmax_kernel"
TWO_SWEEPS = "two sweeps over the row: the online max and sum, then the write"
SWEEP_ADVICE = ("the online softmax reads a row twice: one sweep folds each block into the "
                "running (m, l), one more writes exp(x - m) / l; a separate sweep for the max, "
                "or a block loaded again inside a sweep, is a third read")
BLOCK_LOOP_ADVICE = ("Walk the row one block at a time: `for j in range(0, tl.cdiv(n_cols, "
                     "BLOCK))`, each step loading BLOCK columns with tl.arange(0, BLOCK) and a mask")
KERNEL_SLIPS = {
    "no_rescale": NO_RESCALE,
    "final_max": ("the state after block j must be measured from the max of the columns read by "
                  "then (the running max), not from the row's final max: it is what a single "
                  "pass knows at that point, and what lets the pass skip the separate max sweep"),
    "zero_tail": ("the lanes past n_cols were loaded as 0, so they count in the max and the sum "
                  "of the last block: load them with other=float('-inf')"),
}
NO_STATE = ("m and l were not stored after every block: after folding block j in, store the "
            "row's running max and sum at m_ptr + row * n_blocks + j and l_ptr + row * n_blocks + j")
EMPTY_BLOCK = ("a block whose scores are all -inf while m is still -inf (row 1 starts with such "
               "blocks) gives exp(-inf - (-inf)) = NaN: use 0 in place of an m that is still -inf "
               "(the rescale of an empty sum is 0)")


def _kernel_rows(gen, case: str) -> tuple[torch.Tensor, int, int]:
    """(x [5, n_cols + 3] in the case's dtype, n_cols, BLOCK): rows of 3 to 6 blocks of 16 or 32
    columns, the last block partial. ``large``: each row near +-1000 and climbing or falling by
    32 per column (``large_rows``), far outside exp's range in float64 too; ``minus_inf``: a
    third of the entries -inf, row 1 starting with two whole blocks of -inf, row 2 ending with
    an all -inf last block; ``float16``: N(0, 4)."""
    block = (16, 32)[randint(gen, 0, 1)]
    n_cols = randint(gen, 3 * block + 1, 6 * block - 1)
    n_cols += n_cols % block == 0
    x = torch.randn(5, n_cols + 3, generator=gen, dtype=torch.float64)
    if case == "large":
        offsets, directions = large_rows(gen, (5,))
        climb = 32.0 * torch.arange(n_cols + 3, dtype=torch.float64)
        x = offsets[:, None] + directions[:, None] * climb + (x * 16).round() / 4
    elif case == "minus_inf":
        x *= 3.0
        x[torch.rand(x.shape, generator=gen) < 0.3] = float("-inf")
        x[1, :2 * block] = float("-inf")
        x[2, (n_cols - 1) // block * block:] = float("-inf")
        x[:, 2 * block + 1] = 0.5                       # every row keeps a finite entry
    else:
        x *= 4.0 if case == "float16" else torch.rand(5, 1, generator=gen, dtype=torch.float64) * 30 + 0.5
    return x.to(torch.float16 if case == "float16" else torch.float32), n_cols, block


def _block_states(x: torch.Tensor, block: int, slip: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, l) [rows, n_blocks] after every block of x [rows, n] (float64), as an online pass
    records them; ``slip`` gives those of a usual slip instead (``KERNEL_SLIPS``)."""
    if slip == "zero_tail":
        x = torch.cat([x, x.new_zeros(x.shape[0], -x.shape[1] % block)], 1)
    ends = range(block, x.shape[1] + block, block)
    states = [_row_state(x[:, :end]) for end in ends]
    m = torch.stack([s[0] for s in states], 1)
    if slip == "final_max":
        top = m[:, -1:]
        return m, torch.stack([torch.exp(x[:, :end] - top).sum(1) for end in ends], 1)
    if slip == "no_rescale":
        safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)
        terms = [torch.exp(x[:, end - block:end] - safe[:, j:j + 1]).sum(1) for j, end in enumerate(ends)]
        return m, torch.cumsum(torch.stack(terms, 1), 1)
    return m, torch.stack([s[1] for s in states], 1)


def _kernel_hint(x64, block, got_m, got_l, got_out) -> str | None:
    """The advice of the usual slip the kernel's recorded states (or output) match."""
    if got_m.isnan().all() and got_l.isnan().all():
        return NO_STATE
    if (got_m.isnan() | got_l.isnan()).any() or got_out.isnan().any():
        lead = (x64[:, :block] == float("-inf")).all(1)
        if lead.any() and bool((got_l[lead].isnan().any(1) | got_out[lead].isnan().any(1)).all()):
            return EMPTY_BLOCK
    if not torch.isfinite(got_l).all() or not torch.isfinite(got_out).all():
        return NO_MAX
    right_m, right_l = _block_states(x64, block)
    for slip, advice in KERNEL_SLIPS.items():
        m, l = _block_states(x64, block, slip)
        if not (torch.allclose(m, right_m) and torch.allclose(l, right_l, rtol=1e-4)) \
                and torch.allclose(got_m.double(), m, rtol=1e-5, atol=1e-3) \
                and torch.allclose(got_l.double(), l, rtol=1e-3, atol=1e-6):
            return advice
    return None


def _require_kernel_code(learner) -> None:
    """Static look before a launch: a cell of Triton code whose loops step a whole block."""
    source = kernel_source(learner, KERNEL)
    problem = source and cell_problem(source, KERNEL)
    if problem:
        raise AssertionError(problem)
    require_tile_loop(learner, KERNEL, "BLOCK", BLOCK_LOOP_ADVICE, what="columns")


def _launch_kernel(learner, x, n_cols, block):
    """Launch on poisoned outputs: out [rows, n_cols + 5] and the states [rows, n_blocks] NaN."""
    rows, n_blocks = x.shape[0], -(-n_cols // block)
    out = torch.full((rows, n_cols + 5), float("nan"), dtype=x.dtype)
    m, l = (torch.full((rows, n_blocks), float("nan")) for _ in "ml")
    args = (x.to(DEVICE), out.to(DEVICE), m.to(DEVICE), l.to(DEVICE), n_cols, x.stride(0), out.stride(0))
    try:
        got = learner.launch(KERNEL, (rows,), *args, BLOCK=block)
    except LearnerError as exc:                  # launch() does not say why a cell failed; call() does
        why = getattr(learner, "cell_errors", {}).get(KERNEL)
        if why and "is not defined" in str(exc):
            raise LearnerError(f"`{KERNEL}` is not defined because its cell failed: {why}") from None
        raise
    return tuple(t.cpu() for t in got[1:4])


def _require_two_sweeps(learner, rows: int, n_cols: int, block: int) -> None:
    """PrerequisiteFailed unless each program read its row's n_cols entries twice (two sweeps),
    one block per load, and stored out, m and l once per element without loading them."""
    twice = torch.zeros(rows, n_cols + 3, dtype=torch.int32)
    twice[:, :n_cols] = 2
    require_traffic(learner, KERNEL, rule=TWO_SWEEPS,
                    reads={"x": (0, twice, "as often as two sweeps do", SWEEP_ADVICE)}, sweeps={"x": 2},
                    outputs={"out": 1, "m": 2, "l": 3},
                    tiles={"x": (block, f"BLOCK = {block} columns")})


@exercise(KERNEL, points=5, forbid=SOFTMAX_FUNCTIONS, timeout=60)
@pytest.mark.parametrize("case", ["random", "large", "minus_inf", "float16"])
def test_online_softmax_kernel_states_after_every_block(learner, seed, case):
    _require_kernel_code(learner)
    x, n_cols, block = _kernel_rows(generator(seed + len(case)), case)
    got_out, got_m, got_l = _launch_kernel(learner, x, n_cols, block)
    x64 = x[:, :n_cols].double()
    call = f"{KERNEL} ({case}: 5 rows of {n_cols} columns, BLOCK = {block})"
    hint = _kernel_hint(x64, block, got_m, got_l, got_out[:, :n_cols])
    m, l = _block_states(x64, block)
    # float32 states of scores in the thousands: ~1e-4 absolute in m, a few 1e-4 relative in l
    m_tol, l_tol = (1e-3, 2e-3) if case == "large" else (1e-5, 1e-4)
    assert_close(got_m, m, name=f"m after every block, {call}", rtol=1e-6, atol=m_tol, hint=hint)
    assert_close(got_l, l, name=f"l after every block, {call}", rtol=l_tol, atol=1e-6, hint=hint)
    tol = {"float16": 2e-3, "large": 1e-3}.get(case, 1e-5)
    assert_close(got_out[:, :n_cols], torch.softmax(x64, -1), name=f"out of {call}", rtol=tol,
                 atol=tol * 1e-2, hint=hint)
    if not got_out[:, n_cols:].isnan().all():
        raise AssertionError(f"{KERNEL} wrote past the end of a row ({n_cols} columns, the row "
                             "stride is larger): mask the store with the columns < n_cols")
    _require_two_sweeps(learner, x.shape[0], n_cols, block)


def _kernel_build(label: str, dtype: torch.dtype, block: int) -> Build:
    x, state = torch.empty(5, 4 * block, dtype=dtype), torch.empty(5, 4)
    return Build(label, (x, x, state, state, 4 * block - 11, 4 * block + 3, 4 * block + 5),
                 {"BLOCK": block})


KERNEL_BUILDS = planned(KERNEL, [
    _kernel_build("grader: fp32, BLOCK = 32", torch.float32, 32),
    _kernel_build("grader: fp16, BLOCK = 32", torch.float16, 32),
    _kernel_build("GPU row: fp32, BLOCK = 4096", torch.float32, 4096)])
KERNEL_BUILD_ADVICE = ("One program holds one block of BLOCK scores in registers (BLOCK / 128 per thread "
                       "with 4 warps) and its running m and l; tl.max and tl.sum across warps go through a "
                       "little shared memory. Keep one block in flight at a time")


@exercise(KERNEL, points=5, forbid=SOFTMAX_FUNCTIONS, timeout=60, costly=True)
def test_online_softmax_kernel_compiles_for_a_real_gpu(learner, seed):
    """Built (not run) for a T4, an A100 and an H100 at the tests' blocks and at a GPU-sized one:
    it must compile and fit one of them; the report shows shared memory, registers and spills."""
    require_gpu_build(learner, KERNEL, KERNEL_BUILDS, KERNEL_BUILD_ADVICE)
