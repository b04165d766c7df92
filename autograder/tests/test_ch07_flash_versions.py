"""Grader for exercises/ch07_flash_versions.ipynb.

``pick_flash`` is compared with ``reference.calculators.flash_versions.pick_flash`` on every GPU of its
table; the decode exercises with attention computed in float64 in this process on fresh random
inputs (``torch.Generator().manual_seed(seed)``). When an answer is wrong, the grader computes
what the usual slips produce (no rescaling by exp(m_s - m), averaging the partial outputs, the
wrong K/V head under GQA, a dropped tail, NaN from an empty split) and names the one that
matches. The Triton kernel runs under the grader's launcher (grid, block size, layouts), with
its outputs poisoned with NaN, under the interpreter when there is no GPU.
"""
from __future__ import annotations

import math
import os

import torch

if not torch.cuda.is_available():   # `pytest` on this file alone: the solution's kernel is
    os.environ.setdefault("TRITON_INTERPRET", "1")   # defined after this, in the interpreter

from autograder.boundary.causes import LearnerError
from autograder.rules.feedback import assert_close
from autograder.rules.inputs import generator, qkv, randint
from autograder.rules.kernel_rules import require_tile_loop
from autograder.rules.plugin import exercise
from reference.kernels.torch_reference import naive_attention
from reference.calculators.flash_versions import GPU_GENERATIONS, HEAD_DIMS, pick_flash

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FORBIDDEN = ["torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax",
             "torch.nn.functional.scaled_dot_product_attention", "torch.Tensor.softmax",
             "torch.nn.attention.flex_attention.flex_attention"]
BLOCK_N = 16            # keys per tile in the grader's launch of decode_partial_kernel


# ------------------------------------------------------------------------------ pick_flash

def _check_choice(learner, gpu: str, training: bool, head_dim: int) -> None:
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
    generation = GPU_GENERATIONS[gpu]
    if generation.lower() not in got[1].lower():
        raise AssertionError(f"{call}: the version is right, but the reason {got[1]!r:.80} should "
                             f"name the GPU's architecture generation ({generation})")


@exercise("pick_flash", points=3)
def test_pick_flash_on_every_gpu_of_the_table(learner, seed):
    gen = generator(seed)
    for gpu in GPU_GENERATIONS:
        for training in (False, True):
            for head_dim in (64, 128, HEAD_DIMS[randint(gen, 0, len(HEAD_DIMS) - 1)]):
                _check_choice(learner, gpu, training, head_dim)


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


# ------------------------------------------------------------------ split_decode_attention

def _exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Unsplit attention of q [B, Hq, D] in float64 -> [B, Hq, D] (reference.kernels)."""
    return naive_attention(q.double()[:, :, None], k.double(), v.double())[0][:, :, 0]


def _chunks(n_keys: int, num_splits: int) -> list[tuple[int, int]]:
    chunk = -(-n_keys // num_splits)
    return [(min(s * chunk, n_keys), min((s + 1) * chunk, n_keys)) for s in range(num_splits)]


def _slips(q, k, v, num_splits: int) -> list[tuple[torch.Tensor, str]]:
    """(output, advice) of the usual mistakes, in float64."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    wide_k, wide_v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("bhd,bhnd->bhn", q, wide_k) / math.sqrt(q.shape[-1])
    parts = []
    for a, b in _chunks(k.shape[2], num_splits):
        if b > a:
            m = scores[..., a:b].amax(-1)
            p = torch.exp(scores[..., a:b] - m[..., None])
            parts.append((m, p.sum(-1), torch.einsum("bhn,bhnd->bhd", p, wide_v[:, :, a:b])))
    out = []
    if len(parts) > 1:
        out.append((sum(o for _, _, o in parts) / sum(l for _, l, _ in parts)[..., None],
                    "the partial states were added without rescaling: bring each split to the "
                    "common max m = max_s m_s first, weighting its l_s and o_s by exp(m_s - m)"))
        out.append((sum(o / l[..., None] for _, l, o in parts) / len(parts),
                    "the splits' normalised outputs were averaged; a split's weight is its share "
                    "of the softmax mass, exp(m_s - m) l_s / sum_s exp(m_s - m) l_s, not 1/S"))
    if group > 1:
        out.append((_exact(q, k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)),
                    f"query head h must read K/V head h // (Hq // Hkv) (here h // {group}); "
                    "repeat() pairs it with h % Hkv, use repeat_interleave or index h // group"))
    kept = k.shape[2] // num_splits * num_splits
    if 0 < kept < k.shape[2]:
        out.append((_exact(q, k[:, :, :kept], v[:, :, :kept]),
                    f"the last {k.shape[2] - kept} keys were dropped: a split holds "
                    "ceil(N / num_splits) keys, so the last one may be shorter, never cut"))
    return out


