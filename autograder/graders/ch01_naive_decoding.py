"""Grader for exercises/ch01_naive_decoding.ipynb.

Every expected value is computed here, in the grader process, from ``reference`` and from
inputs drawn with ``torch.Generator().manual_seed(seed)``; the learner only ever sees inputs.
When a result is wrong, the message tries to name the slip (by comparing with the results
that typical mistakes produce) before showing the numbers.
"""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from autograder.rules.feedback import PrerequisiteFailed
from autograder.rules.feedback import assert_close, assert_equal, assert_equal_tokens
from autograder.rules.inputs import generator, qkv, randint
from autograder.rules.plugin import exercise
from autograder.boundary.refs import ModelRef
from reference.decoding import generate, naive_work as reference_naive_work
from reference.model import build_tiny

VOCAB = 256  # the tiny model's vocabulary (byte tokenizer)
# torch's attention under its public names, and the attention modules: the quantizable
# MultiheadAttention of torch.ao (bmm and softmax in Python, which the operation limit allows)
# is guarded on its class, however the cell got one (torch.ao.quantization.prepare).
FORBIDDEN_ATTENTION = ["torch.nn.functional.scaled_dot_product_attention",
                       "torch.nn.functional.multi_head_attention_forward",
                       "torch.nn.attention.flex_attention.flex_attention",
                       "torch.nn.MultiheadAttention",
                       "torch.ao.nn.quantizable.MultiheadAttention._forward_impl"]


# --------------------------------------------------------------------------- naive_work

def _as_pair(result, call: str) -> tuple[int, int]:
    ok = isinstance(result, (tuple, list)) and len(result) == 2
    if ok:
        try:
            pair = tuple(int(x) for x in result)
            ok = all(float(x) == p for x, p in zip(result, pair))
        except (TypeError, ValueError):
            ok = False
    if not ok:
        raise AssertionError(
            f"{call} returned {result!r}; expected a pair of whole numbers "
            "(projected_positions, attention_cells)")
    return pair


