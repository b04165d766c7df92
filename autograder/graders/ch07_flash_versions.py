"""Grader for exercises/ch07_flash_versions.ipynb.

``pick_flash`` is compared with ``reference.calculators.flash_versions.pick_flash`` on every GPU of
its table. Flash decoding is graded as its two stages, and the grader owns the loop between
them: it cuts the keys into splits of sizes drawn per run and hands ``decode_split`` ONE split
at a time (a copy of that split only), checking every split's state (m, l, o) against float64;
it hands ``merge_splits`` partial states it computed itself (empty splits included) and checks
the merged output against attention in float64. ``decode_partial_kernel`` runs under the
grader's launcher (grid, BLOCK_N and HEAD_DIM drawn per run, splits several tiles long with a
ragged tail, outputs poisoned with NaN, under the interpreter when there is no GPU); every
split's (m, l, o) it stores is compared with float64. When an answer is wrong, the grader
computes what the usual slips produce and names the one that matches. A fixed tile or a
two-pass reduction gives the same numbers: the kernel's source must loop over tiles of BLOCK_N
(``kernel_rules``, friendly early messages), and its loads and stores, counted by the
interpreter, must be one pass's: each K and V element of a split read once by each query head's
program, one tile per load, each state stored once (``kernel_rules.require_traffic``).
"""
from __future__ import annotations

import math
import os
import re

import torch

if not torch.cuda.is_available():   # `pytest` on this file alone: the solution's kernel is
    os.environ.setdefault("TRITON_INTERPRET", "1")   # defined after this, in the interpreter

from autograder.boundary.causes import NOT_IMPLEMENTED, LearnerError
from autograder.rules.feedback import PrerequisiteFailed, assert_close
from autograder.rules.forbid import SOFTMAX_FAMILY
from autograder.rules.gpu_targets import Build, planned, require_gpu_build
from autograder.rules.inputs import climbing_scores, generator, large_rows, qkv, randint
from autograder.rules.kernel_rules import (fixed_size_aranges, kernel_source, key_loops,
                                           loop_problem, require_traffic)
from autograder.rules.plugin import exercise
from reference.kernels.torch_reference import naive_attention
from reference.calculators.flash_versions import GPU_GENERATIONS, HEAD_DIMS, pick_flash

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FORBIDDEN = [*SOFTMAX_FAMILY,  # and attention itself
    "torch.nn.functional.cross_entropy",            # cross_entropy(x, 0) + x[0] is logsumexp(x)
    "torch.nn.functional.scaled_dot_product_attention",
    "torch.nn.functional.multi_head_attention_forward",
    "torch.nn.attention.flex_attention.flex_attention"]
NEG_INF = float("-inf")
CATCH_ALL = 5           # a pick_flash reason naming this many generations was written for any GPU


# ------------------------------------------------------------------------------ pick_flash

# What decides the version on each generation, besides the generation itself: the feature or
# limit a reason must state (a pattern, case-insensitive) and how the grader says it.
DECIDING = {
    "Turing": (r"Ampere|FA-?2|FlashAttention[- ]?2",
               "FlashAttention-2 (what rules it out: it needs Ampere or newer)"),
    "Ampere": (r"Hopper|FA-?3|FlashAttention[- ]?3", "why not FlashAttention-3 (Hopper-only)"),
    "Ada": (r"Hopper|FA-?3|FlashAttention[- ]?3", "why not FlashAttention-3 (Hopper-only)"),
    "Hopper": (r"TMA|WGMMA|warp[- ]speciali[sz]|FP8|sm_?90|compute capability 9",
               "the Hopper features FlashAttention-3 is built on (TMA, WGMMA, warp specialisation)"),
    "Blackwell": (r"tensor memory|TMEM|tcgen05|asynchronous MMA|async MMA|sm_?100|"
                  r"compute capability 10", "the Blackwell features FlashAttention-4 is built on "
                  "(asynchronous MMA, tensor memory)"),
}
HEAD_DIM_WORDS = r"head[ _-]?dim|head dimension|\b64\b"


def _check_choice(learner, gpu: str, training: bool, head_dim: int) -> str:
    """The learner's version for one case, checked; returns its reason."""
    call = f"pick_flash({gpu!r}, training={training}, head_dim={head_dim})"
    got = learner.call("pick_flash", gpu, training, head_dim)
    expected = pick_flash(gpu, training, head_dim)
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[1], str)
            and isinstance(got[0], int) and not isinstance(got[0], bool)):
        raise AssertionError(f"{call} returned {got!r:.120}; return a pair (version: int, "
                             "reason: str), version 0 when no FlashAttention version fits")
    if got[0] != expected.version:
        raise AssertionError(f"{call} returned version {got[0]}, expected {expected.version}. "
                             f"Why: {expected.reason}")
    return got[1]


