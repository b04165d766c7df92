"""Grader for exercises/ch06_online_softmax.ipynb.

Expected values are a float64 softmax (``torch.softmax`` here, in the grader) and
``reference.kernels.torch_reference.merge_softmax_states``, on inputs drawn from
``torch.Generator().manual_seed(seed)``. Wrong answers are compared with what the usual slips
produce (no rescale, no max subtraction, tail masked with 0) to name the slip. The kernel runs
in the learner's process under ``TRITON_INTERPRET=1`` (natively where CUDA is available); this
file owns its launcher (grid, BLOCK, strides) and poisons every output element with NaN.
"""
from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import torch
import triton

from autograder.boundary.causes import LearnerError
from autograder.rules.feedback import assert_close
from autograder.rules.inputs import generator, randint
from autograder.rules.plugin import exercise
from reference.kernels.torch_reference import merge_softmax_states as reference_merge

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SOFTMAX_FUNCTIONS = ["torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax",
                     "torch.log_softmax", "torch.nn.functional.log_softmax",
                     "torch.logsumexp", "torch.special.logsumexp",
                     "torch.Tensor.softmax", "torch.Tensor.log_softmax", "torch.Tensor.logsumexp"]
NO_RESCALE = ("ℓ was not rescaled when the max grew: before adding a tile's terms, multiply the "
              "running sum by exp(m_old - m_new)")
NO_MAX = "subtract the (running) max before exp: exp of a score above ~88 overflows float32"
EMPTY_TILE = ("a tile whose scores are all -inf leaves m = -inf, and exp(-inf - (-inf)) is NaN: "
              "use 0 in place of an m that is still -inf (the rescale of an empty sum is 0)")


def _scores(gen, shape, scale=3.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).float()


def _call_online(learner, x, tile):
    got = learner.call("online_softmax", x, tile)
    if not (isinstance(got, tuple) and len(got) == 3):
        raise AssertionError(f"online_softmax(scores, tile={tile}) returned {type(got).__name__}; "
                             "return the tuple (probs, m, l)")
    return got


def _no_rescale(x, tile):
    """What online softmax gives when l is never rescaled (the classic slip)."""
    m = torch.full(x.shape[:-1], float("-inf"), dtype=torch.float64)
    l = torch.zeros_like(m)
    for start in range(0, x.shape[-1], tile):
        m = torch.maximum(m, x[..., start:start + tile].amax(-1))
        l = l + torch.exp(x[..., start:start + tile] - m[..., None]).sum(-1)
    return torch.exp(x - m[..., None]) / l[..., None]


def _check_online(learner, x, tile, what):
    probs, m, l = _call_online(learner, x, tile)
    x64 = x.double()
    expected = torch.softmax(x64, dim=-1)
    hint = None
    if isinstance(probs, torch.Tensor) and probs.shape == x.shape:
        if probs.isnan().any() or probs.isinf().any():
            hint = EMPTY_TILE if x.isinf().any() else NO_MAX
        elif torch.allclose(probs.double(), _no_rescale(x64, tile), rtol=1e-4, atol=1e-6):
            hint = NO_RESCALE
    call = f"online_softmax(scores {list(x.shape)} ({what}), tile={tile})"
    assert_close(probs, expected, name=f"probs of {call}", rtol=1e-4, atol=1e-6, hint=hint)
    m_expected = x64.amax(-1)
    assert_close(m, m_expected, name=f"m of {call}", rtol=0, atol=0,
                 hint="m is the largest score of each row (shape [...], the last dim reduced)")
    assert_close(l, torch.exp(x64 - m_expected[..., None]).sum(-1), name=f"l of {call}", rtol=1e-4,
                 atol=1e-6, hint=NO_RESCALE + " (l is measured from the final m)")


# ------------------------------------------------------------------------ online_softmax

@exercise("online_softmax", points=4, forbid=SOFTMAX_FUNCTIONS)
def test_online_softmax_on_random_rows(learner, seed):
    gen = generator(seed)
    for shape, tile in [((5, 8 * randint(gen, 3, 6) + randint(gen, 1, 7)), randint(gen, 5, 8)),
                        ((2, 3, randint(gen, 40, 60)), 7), ((4, 20), 64), ((3, 12), 1)]:
        _check_online(learner, _scores(gen, shape), tile, "random")


@exercise("online_softmax", points=4, forbid=SOFTMAX_FUNCTIONS)
def test_online_softmax_on_large_scores(learner, seed):
    gen = generator(seed)
    x = _scores(gen, (4, randint(gen, 30, 50)), scale=1000.0)
    x[:, -1] = x.amax(-1) + 200          # the max arrives in the last tile: every l is rescaled
    _check_online(learner, x, 8, "scores ~ 1000")


@exercise("online_softmax", points=4, forbid=SOFTMAX_FUNCTIONS)
def test_online_softmax_with_minus_inf_entries(learner, seed):
    gen = generator(seed)
    n = randint(gen, 30, 45)
    x = _scores(gen, (5, n))
    x[torch.rand(x.shape, generator=gen) < 0.3] = float("-inf")      # a masked third
    x[:, 0] = 1.0                                                    # every row keeps a finite entry
    x[1, :] = float("-inf")
    x[1, 9:] = _scores(gen, (n - 9,))                                # row 1: its first tile all -inf
    x[3, :8] = float("-inf")                                         # row 3 too, the tile size 8
    _check_online(learner, x, 8, "with -inf entries")