def _naive_work_slips(prompt_len: int, n_new: int) -> dict[tuple[int, int], str]:
    """Result of each frequent mistake -> the advice for it."""
    lens = [prompt_len + i for i in range(n_new)]
    after = [L + 1 for L in lens]
    right = (sum(lens), sum(L * L for L in lens))
    slips = {
        (sum(after), sum(L * L for L in after)):
            "every step is counted one position too long. At step i the model runs over the "
            "P + i tokens that exist *before* the new token is appended (step 0 sees the prompt "
            "alone).",
        (sum(lens), sum(L * (L + 1) // 2 for L in lens)):
            "the attention count only covers the causal half of each score matrix. A plain "
            "implementation computes the full L x L matrix and masks it afterwards, so count "
            "L * L cells per step.",
        (right[1], right[0]):
            "the two numbers are swapped: return (projected_positions, attention_cells).",
        (sum(lens[:-1]), sum(L * L for L in lens[:-1])) if n_new else (-1, -1):
            "one step is missing: n_new tokens need n_new forward passes (steps i = 0 .. n_new - 1).",
        (sum(after), sum(L * (L + 1) // 2 for L in after)):
            "the loop counts after appending (one position too many per step) and only the "
            "causal half of each score matrix.",
    }
    slips.pop(right, None)
    return slips


def _check_naive_work(learner, prompt_len: int, n_new: int) -> None:
    call = f"naive_work({prompt_len}, {n_new})"
    got = _as_pair(learner.call("naive_work", prompt_len, n_new), call)
    expected = tuple(int(x) for x in reference_naive_work(prompt_len, n_new))
    if got == expected:
        return
    advice = _naive_work_slips(prompt_len, n_new).get(got)
    message = f"{call} returned {got}, expected {expected}"
    if advice:
        message += f": {advice}"
    else:
        message += (". Step i runs the model over L = P + i positions: add L to the projected "
                    "positions and L * L to the attention cells.")
    raise AssertionError(message)


@exercise("naive_work", points=2)
def test_naive_work_matches_reference_on_random_lengths(learner, seed):
    gen = generator(seed)
    cases = [(1, 0), (randint(gen, 2, 50), 0), (1, 1), (randint(gen, 2, 50), 1),
             (1, randint(gen, 2, 40))]
    cases += [(randint(gen, 1, 300), randint(gen, 2, 300)) for _ in range(6)]
    for prompt_len, n_new in cases:
        _check_naive_work(learner, prompt_len, n_new)


@exercise("naive_work", points=2)
def test_naive_work_triangle_of_one_token_prompt(learner, seed):
    # A one-token prompt and N new tokens: the projected positions form the triangle
    # 1 + 2 + ... + N = N(N + 1)/2 (5,050 for the book's N = 100), for any N.
    for n in (100, randint(generator(seed), 101, 2000)):
        got = _as_pair(learner.call("naive_work", 1, n), f"naive_work(1, {n})")
        assert_equal(got[0], n * (n + 1) // 2, name=f"naive_work(1, {n})[0]",
                     hint="with a one-token prompt step i runs over i + 1 positions, so the "
                          "projected positions form the triangle N(N+1)/2")
        _check_naive_work(learner, 1, n)


# ---------------------------------------------------------------------- causal_attention

def _attention64(q, k, v, *, scale=True, mask="causal", softmax_dim=-1):
    """Full-matrix attention in float64, optionally with one of the typical mistakes."""
    q, k, v = q.double(), k.double(), v.double()
    n = q.shape[-2]
    scores = q @ k.transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    if mask == "causal":
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    elif mask == "strict":
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(0), float("-inf"))
    return scores.softmax(dim=softmax_dim) @ v


def _reference_attention(q, k, v):
    """The answer, from PyTorch's fused attention in float64."""
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)


def _same(a, b, tol=1e-4) -> bool:
    """Elementwise closeness done by hand (a learner cell may have replaced torch.allclose)."""
    if not isinstance(a, torch.Tensor) or tuple(a.shape) != tuple(b.shape):
        return False
    a, b = a.detach().double(), b.detach().double()
    both_nan = torch.isnan(a) & torch.isnan(b)
    diff = torch.where(both_nan, torch.zeros_like(a), (a - b).abs())
    return not bool((diff > tol + tol * b.abs()).any()) and not bool(torch.isnan(diff).any())


def _diagnose_attention(out, q, k, v, name: str) -> str | None:
    """Advice when ``out`` looks like a known mistake, else None."""
    if not isinstance(out, torch.Tensor):
        return f"{name} must return a torch.Tensor, got {type(out).__name__}"
    if tuple(out.shape) != tuple(q.shape):
        return (f"{name} returned shape {tuple(out.shape)} for q, k, v of shape {tuple(q.shape)}; "
                "the output has one row per query: [..., T, D]")
    if torch.isnan(out).any():
        return (f"{name} returned NaN. Usually a row of the score matrix was masked entirely: "
                "position t must still see itself (mask only s > t, i.e. triu(..., diagonal=1)).")
    if _same(out, _reference_attention(q, k, v), 1e-5):
        return None  # right (a mistake that only shows on other inputs cannot be seen here)
    if _same(out, _attention64(q, k, v, mask="strict")):
        return "the mask hides the diagonal too: position t attends to s <= t, itself included"
    checks = [
        (dict(scale=False), "the scores are not divided by sqrt(D) (D = q.shape[-1])"),
        (dict(mask=None), "there is no causal mask: position t must not see positions s > t"),
        (dict(softmax_dim=-2), "the softmax runs over the query axis; normalise each row, dim=-1"),
        (dict(scale=False, mask=None), "the scores are neither scaled by 1/sqrt(D) nor masked"),
    ]
    for kwargs, advice in checks:
        if _same(out, _attention64(q, k, v, **kwargs)):
            return advice
    if _same(out, v) or _same(out, q):
        return "the result is one of the inputs: compute softmax(q k^T / sqrt(D)) v with a causal mask"
    return None


def _check_attention(learner, q, k, v, *, tol: float) -> None:
    out = learner.call("causal_attention", q, k, v)
    expected = _reference_attention(q, k, v)
    advice = _diagnose_attention(out, q, k, v, "causal_attention")
    if advice:
        raise AssertionError(f"causal_attention on shape {tuple(q.shape)}: {advice}")
    if out.dtype != q.dtype:
        raise AssertionError(f"causal_attention returned {out.dtype} for {q.dtype} inputs; "
                             "keep the input dtype")
    assert_close(out.double(), expected, name=f"causal_attention(q, k, v) for shape {tuple(q.shape)}",
                 atol=tol, rtol=tol,
                 hint="softmax(q k^T / sqrt(D)) with s > t masked to -inf, then times v")


@exercise("causal_attention", points=3, forbid=FORBIDDEN_ATTENTION)
def test_causal_attention_matches_reference(learner, seed):
    gen = generator(seed)
    shape = (randint(gen, 1, 3), randint(gen, 1, 4), randint(gen, 5, 24), randint(gen, 4, 32))
    _check_attention(learner, *qkv(gen, shape), tol=1e-5)


@exercise("causal_attention", points=3, forbid=FORBIDDEN_ATTENTION)
def test_causal_attention_any_leading_dims_and_one_token(learner, seed):
    gen = generator(seed + 1)
    for shape in [(randint(gen, 2, 12), randint(gen, 2, 16)),        # no leading dims
                  (2, 3, 2, randint(gen, 2, 9), 8),                   # three leading dims
                  (2, 1, 1, randint(gen, 2, 16))]:                   # a single position
        _check_attention(learner, *qkv(gen, shape), tol=1e-5)
    # float64 in, float64 out, and then the answer is exact to many digits
    _check_attention(learner, *qkv(gen, (1, 2, randint(gen, 3, 12), 8), torch.float64), tol=1e-10)


@exercise("causal_attention", points=3, forbid=FORBIDDEN_ATTENTION)
def test_causal_attention_ignores_the_future(learner, seed):
    gen = generator(seed + 2)
    n = randint(gen, 6, 16)
    cut = randint(gen, 1, n - 2)
    q, k, v = qkv(gen, (2, 2, n, 8))
    first = learner.call("causal_attention", q, k, v)
    advice = _diagnose_attention(first, q, k, v, "causal_attention")
    if advice:
        raise AssertionError(f"causal_attention on shape {tuple(q.shape)}: {advice}")
    k2, v2 = k.clone(), v.clone()
    k2[..., cut:, :] = torch.randn(k2[..., cut:, :].shape, generator=gen) * 5
    v2[..., cut:, :] = torch.randn(v2[..., cut:, :].shape, generator=gen) * 5
    second = learner.call("causal_attention", q, k2, v2)
    changed = (first[..., :cut, :] - second[..., :cut, :]).abs().max().item()
    if changed > 1e-5:
        raise AssertionError(
            f"changing keys/values at positions >= {cut} changed the outputs of earlier "
            f"positions (by up to {changed:.3g}): row t may only depend on positions s <= t")
    assert_close(second.double(), _reference_attention(q, k2, v2), name="causal_attention(q, k', v')",
                 atol=1e-5, rtol=1e-5,
                 hint="causal attention with new keys and values after position "
                      f"{cut - 1}")


# ------------------------------------------------------------------------ naive_generate

def _prompt(gen, low=1, high=10) -> list[int]:
    n = randint(gen, low, high)
    return [int(t) for t in torch.randint(0, VOCAB, (n,), generator=gen)]


def _expected_tokens(seed: int, prompt: list[int], n_new: int) -> list[int]:
    return [int(t) for t in generate(build_tiny(seed), list(prompt), n_new, use_cache=False)]


def _check_generate_tokens(learner, seed, prompt, n_new, got=None):
    """The tokens of ``naive_generate`` (called here unless its result ``got`` is given)."""
    if got is None:
        got = learner.call("naive_generate", ModelRef("tiny", seed), list(prompt), n_new)
    expected = _expected_tokens(seed, prompt, n_new)
    if isinstance(got, (list, tuple)) and len(got) == len(prompt) + n_new \
            and [int(t) for t in got[:len(prompt)]] == prompt:
        raise AssertionError("naive_generate returned the prompt followed by the new tokens; "
                             "return only the n_new generated ids")
    if isinstance(got, torch.Tensor):
        got = got.flatten().tolist()
    if not isinstance(got, (list, tuple)):
        raise AssertionError(f"naive_generate must return a list of ints, got {type(got).__name__}")
    if len(got) == n_new > 1 and list(got) != expected and got[0] == expected[0] \
            and all(t == got[0] for t in got):
        raise AssertionError(
            f"naive_generate(model, {prompt}, {n_new}) returned {list(got)}: the first token "
            f"right, then the same token {n_new - 1} more times. Each new token must be appended "
            "to the sequence (seq.append(token)) so that the next forward sees it; fed the same "
            "ids, a greedy model gives the same token at every step")
    assert_equal_tokens(list(got), expected,
                        name=f"naive_generate(model, {prompt}, {n_new})",
                        hint="greedy: the next id is the argmax of the logits' last row, "
                             "model(torch.tensor([ids]))[0, -1]")


@exercise("naive_generate", points=3)
def test_naive_generate_matches_reference_tokens(learner, seed):
    gen = generator(seed)
    _check_generate_tokens(learner, seed, _prompt(gen), randint(gen, 3, 8))


@exercise("naive_generate", points=3)
def test_naive_generate_reruns_the_whole_sequence(learner, seed):
    gen = generator(seed + 1)
    prompt, n_new = _prompt(gen, 2, 8), randint(gen, 3, 7)
    got = learner.call("naive_generate", ModelRef("tiny", seed), list(prompt), n_new)
    trace = [(tuple(shape), bool(cached)) for shape, cached in learner.last_trace]
    expected = [((1, len(prompt) + i), False) for i in range(n_new)]
    if trace == expected:  # the model calls (recorded by the grader) and the tokens
        _check_generate_tokens(learner, seed, prompt, n_new, got)
        return
    if any(cached for _, cached in trace):
        raise PrerequisiteFailed(
            "the model was given a KV cache. This exercise is the loop *without* a cache: call "
            "model(torch.tensor([ids])) on the whole sequence each step (the cache is chapter 2). "
            "The exercise scores 0 until no forward uses a cache",
            rule="no KV cache in the naive loop: re-run the whole sequence every step")
    if len(trace) != n_new:
        raise AssertionError(
            f"{n_new} new tokens took {len(trace)} model calls; the naive loop makes exactly one "
            "forward pass per generated token")
    lengths = [shape[-1] if shape else None for shape, _ in trace]
    if any(shape[:1] != (1,) for shape, _ in trace if shape):
        raise AssertionError(f"the model inputs had shapes {[s for s, _ in trace]}; feed a batch "
                             "of one sequence, torch.tensor([ids]) of shape [1, T]")
    if len(lengths) > 1 and all(n == len(prompt) for n in lengths):
        raise AssertionError(
            f"the model saw the same {len(prompt)} positions at every step (lengths {lengths}): "
            "the new token is never appended to the sequence. Append it (seq.append(token)) so "
            "that step i feeds the prompt plus the i tokens generated so far")
    if lengths[1:] and all(n == 1 for n in lengths[1:]):
        raise AssertionError(
            "after the first step only the newest token was fed to the model. Without a cache "
            "the model has no memory of earlier calls: feed the whole sequence (prompt plus "
            "everything generated so far) at every step")
    raise AssertionError(
        f"the model saw sequences of lengths {lengths}; expected {[s[1] for s, _ in expected]} "
        "(the prompt, then one token longer at every step)")


@exercise("naive_generate", points=3)
def test_naive_generate_one_token_and_a_longer_prompt(learner, seed):
    gen = generator(seed + 2)
    _check_generate_tokens(learner, seed, _prompt(gen, 1, 1), randint(gen, 2, 5))
    _check_generate_tokens(learner, seed, _prompt(gen, 20, 40), 1)