def _check_reason(gpu: str, training: bool, head_dim: int, reason: str) -> None:
    """The reason names the GPU's generation, no other generation that gets the same version
    here (a reason written from the version alone), and what decides the version on it."""
    call = f"pick_flash({gpu!r}, training={training}, head_dim={head_dim})"
    generation, version = GPU_GENERATIONS[gpu], pick_flash(gpu, training, head_dim).version
    named = {g for g in set(GPU_GENERATIONS.values())
             if re.search(rf"\b{g}\b", reason, flags=re.IGNORECASE)}
    if generation not in named:
        raise AssertionError(f"{call}: the version is right, but the reason {reason!r:.80} should "
                             f"name the GPU's architecture generation ({generation})")
    if len(named) >= CATCH_ALL:
        raise PrerequisiteFailed(
            f"{call}: the reason {reason!r:.100} names {len(named)} architecture generations; a "
            f"reason says which one this GPU is ({generation}) and why that decides the version, "
            "so one written for every GPU at once says nothing", rule="a reason for this GPU")
    own = DECIDING.get(generation, ("", ""))[0]
    stated = [p for p in dict.fromkeys(p for p, _ in DECIDING.values())
              if p != own and re.search(p, reason, re.IGNORECASE)]
    if len(stated) >= len({p for p, _ in DECIDING.values()} - {own}):
        raise PrerequisiteFailed(
            f"{call}: the reason {reason!r:.120} states what decides the version on every other "
            f"generation too; a reason says what decides it on this GPU, a {generation} (a "
            "neighbour's feature as the contrast is fine; all of them is a template)",
            rule="a reason for this GPU")
    alike = {GPU_GENERATIONS[g] for g in GPU_GENERATIONS
             if pick_flash(g, training, head_dim).version == version} - {generation}
    if named & alike:
        raise AssertionError(
            f"{call}: the reason {reason!r:.100} also names {', '.join(sorted(named & alike))}, "
            f"which gets version {version} too: a reason written from the version alone. Say "
            f"what decides it for this GPU, a {generation}")
    if generation == "Turing" and training and not re.search(HEAD_DIM_WORDS, reason, re.IGNORECASE):
        raise AssertionError(f"{call}: the reason {reason!r:.100} should say that the head "
                             "dimension decides here: FlashAttention 1.x trains on Turing only up "
                             "to head dim 64")
    pattern, what = DECIDING.get(generation, ("", ""))
    if not re.search(pattern, reason, re.IGNORECASE):
        raise AssertionError(f"{call}: the reason {reason!r:.100} names {generation} but not what "
                             f"decides the version there: {what}")


@exercise("pick_flash", points=3)
def test_pick_flash_on_every_gpu_of_the_table(learner, seed):
    gen = generator(seed)
    for gpu in GPU_GENERATIONS:
        for training in (False, True):
            for head_dim in (64, 128, HEAD_DIMS[randint(gen, 0, len(HEAD_DIMS) - 1)]):
                _check_choice(learner, gpu, training, head_dim)


@exercise("pick_flash", points=3)
def test_pick_flash_reason_states_what_decides(learner, seed):
    """One GPU of every generation, drawn, for training and inference at drawn head dims (one
    above 64 and one at most 64): a version shared by several generations (0: Pascal, Volta,
    Turing training above 64; 2: Ampere, Ada) does not tell the reason which GPU it is."""
    gen = generator(seed + 10)
    by_generation: dict[str, list[str]] = {}
    for gpu, generation in GPU_GENERATIONS.items():
        by_generation.setdefault(generation, []).append(gpu)
    small = [d for d in HEAD_DIMS if d <= 64]
    large = [d for d in HEAD_DIMS if d > 64]
    for gpus in by_generation.values():
        gpu = gpus[randint(gen, 0, len(gpus) - 1)]
        for training in (False, True):
            for dims in (small, large):
                head_dim = dims[randint(gen, 0, len(dims) - 1)]
                _check_reason(gpu, training, head_dim, _check_choice(learner, gpu, training, head_dim))


@exercise("pick_flash", points=3)
def test_pick_flash_accepts_any_case(learner, seed):
    for gpu in ("h100", "a100", "B200", "rtx 2080"):
        got, expected = learner.call("pick_flash", gpu, False, 64), pick_flash(gpu, False, 64)
        if not isinstance(got, (tuple, list)) or not got or got[0] != expected.version:
            raise AssertionError(f"pick_flash({gpu!r}, False, 64) returned {got!r:.100}: GPU "
                                 "names are case-insensitive ('h100' is the H100)")


@exercise("pick_flash", points=3)
def test_pick_flash_rejects_bad_input(learner, seed):
    cases = [(("TPU v5", False, 64), "ValueError", "an unknown GPU"),
             (("H300", True, 64), "ValueError", "an unknown GPU"),
             (("A100", False, 100), "ValueError", "head_dim is not a multiple of 8"),
             (("A100", False, 256), "ValueError", "head_dim above 128 is outside the table"),
             (("A100", "yes", 64), "TypeError", "training is not a bool")]
    for args, error, why in cases:
        call = f"pick_flash{args!r}"
        try:
            result = learner.call("pick_flash", *args)
        except LearnerError as exc:
            if f"raised {error}" not in str(exc):
                raise AssertionError(f"{call} should raise {error} ({why}); instead {exc}") from None
            continue
        raise AssertionError(f"{call} returned {result!r:.80}; it should raise {error} ({why})")