def _check_decode(learner, q, k, v, num_splits: int, *, large: bool = False) -> None:
    rtol = 1e-3 if large else 1e-4      # float32 rounding of scores near 100 is ~1e-5 absolute
    call = (f"split_decode_attention(q {list(q.shape)}, k/v {list(k.shape)}, "
            f"num_splits={num_splits})")
    got = learner.call("split_decode_attention", q, k, v, num_splits)
    expected = _exact(q, k, v)
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and got.is_floating_point():
        g = got.detach().cpu().double()
        if not torch.isfinite(g).all():
            if num_splits > k.shape[2] or any(a == b for a, b in _chunks(k.shape[2], num_splits)):
                raise AssertionError(f"{call} has NaN/inf; some splits hold no keys here. An empty "
                                     "split's state is (m, l, o) = (-inf, 0, 0): skip it, or make "
                                     "sure exp(-inf - (-inf)) is never computed")
            if large:
                group = q.shape[1] // k.shape[1]
                scores_max = (torch.einsum("bhd,bhnd->bhn", q.double(), k.double().repeat_interleave(
                    group, 1)) / math.sqrt(q.shape[-1])).max().item()
                raise AssertionError(f"{call} overflows on large scores (up to "
                                     f"{scores_max:.0f}): subtract each split's max "
                                     "before exp")
        elif not torch.allclose(g, expected, rtol=rtol, atol=1e-5):
            for wrong, advice in _slips(q, k, v, num_splits):
                if torch.allclose(g, wrong, rtol=rtol, atol=1e-5):
                    raise AssertionError(f"{call}: {advice}")
    assert_close(got, expected, name=call, rtol=rtol, atol=1e-5,
                 hint="each split gives (m, l, o) over its keys; merge with m = max m_s, "
                      "l = sum exp(m_s - m) l_s, o = sum exp(m_s - m) o_s, output o / l")


@exercise("split_decode_attention", points=4, forbid=FORBIDDEN)
def test_split_decode_matches_attention_for_every_split_count(learner, seed):
    gen = generator(seed + 1)
    for heads, kv_heads in ((4, 2), (6, 2), (3, 3)):
        n_keys = randint(gen, 20, 70)
        q, = qkv(gen, (2, heads, 16))[:1]
        k, v, _ = qkv(gen, (2, kv_heads, n_keys, 16))
        for num_splits in (1, 2, 3, randint(gen, 4, 9)):
            _check_decode(learner, q, k, v, num_splits)


@exercise("split_decode_attention", points=4, forbid=FORBIDDEN)
def test_split_decode_with_empty_splits(learner, seed):
    gen = generator(seed + 2)
    n_keys = randint(gen, 3, 7)
    q, = qkv(gen, (1, 4, 8))[:1]
    k, v, _ = qkv(gen, (1, 2, n_keys, 8))
    for num_splits in (n_keys + 1, 2 * n_keys + 3):
        _check_decode(learner, q, k, v, num_splits)


@exercise("split_decode_attention", points=4, forbid=FORBIDDEN)
def test_split_decode_on_large_scores(learner, seed):
    gen = generator(seed + 3)
    q, = qkv(gen, (1, 4, 16))[:1]
    k, v, _ = qkv(gen, (1, 1, 40, 16))
    _check_decode(learner, 8 * q, 8 * k, v, 3, large=True)   # scores beyond 88: exp overflows


# ------------------------------------------------------------------- decode_partial_kernel