@exercise("online_softmax", points=4, forbid=SOFTMAX_FUNCTIONS)
def test_online_softmax_rejects_a_bad_tile(learner, seed):
    tile = -randint(generator(seed), 0, 3)
    try:
        learner.call("online_softmax", torch.zeros(2, 5), tile)
    except LearnerError as exc:
        if "ValueError" in str(exc):
            return
        raise AssertionError(f"online_softmax(scores, tile={tile}) should raise ValueError; "
                             f"instead {exc}") from None
    raise AssertionError(f"online_softmax(scores, tile={tile}) returned; it should raise ValueError "
                         "(a tile needs at least one column)")


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


# ------------------------------------------------------------------------ softmax_kernel

BANNED_IN_KERNEL = {"torch", "numpy", "np", "ctypes", "eval", "exec", "getattr", "globals",
                    "__import__", "open", "setattr", "vars"}


def _kernel_source(learner) -> str | None:
    """The text of the learner's ``softmax_kernel`` cell; in a notebook's check(), which does not
    keep cell text, the kernel function's own source (None if neither can be had)."""
    source = learner.cell_source("softmax_kernel") if hasattr(learner, "cell_source") else None
    if source is None:
        kernel = getattr(learner, "namespace", {}).get("softmax_kernel")
        try:
            source = textwrap.dedent(inspect.getsource(getattr(kernel, "fn", None)))
        except (TypeError, OSError):
            return None
    return source


def _kernel_problem(source: str | None) -> str | None:
    """Why the cell is not a plain @triton.jit kernel without loops (None when it is)."""
    if source is None:
        return None
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        decorators = [ast.unparse(d) for d in getattr(node, "decorator_list", [])]
        if not (isinstance(node, ast.FunctionDef) and node.name == "softmax_kernel"
                and decorators in (["triton.jit"], ["jit"])):
            return ("the cell must hold imports and one function `softmax_kernel` decorated with "
                    f"@triton.jit, nothing else (found `{ast.unparse(node).splitlines()[0]}`)")
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor, ast.comprehension)):
            return ("no Python loops over elements in this kernel: the whole row is one BLOCK; "
                    "load it with tl.arange(0, BLOCK) and reduce with tl.max / tl.sum")
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node not in tree.body:
            return "the kernel body may not import modules: use tl operations only"
        if isinstance(node, ast.Name) and node.id in BANNED_IN_KERNEL:
            return f"the kernel body may not use `{node.id}`: use tl operations only"
    return None


def _launch_softmax(learner, gen, case):
    rows, n_cols = 5, randint(gen, 17, 100)
    if triton.next_power_of_2(n_cols) == n_cols:
        n_cols += 1
    dtype = torch.float16 if case == "float16" else torch.float32
    scale = {"large": 1000.0, "float16": 4.0}.get(case, 3.0)
    x = torch.randn(rows, n_cols + 3, generator=gen, dtype=torch.float64) * scale
    if case == "large":
        x -= 5000.0                                  # every score far below 0 as well as far apart
    if case == "minus_inf":
        x[torch.rand(x.shape, generator=gen) < 0.3] = float("-inf")
        x[:, randint(gen, 0, n_cols - 1)] = 0.5      # every row keeps a finite entry
    x = x.to(dtype)
    out = torch.full((rows, n_cols + 5), float("nan"), dtype=dtype)
    block = triton.next_power_of_2(n_cols)
    args = (x.to(DEVICE), out.to(DEVICE), n_cols, x.stride(0), out.stride(0))
    try:
        _, got, *_ = learner.launch("softmax_kernel", (rows,), *args, BLOCK=block)
    except LearnerError as exc:                  # launch() does not say why a cell failed; call() does
        why = getattr(learner, "cell_errors", {}).get("softmax_kernel")
        if why and "is not defined" in str(exc):
            raise LearnerError(f"`softmax_kernel` is not defined because its cell failed: {why}") from None
        raise
    return x[:, :n_cols].double(), got.cpu(), n_cols, block


@exercise("softmax_kernel", points=4, forbid=SOFTMAX_FUNCTIONS, timeout=60)
@pytest.mark.parametrize("case", ["random", "large", "minus_inf", "float16"])
def test_softmax_kernel(learner, seed, case):
    problem = _kernel_problem(_kernel_source(learner))
    if problem:
        raise AssertionError(problem)
    x, got, n_cols, block = _launch_softmax(learner, generator(seed + len(case)), case)
    expected = torch.softmax(x, dim=-1)
    name = f"out after softmax_kernel ({case}: 5 rows of {n_cols}, BLOCK = {block})"
    hint = None
    if got[:, :n_cols].isnan().any() and case == "large":
        hint = NO_MAX
    elif got[:, :n_cols].isnan().any():
        hint = "every one of the n_cols entries of every row must be written (the store's mask)"
    else:
        padded = torch.cat([x, torch.zeros(x.shape[0], block - n_cols, dtype=x.dtype)], 1)
        zero_tail = torch.softmax(padded, -1)[:, :n_cols]
        if torch.allclose(got[:, :n_cols].double(), zero_tail, rtol=1e-2, atol=1e-4):
            hint = ("the lanes past n_cols were loaded as 0, so they count in the max and the sum: "
                    "load them with other=float('-inf')")
    # float16 outputs round to ~5e-4; scores ~ -5000 lose ~4e-4 in x * log2(e) if exp2 is used
    tol = {"float16": 2e-3, "large": 1e-3}.get(case, 1e-5)
    assert_close(got[:, :n_cols], expected, name=name, rtol=tol, atol=tol * 1e-2, hint=hint)
    if not got[:, n_cols:].isnan().all():
        raise AssertionError(f"softmax_kernel wrote past the end of a row ({n_cols} columns, the "
                             "row stride is larger): mask the store with cols < n_cols")