# ------------------------------------------------------------- flash decoding, the two stages

def _exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Unsplit attention of q [B, Hq, D] in float64 -> [B, Hq, D] (reference.kernels)."""
    return naive_attention(q.double()[:, :, None], k.double(), v.double())[0][:, :, 0]


def _cuts(gen, n_keys: int, num_splits: int, *, empty: bool = False) -> list[tuple[int, int]]:
    """Key ranges of ``num_splits`` splits of drawn sizes covering [0, n_keys): each holds at
    least one key, unless ``empty`` (then some may hold none)."""
    if empty:
        inner = sorted(randint(gen, 0, n_keys) for _ in range(num_splits - 1))
    else:
        inner = sorted(torch.randperm(n_keys - 1, generator=gen)[:num_splits - 1].add(1).tolist())
    edges = [0, *inner, n_keys]
    return list(zip(edges[:-1], edges[1:]))


def _state64(q, k, v, *, scale: float | None = None, repeat: bool = False):
    """float64 (m [B, Hq], l [B, Hq], o [B, Hq, D]) of one split's keys k, v [B, Hkv, n, D];
    (-inf, 0, 0) without keys. ``scale`` (default 1/sqrt(D)) and ``repeat`` (query head h reads
    K/V head h % Hkv) give the slips."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = (k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)) if repeat else \
        (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
    if k.shape[2] == 0:
        m = q.new_full(q.shape[:2], NEG_INF)
        return m, torch.zeros_like(m), torch.zeros_like(q)
    scores = torch.einsum("bhd,bhnd->bhn", q, k) * (scale or 1 / math.sqrt(q.shape[-1]))
    m = scores.amax(-1)
    p = torch.exp(scores - m[..., None])
    return m, p.sum(-1), torch.einsum("bhn,bhnd->bhd", p, v)


def _same(got: tuple, want: tuple, rtol: float = 1e-4) -> bool:
    """Equal states: the same -inf entries, the rest within rtol (and atol 1e-5)."""
    return all(torch.equal(torch.isinf(g), torch.isinf(w)) and torch.allclose(
        g.nan_to_num(neginf=0.0), w.nan_to_num(neginf=0.0), rtol=rtol, atol=1e-5)
        for g, w in zip(got, want))


def _as_state(got, call: str, shapes: list[list[int]]) -> tuple[torch.Tensor, ...]:
    if not (isinstance(got, (tuple, list)) and len(got) == 3
            and all(isinstance(t, torch.Tensor) for t in got)):
        raise AssertionError(f"{call} returned {type(got).__name__}; return the tuple (m, l, o) "
                             f"of tensors, shapes {shapes[0]}, {shapes[1]} and {shapes[2]}")
    for name, t, shape in zip("mlo", got, shapes):
        if list(t.shape) != shape:
            raise AssertionError(f"{call}: {name} has shape {list(t.shape)}, expected {shape} "
                                 "(m and l: one number per sequence and query head; o: a vector)")
    return tuple(t.detach().cpu().double() for t in got)


def _split_slips(q, k, v, want) -> list[tuple[tuple, str]]:
    m, l, o = want
    shift = torch.exp(m)
    out = [((m, l, o / l[..., None]),
            "o was divided by l: return the unnormalised sum of exp(x_j - m) v_j; the merge "
            "divides once, by the merged l"),
           ((m, l * shift, o * shift[..., None]),
            "l and o were summed from exp(x_j), not exp(x_j - m): subtract the split's max m "
            "before exp (exp overflows above ~88)"),
           ((torch.zeros_like(m), l * shift, o * shift[..., None]),
            "m is 0, not the split's max score: subtract m = max_j x_j before exp and return it"),
           (_state64(q, k, v, scale=1.0),
            "the scores were not scaled: x_j = q . k_j / sqrt(D)")]
    if q.shape[1] != k.shape[1]:
        out.append((_state64(q, k, v, repeat=True),
                    f"query head h must read K/V head h // (Hq // Hkv) (here h // "
                    f"{q.shape[1] // k.shape[1]}); repeat() pairs it with h % Hkv, use "
                    "repeat_interleave or index h // group"))
    return out