def _states(q, k, v, num_splits: int, *, keep=None, rescale: bool = True, sm_scale: float):
    """float64 (m, l, o) per split, [B, Hq, S] and [B, Hq, S, D], the kernel's tile by tile
    (``keep(a, b)`` -> the key range a split really reads; ``rescale=False``: the slip)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    wide_k, wide_v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("bhd,bhnd->bhn", q, wide_k) * sm_scale
    m = q.new_full((*q.shape[:2], num_splits), float("-inf"))
    l, o = torch.zeros_like(m), q.new_zeros((*q.shape[:2], num_splits, q.shape[2]))
    for s, (a, b) in enumerate(_chunks(k.shape[2], num_splits)):
        a, b = keep(a, b) if keep else (a, b)
        for t in range(a, b, BLOCK_N):
            tile = scores[..., t:min(t + BLOCK_N, b)]
            m_new = torch.maximum(m[..., s], tile.amax(-1))
            alpha = torch.exp(m[..., s] - m_new) if rescale else torch.ones_like(m_new)
            p = torch.exp(tile - m_new[..., None])
            l[..., s] = l[..., s] * alpha + p.sum(-1)
            o[..., s, :] = o[..., s, :] * alpha[..., None] + torch.einsum(
                "bhn,bhnd->bhd", p, wide_v[:, :, t:t + p.shape[-1]])
            m[..., s] = m_new
    return m, l, o


def _same(got: tuple, want: tuple) -> bool:
    return all(torch.equal(torch.isinf(g), torch.isinf(w)) and torch.allclose(
        g.nan_to_num(neginf=0.0), w.nan_to_num(neginf=0.0), rtol=1e-4, atol=1e-5)
        for g, w in zip(got, want))


def _run_kernel(learner, gen, batch, heads, kv_heads, n_keys, dim, num_splits):
    q, = qkv(gen, (batch, heads, dim))[:1]
    k, v, _ = qkv(gen, (batch, kv_heads, n_keys, dim))
    q, k, v = (2 * t.float() for t in (q, k, v))
    poison = lambda *shape: torch.full(shape, float("nan"), device=DEVICE)  # noqa: E731
    m, l, o = poison(batch, heads, num_splits), poison(batch, heads, num_splits), \
        poison(batch, heads, num_splits, dim)
    scale, chunk = 1 / math.sqrt(dim), -(-n_keys // num_splits)
    try:
        args = learner.launch("decode_partial_kernel", (batch * heads, num_splits),
                              q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), m, l, o,
                              heads, kv_heads, n_keys, chunk, num_splits, scale,
                              HEAD_DIM=dim, BLOCK_N=BLOCK_N)
    except LearnerError as exc:   # launch() does not yet say why a cell failed to load (call() does)
        why = getattr(learner, "cell_errors", {}).get("decode_partial_kernel")
        if why and "is not defined" in str(exc):
            raise LearnerError(f"`decode_partial_kernel` is not defined because its cell failed: "
                               f"{why}") from None
        raise
    return (q, k, v, scale), tuple(t.cpu().double() for t in args[3:6])


def _check_kernel(learner, gen, batch, heads, kv_heads, n_keys, dim, num_splits):
    call = (f"decode_partial_kernel on q [{batch}, {heads}, {dim}], k/v [{batch}, {kv_heads}, "
            f"{n_keys}, {dim}], {num_splits} splits of {-(-n_keys // num_splits)} keys")
    (q, k, v, scale), got = _run_kernel(learner, gen, batch, heads, kv_heads, n_keys, dim, num_splits)
    require_tile_loop(learner, "decode_partial_kernel", "BLOCK_N",
                      "Work on whole tiles: one loop over the split's tiles, range(start, end, "
                      "BLOCK_N), with tl.arange offsets and tl.sum/tl.max over the tile, no loop "
                      "over single keys or dimensions")
    want = _states(q, k, v, num_splits, sm_scale=scale)
    if _same(got, want):
        merged_m = want[0].amax(-1, keepdim=True)          # the grader's merge (second stage)
        weight = torch.exp(got[0] - merged_m)
        out = (weight[..., None] * got[2]).sum(-2) / (weight * got[1]).sum(-1)[..., None]
        assert_close(out, _exact(q, k, v), name=f"merged output, {call}", rtol=1e-4, atol=1e-5)
        return
    if any(torch.isnan(t).any() for t in got):
        raise AssertionError(f"{call}: m, l or o still holds NaN (the grader poisons them): every "
                             "program must store its split's state, an empty split too "
                             "(m = -inf, l = 0, o = 0), and a state must never be 0/0 or inf - inf")
    slips = [
        (_states(q, k, v, num_splits, rescale=False, sm_scale=scale),
         "l and o were not rescaled when a tile raised the running max: multiply both by "
         "exp(m_old - m_new) before adding the new tile"),
        (_states(q, k.repeat(1, heads // kv_heads, 1, 1), v.repeat(1, heads // kv_heads, 1, 1),
                 num_splits, sm_scale=scale),
         "query head h read K/V head h % Hkv; under GQA it reads head h // (Hq // Hkv)"),
        (_states(q, k, v, num_splits, keep=lambda a, b: (a, a + (b - a) // BLOCK_N * BLOCK_N),
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
                     rtol=1e-4, atol=1e-5, hint="m = max score of the split, l = sum exp(s - m), "
                     "o = sum exp(s - m) v, with score = (q . k) * sm_scale")


@exercise("decode_partial_kernel", points=4, timeout=120)
def test_decode_kernel_with_several_tiles_per_split_and_gqa(learner, seed):
    gen = generator(seed + 4)
    _check_kernel(learner, gen, 1, 4, 2, randint(gen, 66, 90), 16, 2)


@exercise("decode_partial_kernel", points=4, timeout=120)
def test_decode_kernel_with_uneven_splits_and_groups_of_three(learner, seed):
    gen = generator(seed + 5)
    _check_kernel(learner, gen, 2, 6, 2, randint(gen, 35, 60), 32, 3)


@exercise("decode_partial_kernel", points=4, timeout=120)
def test_decode_kernel_with_empty_splits(learner, seed):
    gen = generator(seed + 6)
    _check_kernel(learner, gen, 1, 2, 1, randint(gen, 3, 6), 16, 8)