def _check_split(learner, q, k, v, what: str, *, rtol: float = 1e-4) -> tuple[torch.Tensor, ...]:
    """Hand decode_split ONE split (copies: the call sees no other key) and check its state."""
    call = f"decode_split(q {list(q.shape)}, k/v {list(k.shape)}) on {what}"
    batch, heads, dim = q.shape
    got = learner.call("decode_split", q.clone(), k.clone(), v.clone())
    got = _as_state(got, call, [[batch, heads], [batch, heads], [batch, heads, dim]])
    want = _state64(q, k, v)
    if _same(got, want, rtol):
        return got
    if not all(torch.isfinite(g).all() for g in got[1:]):
        if k.shape[2] == 0:
            raise AssertionError(f"{call} has NaN/inf: a split without keys has the state "
                                 "(m, l, o) = (-inf, 0, 0); return it as such (its max has no "
                                 "value, and exp(-inf - (-inf)) is NaN)")
        raise AssertionError(f"{call} overflows on scores up to {want[0].max().item():.0f}: "
                             "subtract the split's max m before exp (exp overflows above ~88 in "
                             "float32, above ~709 in float64)")
    for state, advice in _split_slips(q, k, v, want):
        if _same(got, state, rtol):
            raise AssertionError(f"{call}: {advice}")
    for name, g, w in zip("mlo", got, want):
        assert_close(g.nan_to_num(neginf=-1e30), w.nan_to_num(neginf=-1e30), name=f"{name}, {call}",
                     rtol=rtol, atol=1e-5, hint="m = max_j x_j, l = sum_j exp(x_j - m), "
                     "o = sum_j exp(x_j - m) v_j over this split's keys, x_j = q . k_j / sqrt(D)")
    return got


def _merge64(m, l, o) -> torch.Tensor:
    """The merge in float64 (the grader's second stage over the learner's states)."""
    weight = torch.exp(m - m.amax(-1, keepdim=True))
    return (weight[..., None] * o).sum(-2) / (weight * l).sum(-1)[..., None]


@exercise("decode_split", points=2, forbid=FORBIDDEN)
def test_decode_split_gives_each_splits_state(learner, seed):
    gen = generator(seed + 1)
    for heads, kv_heads in ((4, 2), (6, 2), (3, 3)):
        n_keys, num_splits = randint(gen, 20, 70), randint(gen, 2, 6)
        q, = qkv(gen, (2, heads, 16))[:1]
        k, v, _ = qkv(gen, (2, kv_heads, n_keys, 16))
        states = [_check_split(learner, q, k[:, :, a:b], v[:, :, a:b],
                               f"split {s} of {num_splits} (keys {a} to {b - 1} of {n_keys})")
                  for s, (a, b) in enumerate(_cuts(gen, n_keys, num_splits))]
        merged = _merge64(*(torch.stack(parts, 2) for parts in zip(*states)))
        assert_close(merged, _exact(q, k, v), name=f"the grader's merge of your {num_splits} "
                     f"states (q [2, {heads}, 16], {n_keys} keys)", rtol=1e-4, atol=1e-5)


@exercise("decode_split", points=2, forbid=FORBIDDEN)
def test_decode_split_without_keys_and_with_one(learner, seed):
    gen = generator(seed + 2)
    q, = qkv(gen, (1, 4, 8))[:1]
    k, v, _ = qkv(gen, (1, 2, randint(gen, 2, 9), 8))
    for n in (0, 1):
        try:
            _check_split(learner, q, k[:, :, :n], v[:, :, :n], f"a split of {n} key(s)")
        except LearnerError as exc:
            if n or NOT_IMPLEMENTED in str(exc):
                raise
            raise AssertionError(f"decode_split on a split without keys (k/v [1, 2, 0, 8]): {exc}. "
                                 "The max of no scores has no value: return the empty state "
                                 "(m, l, o) = (-inf, 0, 0) yourself") from None


def _large_split(gen, n_keys: int):
    """q [1, 4, 16], k, v [1, 1, n_keys, 16] whose scores sit near +-1200 and +-1000 (one per
    head) and climb or fall by 32 per key (see ``climbing_scores``), so that no shift but each
    head's own max (not a constant, not the first key's score, not float64's range) keeps them
    finite."""
    q, = qkv(gen, (1, 4, 16))[:1]
    k, v, _ = qkv(gen, (1, 1, n_keys, 16))
    q, k = climbing_scores(q, k, torch.arange(n_keys),
                           offsets=torch.tensor([1200.0, -1200.0, 1000.0, -1000.0]),
                           directions=torch.tensor([1.0, -1.0, -1.0, 1.0]))
    return q, k, v


@exercise("decode_split", points=2, forbid=FORBIDDEN)
def test_decode_split_on_large_scores(learner, seed):
    gen = generator(seed + 3)
    q, k, v = _large_split(gen, randint(gen, 30, 50))
    _check_split(learner, q, k, v, "scores in the thousands, far beyond where exp overflows "
                 "(~88 in float32, ~709 in float64) and underflows", rtol=1e-3)


def _states_of_scores(x: torch.Tensor, v: torch.Tensor, cuts) -> tuple[torch.Tensor, ...]:
    """float64 states [B, H, S], [B, H, S], [B, H, S, D] of scores x [B, H, N], values v."""
    parts = []
    for a, b in cuts:
        if a == b:
            m = x.new_full(x.shape[:2], NEG_INF)
            parts.append((m, torch.zeros_like(m), v.new_zeros((*x.shape[:2], v.shape[-1]))))
            continue
        m = x[..., a:b].amax(-1)
        p = torch.exp(x[..., a:b] - m[..., None])
        parts.append((m, p.sum(-1), torch.einsum("bhn,bhnd->bhd", p, v[:, :, a:b])))
    return tuple(torch.stack(t, 2) for t in zip(*parts))


def _merge_slips(m, l, o) -> list[tuple[torch.Tensor, str]]:
    has_keys = l > 0
    weight = torch.exp(m - m.amax(-1, keepdim=True))
    normalised = (o / l.clamp_min(1e-300)[..., None])
    return [
        (o.sum(-2) / l.sum(-1)[..., None],
         "the partial states were added without rescaling: bring each split to the common max "
         "M = max_s m_s first, weighting its l_s and o_s by exp(m_s - M)"),
        ((normalised * has_keys[..., None]).sum(-2) / has_keys.sum(-1)[..., None],
         "the splits' normalised outputs were averaged; a split's weight is its share of the "
         "softmax mass, exp(m_s - M) l_s / sum_s exp(m_s - M) l_s, not 1/S"),
        ((weight[..., None] * normalised).sum(-2) / weight.sum(-1)[..., None],
         "each split's o_s / l_s was weighted by exp(m_s - M) alone; its weight is "
         "exp(m_s - M) l_s (divide the weighted sum of o_s by the weighted sum of l_s)"),
        ((weight[..., None] * o).sum(-2),
         "the weighted sum of the o_s was not divided by the merged l = sum_s exp(m_s - M) l_s"),
    ]


def _check_merge(learner, gen, x, what: str, cuts, *, rtol: float = 1e-4) -> None:
    batch, heads, n_keys = x.shape
    v = torch.randn(batch, heads, n_keys, 8, generator=gen, dtype=torch.float64)
    m, l, o = _states_of_scores(x, v, cuts)
    call = (f"merge_splits(m, l [{batch}, {heads}, {len(cuts)}], o [{batch}, {heads}, "
            f"{len(cuts)}, 8]) on {what}")
    got = learner.call("merge_splits", m.float(), l.float(), o.float())
    expected = torch.einsum("bhn,bhnd->bhd", torch.softmax(x, -1), v)
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and got.is_floating_point():
        g = got.detach().cpu().double()
        if not torch.isfinite(g).all():
            if (l == 0).any():
                raise AssertionError(f"{call} has NaN/inf. Empty splits, (m, l, o) = (-inf, 0, 0), "
                                     "are among the states: their weight exp(m_s - M) is 0, but "
                                     "o_s / l_s is 0/0; divide once, by the merged l, at the end")
            raise AssertionError(f"{call} has NaN/inf on split maxima from "
                                 f"{m.min().item():.0f} to {m.max().item():.0f}: exp(m_s) "
                                 "overflows (or underflows to 0/0); weight by exp(m_s - M) with "
                                 "M = max_s m_s")
        if not torch.allclose(g, expected, rtol=rtol, atol=1e-5):
            for wrong, advice in _merge_slips(m, l, o):
                if torch.allclose(g, wrong, rtol=rtol, atol=1e-5):
                    raise AssertionError(f"{call}: {advice}")
    assert_close(got, expected, name=call, rtol=rtol, atol=1e-5,
                 hint="M = max_s m_s, out = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s")


@exercise("merge_splits", points=2, forbid=FORBIDDEN)
def test_merge_splits_of_drawn_sizes(learner, seed):
    gen = generator(seed + 4)
    for _ in range(2):
        n_keys, num_splits = randint(gen, 12, 60), randint(gen, 2, 8)
        x = 3 * torch.randn(2, 3, n_keys, generator=gen, dtype=torch.float64)
        _check_merge(learner, gen, x, f"{num_splits} splits of drawn sizes ({n_keys} keys)",
                     _cuts(gen, n_keys, num_splits))


@exercise("merge_splits", points=2, forbid=FORBIDDEN)
def test_merge_splits_with_empty_splits(learner, seed):
    gen = generator(seed + 5)
    n_keys, num_splits = randint(gen, 8, 30), randint(gen, 4, 7)
    cuts = [(0, 0), *_cuts(gen, n_keys, num_splits - 2, empty=True), (n_keys, n_keys)]
    x = 3 * torch.randn(1, 4, n_keys, generator=gen, dtype=torch.float64)
    _check_merge(learner, gen, x, f"{num_splits} splits, the first and the last without keys", cuts)


@exercise("merge_splits", points=2, forbid=FORBIDDEN)
def test_merge_splits_on_large_maxima(learner, seed):
    gen = generator(seed + 6)
    n_keys = randint(gen, 20, 50)
    sign = torch.tensor([1.0, -1.0], dtype=torch.float64)[:, None, None]
    climb = 40 * torch.arange(n_keys, dtype=torch.float64)   # the maxima grow split by split
    x = 30 * torch.randn(2, 2, n_keys, generator=gen, dtype=torch.float64) \
        + sign * (randint(gen, 900, 1200) + climb)
    # split maxima far above and far below where exp overflows or underflows, float64 included
    # (~709, ~-745), and hundreds apart from the first split's: only M = max_s m_s keeps them finite
    _check_merge(learner, gen, x, "split maxima in the thousands, far above and far below 0",
                 _cuts(gen, n_keys, 4), rtol=1e-3)


# ------------------------------------------------------------------- decode_partial_kernel

KERNEL = "decode_partial_kernel"
SIZES = ((8, 16), (16, 16), (16, 32))   # (BLOCK_N, HEAD_DIM) that a run draws from
ONE_PASS = "one pass over the split's tiles of BLOCK_N keys, rescaling l and o as the max grows"


def _kernel_case(gen, splits_with_keys: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, HEAD_DIM, chunk, n_keys) drawn: every split spans 3 to 5 whole tiles and a
    ragged one (longer than HEAD_DIM too), the last split with keys is shorter."""
    block_n, dim = SIZES[randint(gen, 0, len(SIZES) - 1)]
    chunk = randint(gen, 3, 5) * block_n + randint(gen, 1, block_n - 1)
    return block_n, dim, chunk, chunk * (splits_with_keys - 1) + randint(gen, 1, chunk - 1)


def _states(q, k, v, bounds, block_n: int, *, sm_scale: float, tile_end=None,
            rescale: bool = True, zero_tail: bool = False):
    """float64 (m, l, o) per split, [B, Hq, S] and [B, Hq, S, D], the kernel's tile by tile.
    Slips: ``tile_end(t, b, n)`` -> where a tile's keys really end; ``rescale=False``; and
    ``zero_tail``: the lanes past the split's end score 0 (their K and V loaded as 0)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    wide_k, wide_v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("bhd,bhnd->bhn", q, wide_k) * sm_scale
    m = q.new_full((*q.shape[:2], len(bounds)), NEG_INF)
    l, o = torch.zeros_like(m), q.new_zeros((*q.shape[:2], len(bounds), q.shape[2]))
    for s, (a, b) in enumerate(bounds):
        for t in range(a, b, block_n):
            end = tile_end(t, b, k.shape[2]) if tile_end else min(t + block_n, b)
            tile, values = scores[..., t:end], wide_v[:, :, t:end]
            if zero_tail and end - t < block_n:
                pad = block_n - (end - t)
                tile = torch.cat([tile, tile.new_zeros((*tile.shape[:-1], pad))], -1)
                values = torch.cat([values, values.new_zeros((*values.shape[:2], pad,
                                                              values.shape[-1]))], 2)
            m_new = torch.maximum(m[..., s], tile.amax(-1))
            alpha = torch.exp(m[..., s] - m_new) if rescale else torch.ones_like(m_new)
            p = torch.exp(tile - m_new[..., None])
            l[..., s] = l[..., s] * alpha + p.sum(-1)
            o[..., s, :] = o[..., s, :] * alpha[..., None] + torch.einsum("bhn,bhnd->bhd", p, values)
            m[..., s] = m_new
    return m, l, o


def _method_problem(source: str | None, block_n: int) -> None:
    """PrerequisiteFailed when the kernel's source does not loop over BLOCK_N-key tiles: a loop
    over single keys, a tile of a size the cell fixes, no loop (the numbers alone cannot tell
    these from the real thing; a second pass shows in the traffic, ``_require_one_pass``)."""
    if not source:
        return
    try:
        problem = loop_problem(source, KERNEL, "BLOCK_N")
    except SyntaxError:
        return
    if problem:
        raise PrerequisiteFailed(
            f"{KERNEL}: {problem}. Work on whole tiles: one loop over the split's tiles, "
            "range(start, end, BLOCK_N), with tl.arange offsets and tl.sum/tl.max over the "
            "tile, no loop over single keys or dimensions", rule=ONE_PASS)
    fixed = fixed_size_aranges(source, KERNEL)
    if fixed:
        raise PrerequisiteFailed(
            f"{KERNEL}: {fixed[0]} is a tile whose size the cell fixes. The launcher says how "
            f"big a tile is (BLOCK_N keys, here {block_n}; HEAD_DIM dimensions) and how long a "
            "split is (chunk keys, many tiles): use tl.arange(0, BLOCK_N) and "
            "tl.arange(0, HEAD_DIM), and loop over the split's tiles", rule=ONE_PASS)
    loops = key_loops(source, KERNEL)
    if loops is None:
        return                                  # not a kernel: refused at launch
    if not loops:
        raise PrerequisiteFailed(
            f"{KERNEL} has no loop over the split's keys: one tile covers only the splits that "
            "happen to fit in it, and a split is chunk keys long, many tiles. Loop "
            "`for tile in range(start, end, BLOCK_N)` and update the running m, l, o per tile",
            rule=ONE_PASS)


def _require_one_pass(learner, k: torch.Tensor, group: int, block_n: int) -> None:
    """PrerequisiteFailed unless the launch read each K and V element once per query head of
    its group (one program per head and split), one tile per load, and stored each state once."""
    once = torch.full(k.shape, group, dtype=torch.int32)
    advice = ("one pass with a running max reads it once: that is the point of the online "
              "softmax (when a tile raises the max, multiply l and o by exp(m_old - m_new) "
              "before adding the tile)")
    require_traffic(learner, KERNEL, rule=ONE_PASS,
                    reads={"K": (1, once, "per split", advice), "V": (2, once, "per split", advice)},
                    outputs={"m": 3, "l": 4, "o": 5},
                    tiles={name: (block_n * k.shape[-1], f"BLOCK_N={block_n} keys of HEAD_DIM="
                                  f"{k.shape[-1]}") for name in ("K", "V")})


def _launch(learner, q, k, v, bounds, chunk, block_n):
    batch, heads, dim = q.shape
    poison = lambda *shape: torch.full(shape, float("nan"), device=DEVICE)  # noqa: E731
    m, l, o = poison(batch, heads, len(bounds)), poison(batch, heads, len(bounds)), \
        poison(batch, heads, len(bounds), dim)
    try:
        args = learner.launch(KERNEL, (batch * heads, len(bounds)),
                              q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), m, l, o,
                              heads, k.shape[1], k.shape[2], chunk, len(bounds), 1 / math.sqrt(dim),
                              HEAD_DIM=dim, BLOCK_N=block_n)
    except LearnerError as exc:   # launch() does not yet say why a cell failed to load (call() does)
        why = getattr(learner, "cell_errors", {}).get(KERNEL)
        if why and "is not defined" in str(exc):
            raise LearnerError(f"`{KERNEL}` is not defined because its cell failed: {why}") from None
        raise
    return tuple(t.cpu().double() for t in args[3:6])


def _check_kernel(learner, gen, batch, heads, kv_heads, splits_with_keys, num_splits,
                  large: bool = False):
    """One launch on drawn sizes; ``large``: scores in the thousands (``climbing_scores``), far
    beyond where exp overflows and underflows in float32 and float64 alike."""
    block_n, dim, chunk, n_keys = _kernel_case(gen, splits_with_keys)
    source = kernel_source(learner, KERNEL)
    _method_problem(source, block_n)
    q, = qkv(gen, (batch, heads, dim))[:1]
    k, v, _ = qkv(gen, (batch, kv_heads, n_keys, dim))
    if large:
        rows = (batch, heads)
        offsets, directions = large_rows(gen, rows)
        q, k = climbing_scores(q, k, torch.arange(n_keys), offsets, directions)
    else:
        q, k, v = (2 * t.float() for t in (q, k, v))
    rtol = 1e-3 if large else 1e-4   # fp32 scores in the thousands: ~1e-4 absolute
    bounds = [(min(s * chunk, n_keys), min((s + 1) * chunk, n_keys)) for s in range(num_splits)]
    call = (f"{KERNEL} with BLOCK_N={block_n}, HEAD_DIM={dim} on q [{batch}, {heads}, {dim}], "
            f"k/v [{batch}, {kv_heads}, {n_keys}, {dim}], {num_splits} splits of chunk={chunk} keys"
            + (", scores in the thousands, climbing or falling by 32 per key" if large else ""))
    got = _launch(learner, q, k, v, bounds, chunk, block_n)
    scale = 1 / math.sqrt(dim)
    want = _states(q, k, v, bounds, block_n, sm_scale=scale)
    if _same(got, want, rtol):
        _require_one_pass(learner, k, heads // kv_heads, block_n)
        weight = torch.exp(got[0] - want[0].amax(-1, keepdim=True))   # the grader's merge
        out = (weight[..., None] * got[2]).sum(-2) / (weight * got[1]).sum(-1)[..., None]
        assert_close(out, _exact(q, k, v), name=f"merged output, {call}", rtol=rtol, atol=1e-5)
        return
    stored = torch.isfinite(got[0])   # the split's max was written: l and o must be finite there
    if any((~torch.isfinite(t) & (stored[..., None] if t.dim() > stored.dim() else stored)).any()
           for t in got[1:]):
        raise AssertionError(f"{call}: l or o is inf or NaN where the split's max m is finite, on "
                             f"scores up to {want[0].max().item():.0f}: exp of a raw score above "
                             "~88 overflows float32 (~709 in float64). Keep a running max m "
                             "and take exp(s - m); when a tile raises it, rescale l and o by "
                             "exp(m_old - m_new)")
    if any(torch.isnan(t).any() for t in got):
        raise AssertionError(f"{call}: m, l or o still holds NaN (the grader poisons them): every "
                             "program must store its split's state, an empty split too "
                             "(m = -inf, l = 0, o = 0), and a state must never be 0/0 or inf - inf")
    slips = [
        (_states(q, k, v, bounds, block_n, rescale=False, sm_scale=scale),
         "l and o were not rescaled when a tile raised the running max: multiply both by "
         "exp(m_old - m_new) before adding the new tile"),
        (_states(q, k, v, bounds, block_n, zero_tail=True, sm_scale=scale),
         "the keys past the split's end (the masked lanes of its last tile) scored 0, not -inf, "
         "so each adds exp(0 - m) to l (and can raise m to 0): set their scores to -inf with "
         "tl.where(keys < end, scores, float('-inf')) before the max and the exp"),
        (_states(q, k, v, bounds, block_n, tile_end=lambda t, b, n: min(t + block_n, n),
                 sm_scale=scale),
         "the last tile of a split read on into the next split's keys: mask with the split's "
         "end, keys < min(start + chunk, n_keys), not with n_keys"),
        (_states(q, k.repeat(1, heads // kv_heads, 1, 1), v.repeat(1, heads // kv_heads, 1, 1),
                 bounds, block_n, sm_scale=scale),
         "query head h read K/V head h % Hkv; under GQA it reads head h // (Hq // Hkv)"),
        (_states(q, k, v, [(a, a + (b - a) // block_n * block_n) for a, b in bounds], block_n,
                 sm_scale=scale),
         "the split's last, partial tile was skipped: loop over every tile up to the split's end "
         "and mask the keys beyond it (keys < end)"),
        ((want[0], want[1], want[2] / want[1][..., None]),
         "o was divided by l in the kernel; store the unnormalised sum exp(s - m) v (the merge "
         "divides once, by the merged l)"),
        ((want[0] * math.log2(math.e), want[1], want[2]),
         "m is in log2 units; store the max of the scores (q . k) * sm_scale themselves"),
    ]
    for states, advice in slips:
        if _same(got, states):
            raise AssertionError(f"{call}: {advice}")
    for name, g, w in zip("mlo", got, want):
        assert_close(g.nan_to_num(neginf=-1e30), w.nan_to_num(neginf=-1e30), name=f"{name}, {call}",
                     rtol=rtol, atol=1e-5, hint="m = max score of the split, l = sum exp(s - m), "
                     "o = sum exp(s - m) v, with score = (q . k) * sm_scale")


@exercise(KERNEL, points=4, timeout=120)
def test_decode_kernel_with_several_tiles_per_split_and_gqa(learner, seed):
    gen = generator(seed + 7)
    _check_kernel(learner, gen, 1, 4, 2, 2, 2)
    _check_kernel(learner, gen, 1, 4, 2, 2, 2, large=True)


@exercise(KERNEL, points=4, timeout=120)
def test_decode_kernel_with_uneven_splits_and_groups_of_three(learner, seed):
    gen = generator(seed + 8)
    _check_kernel(learner, gen, 2, 3, 1, 3, 3)


@exercise(KERNEL, points=4, timeout=120)
def test_decode_kernel_with_empty_splits(learner, seed):
    gen = generator(seed + 9)
    _check_kernel(learner, gen, 1, 2, 1, 2, 4)


def _decode_build(label: str, dim: int, block_n: int) -> Build:
    """A launch like the tests' (4 query heads on 2 K/V heads, 3 splits of 333 keys), fp32."""
    q, k, state = torch.empty(1, 4, dim), torch.empty(1, 2, 1000, dim), torch.empty(1, 4, 3, dim)
    return Build(label, (q, k, k, state, state, state, 4, 2, 1000, 334, 3, dim ** -0.5),
                 {"HEAD_DIM": dim, "BLOCK_N": block_n})


DECODE_BUILDS = planned(KERNEL, [
    _decode_build("grader: fp32 D=16, BLOCK_N=8", 16, 8),   # the smallest and largest of SIZES
    _decode_build("grader: fp32 D=32, BLOCK_N=16", 32, 16),
    _decode_build("GPU tile: fp32 D=128, BLOCK_N=64", 128, 64)])
DECODE_BUILD_ADVICE = ("A program holds one K and one V tile [BLOCK_N, HEAD_DIM] and its running o [HEAD_DIM] "
                       "at a time; tl.sum over a tile's keys goes through a little shared memory. Load one K "
                       "and one V tile per step, not the whole split")


@exercise(KERNEL, points=4, timeout=120, costly=True)
def test_decode_kernel_compiles_for_a_real_gpu(learner, seed):
    """Built (not run) for a T4, an A100 and an H100 at the tests' tiles and at a GPU-sized one:
    it must compile and fit one of them; the report shows shared memory, registers and spills."""
    require_gpu_build(learner, KERNEL, DECODE_BUILDS, DECODE_BUILD_ADVICE)
