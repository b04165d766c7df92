"""Grader for exercises/ch10_speculative_decoding.ipynb.

Expected values come from ``reference.speculative`` and ``reference.decoding`` in the grader
process, on inputs drawn from ``torch.Generator().manual_seed(seed)``. Wrong answers are compared
with what the usual slips produce (the token-matching rule, resampling from p, no bonus token,
parent-only or causal masks) and the message names the slip that matches.
"""
from __future__ import annotations

import math

import torch

from autograder.boundary.causes import LearnerError
from autograder.rules.feedback import as_number, assert_close, assert_equal, assert_equal_tokens
from autograder.rules.inputs import generator, randint
from autograder.rules.plugin import exercise
from autograder.boundary.refs import CacheRef, ModelRef
from reference import speculative as ref
from reference.decoding import generate
from reference.model import build_tiny


def _distributions(gen, vocab: int, sparse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Two probability vectors [vocab]; `sparse` zeroes a few entries of each (as top-k does)."""
    logits = torch.randn(2, vocab, generator=gen, dtype=torch.float64) * 1.5
    if sparse:
        logits[torch.rand(2, vocab, generator=gen) < 0.3] = -math.inf
        logits[:, 0] = 0.0  # at least one entry survives in each
    return tuple(torch.softmax(logits, -1).float())


def _judge(call: str, got: float, expected: float, slips: list[tuple[float, str]], rule: str) -> None:
    if math.isclose(got, expected, rel_tol=1e-5, abs_tol=1e-6):
        return
    for value, advice in slips:
        if math.isclose(got, value, rel_tol=1e-5, abs_tol=1e-6) and not math.isclose(value, expected, abs_tol=1e-6):
            raise AssertionError(f"{call} returned {got:.6g}, expected {expected:.6g}: {advice}")
    raise AssertionError(f"{call} returned {got:.6g}, expected {expected:.6g}. {rule}")


# ------------------------------------------------------------------------- acceptance_rate

@exercise("acceptance_rate", points=2)
def test_acceptance_rate_is_the_overlap_of_p_and_q(learner, seed):
    gen = generator(seed)
    for sparse in (False, True, True):
        p, q = _distributions(gen, randint(gen, 4, 60), sparse)
        got = as_number(learner.call("acceptance_rate", p, q), name="acceptance_rate(p, q)",
                        kind="a float")
        p64, q64 = p.double(), q.double()
        _judge("acceptance_rate(p, q)", got, ref.acceptance_rate(p, q), [
            (float((p64 * q64).sum()), "that is the chance that a draw from p EQUALS a draw from q "
                                       "(the token-matching rule); the rejection test accepts x with "
                                       "probability min(1, p(x)/q(x)), so alpha = sum min(p, q)"),
            (float(torch.maximum(p64, q64).sum()), "max instead of min"),
            (float(0.5 * (p64 - q64).abs().sum()), "that is the total-variation distance; alpha = 1 - TV")],
            "alpha = sum over the vocabulary of min(p(x), q(x))")
    got = as_number(learner.call("acceptance_rate", p, p), name="acceptance_rate(p, p)", kind="a float")
    _judge("acceptance_rate(p, p)", got, 1.0, [],
           "a draft equal to the target is always accepted: alpha = 1")


# ------------------------------------------------------------------------- expected_tokens

@exercise("expected_tokens", points=2)
def test_expected_tokens_counts_the_accepted_drafts_and_one_more(learner, seed):
    gen = generator(seed)
    cases = [(0.8, 5), (1.0, randint(gen, 1, 8)), (0.0, randint(gen, 1, 8))]
    cases += [(float(torch.rand((), generator=gen)), randint(gen, 1, 10)) for _ in range(3)]
    for alpha, k in cases:
        call = f"expected_tokens({alpha:.4g}, {k})"
        got = as_number(learner.call("expected_tokens", alpha, k), name=call, kind="a float")
        no_bonus = sum(alpha ** j for j in range(k))
        _judge(call, got, ref.expected_tokens(alpha, k), [
            (no_bonus, "the target's own token is missing: every pass adds one token after the "
                       "accepted drafts (the correction, or the bonus when all k pass), so the sum "
                       "runs over alpha^0 .. alpha^k"),
            (float(k * alpha), "k * alpha assumes every draft is tested; after the first rejection "
                               "the rest are discarded")],
            "E[tokens] = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha), and k + 1 at alpha = 1")


# --------------------------------------------------------------------- accept_and_residual

@exercise("accept_and_residual", points=3)
def test_accept_probability_and_residual_make_the_target_distribution(learner, seed):
    gen = generator(seed)
    for case in ("dense", "sparse", "sparse", "equal"):
        p, q = _distributions(gen, randint(gen, 5, 40), case == "sparse")
        if case == "equal":   # nothing is ever rejected: max(0, p - q) is all zeros
            q = p.clone()
        support = torch.nonzero(q > 0).flatten()
        x = int(support[randint(gen, 0, len(support) - 1)])
        result = learner.call("accept_and_residual", p, q, x)
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise AssertionError("accept_and_residual must return a pair (accept_probability, residual)")
        accept, residual = result
        call = f"accept_and_residual(p, q, {x})"
        _judge(f"the accept probability of {call}", as_number(accept, name=call, kind="a float"),
               min(1.0, float(p[x]) / float(q[x])),
               [(float(p[x]), "p(x) is the chance that a token drawn from the target matches x "
                              "(the token-matching rule): it accepts too rarely where q(x) < p(x) and "
                              "the output is not distributed as p")],
               "accept x with probability min(1, p(x) / q(x))")
        expected = (p - q).clamp_min(0.0)
        expected = expected / expected.sum() if case != "equal" else p
        hint = "the residual is max(0, p - q) divided by its sum"
        if case == "equal":
            hint = ("with p == q, max(0, p - q) is all zeros (x is always accepted): return p "
                    "itself rather than dividing by a sum of 0")
        elif isinstance(residual, torch.Tensor) and residual.shape == p.shape:
            if torch.allclose(residual.double(), p.double(), atol=1e-6):
                hint = ("this is p itself: resampling from p after a rejection counts the mass "
                        "min(p, q) twice; draw from max(0, p - q), normalised")
            elif torch.allclose(residual.double(), (p - q).clamp_min(0.0).double(), atol=1e-6):
                hint = "max(0, p - q) must be normalised to sum to 1"
        assert_close(residual, expected, name=f"the residual of {call}", rtol=1e-4, atol=1e-6, hint=hint)


# ---------------------------------------------------------------------- tree_attention_mask

def _random_tree(gen, n: int) -> list[int]:
    return [-1] + [randint(gen, 0, i - 1) for i in range(1, n)]


@exercise("tree_attention_mask", points=2)
def test_tree_mask_shows_each_node_its_ancestors(learner, seed):
    gen = generator(seed)
    for parents in ([-1, 0, 0, 1, 1, 2], _random_tree(gen, randint(gen, 6, 12)), [-1, 0, 1, 2]):
        got = learner.call("tree_attention_mask", list(parents))
        expected = ref.tree_attention_mask(list(parents))
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and not torch.equal(got.bool(), expected):
            parent_only = torch.eye(len(parents), dtype=torch.bool)
            for i, parent in enumerate(parents):
                if parent >= 0:
                    parent_only[i, parent] = True
            if torch.equal(got.bool(), parent_only):
                raise AssertionError(f"parents={parents}: each node sees only itself and its parent; "
                                     "it must see the whole path to the root (grandparents too)")
            if torch.equal(got.bool(), torch.ones_like(expected).tril()):
                raise AssertionError(f"parents={parents}: this is the causal mask; a node must not see "
                                     "earlier nodes of other branches, only its own ancestors")
        assert_equal(got.tolist() if isinstance(got, torch.Tensor) else got,
                     expected.tolist(), name=f"tree_attention_mask({parents})",
                     hint="mask[i][j] is True when j is i or an ancestor of i")


# --------------------------------------------------------------------- speculative_generate

ROLLBACK = ("after each verification cut the target's cache back to the kept tokens "
            "(cache.truncate): the keys of rejected drafts must not stay")


def _run(learner, seed: int, draft_seed: int, prompt: list[int], n_new: int, k: int):
    """The learner's tokens, every forward of the target model and every forward of the draft
    model (recorded grader-side, whatever cache they went into: the grader's caches or ones
    made with new_cache)."""
    target, draft = ModelRef("tiny", seed), ModelRef("tiny", draft_seed, role="draft")
    max_len = len(prompt) + n_new + k + 1
    try:
        got = learner.call("speculative_generate", target, draft, list(prompt), n_new, k,
                           CacheRef(seed, max_len), CacheRef(draft_seed, max_len))
    except LearnerError as exc:
        if "KV cache full" not in str(exc):
            raise
        raise AssertionError(f"speculative_generate: {exc}. A cache filled up: {ROLLBACK}; cut "
                             "the draft's cache back to the kept tokens too") from None
    if any(f.cache is None for f in learner.trace):
        raise AssertionError("a forward ran without a cache: pass cache=target_cache or "
                             "cache=draft_cache to every model call")
    target_id, draft_id = learner.store.model_id(target), learner.store.model_id(draft)
    return (list(got) if isinstance(got, tuple) else got), \
        [f for f in learner.trace if f.model == target_id], \
        [f for f in learner.trace if f.model == draft_id]


def _check_verification(target_forwards: list, k: int) -> None:
    """The target reads the prompt once (one forward into an empty cache); every later forward
    is a verification pass of at most k + 1 positions, and some pass verifies drafts (more than
    one position): plain greedy decoding, into any cache, is not speculative decoding."""
    prefills = [f for f in target_forwards if f.cache_length == 0]
    passes = [f for f in target_forwards if f.cache_length > 0]
    if len(prefills) > 1:
        raise AssertionError(f"the target started {len(prefills)} times from an empty cache: feed "
                             "the prompt once, then only [last token, drafts] per pass")
    if any(f.shape[-1] > k + 1 for f in passes):
        raise AssertionError(f"a target pass fed more than k + 1 = {k + 1} positions")
    if passes and all(f.shape[-1] == 1 for f in passes):
        raise AssertionError("no target pass verified drafts (every pass fed one position): this is "
                             "plain greedy decoding. Feed [last token, d_1 .. d_k] to the target in "
                             "ONE pass and keep the drafts up to the first it disagrees with")


def _check_drafts_and_rollback(target_forwards: list, prompt: list[int], target_seed: int,
                               draft_seed: int, n_new: int, k: int) -> None:
    """Every part of the technique, pass by pass: a verification pass feeds the last kept token
    (the token the pass before decided: its correction or bonus) and then ALL the drafts of the
    round (k of them, fewer only where fewer tokens remain to be made), not one pass per draft;
    those drafts are the draft model's own greedy proposals from the kept context (not guesses
    from anywhere else); the target's cache is cut back to the kept tokens before the next pass
    (the agreeing drafts and nothing after: the rollback); the kept tokens follow the greedy
    rule (the drafts up to the first the target disagrees with)."""
    target, draft = build_tiny(target_seed), build_tiny(draft_seed)
    cached: list[int] = []             # what the target's cache holds, replayed from the trace
    expected_length = None
    last_kept = None                   # the token the pass before decided (fed first next)
    for number, f in enumerate(target_forwards):
        if expected_length is not None and f.cache_length != expected_length:
            raise AssertionError(
                f"target pass {number}: its cache held {f.cache_length} tokens, but after the last "
                f"verification {expected_length} were kept (the context and the agreeing drafts). "
                f"{ROLLBACK}")
        context = cached[:f.cache_length]
        fed = list(f.tokens)
        if f.cache_length == 0 and fed in (list(prompt), list(prompt[:-1])):   # the prefill
            cached, expected_length = fed, len(fed)
            last_kept = prompt[-1] if len(fed) < len(prompt) else \
                int(target(torch.tensor([fed]))[0, -1].argmax())
            continue
        if last_kept is not None and fed[0] != last_kept:
            raise AssertionError(
                f"target pass {number} fed {fed[0]} first, but the last kept token is {last_kept} "
                "(the target's own token from the pass before: its correction, or the bonus): a "
                "verification pass feeds [last kept token, d_1 .. d_k]")
        drafts = fed[1:]
        made = len(context) + 1 - len(prompt)     # output tokens decided before this pass
        wanted = min(k, n_new - made - 1)
        if len(drafts) < wanted:
            raise AssertionError(
                f"target pass {number} verified {len(drafts)} draft(s) where {wanted} were due "
                f"(k = {k}, {n_new - made} tokens still to make): the target must check all the "
                "round's drafts in ONE pass over [last token, d_1 .. d_k], not a pass per draft")
        if drafts:
            proposed = generate(draft, context + fed[:1], len(drafts))
            if drafts != proposed:
                raise AssertionError(
                    f"target pass {number} verified {drafts}, but the draft model proposes "
                    f"{proposed} from the kept tokens: a verification pass feeds the last kept "
                    "token and the draft model's k greedy proposals, exactly those")
        logits = target(torch.tensor([context + fed]))[0, len(context):]
        verdicts = logits.argmax(-1).tolist()   # the target's token after each fed position
        accepted = next((i for i, (d, t) in enumerate(zip(drafts, verdicts)) if d != t), len(drafts))
        cached = context + fed
        expected_length = len(context) + 1 + accepted
        last_kept = verdicts[accepted]


def _check_draft_rollback(draft_forwards: list) -> None:
    """The draft's cache is cut back too, not rebuilt: the draft model reads each position of
    the sequence once. A correct rollback never makes it read again a token after the same
    tokens (what follows the kept tokens is a rejected draft, and the correction differs from
    it); re-reading the sequence into a new cache, or after cutting back further than the
    rejected drafts, does."""
    held: dict[int | None, list[int]] = {}    # what each of the draft's caches holds, replayed
    seen: set[tuple[int, ...]] = set()         # every prefix the draft model has read
    for f in draft_forwards:
        context = held.get(f.cache, [])[:f.cache_length]
        fed = list(f.tokens)
        for j in range(len(fed)):
            prefix = tuple(context + fed[:j + 1])
            if prefix in seen:
                raise AssertionError(
                    f"the draft model read again token {fed[j]} at position {len(prefix) - 1}, "
                    "which it had already read after the same tokens (into a new cache, or after "
                    "cutting its cache back further than the rejected drafts): cut the draft's "
                    "cache back to the kept tokens (draft_cache.truncate) and feed it only what "
                    "it has not seen")
            seen.add(prefix)
        held[f.cache] = context + fed


@exercise("speculative_generate", points=10, timeout=60)
def test_speculative_generate_equals_greedy_decoding(learner, seed):
    """Output equal to the target's greedy tokens with a draft that always agrees (the bonus
    path) and one that rarely does (the rejection and rollback path)."""
    gen = generator(seed)
    target = build_tiny(seed)
    for draft_seed in (seed, seed + 1):
        prompt = torch.randint(0, 256, (randint(gen, 3, 9),), generator=gen).tolist()
        n_new, k = randint(gen, 10, 16), randint(gen, 2, 4)
        got, target_forwards, draft_forwards = _run(learner, seed, draft_seed, prompt, n_new, k)
        what = "a draft equal to the target" if draft_seed == seed else "a different draft"
        assert_equal_tokens(got, generate(target, prompt, n_new),
                            name=f"speculative_generate with {what}, k={k}", hint=ROLLBACK)
        _check_verification(target_forwards, k)
        _check_drafts_and_rollback(target_forwards, prompt, seed, draft_seed, n_new, k)
        _check_draft_rollback(draft_forwards)


@exercise("speculative_generate", points=10, timeout=60)
def test_speculative_generate_verifies_k_drafts_per_target_pass(learner, seed):
    """With a draft equal to the target every draft is accepted: each target pass must emit
    k + 1 tokens (k drafts and the bonus), so (k + 1)^2 tokens take k + 1 passes and a prefill."""
    gen = generator(seed + 1)
    prompt = torch.randint(0, 256, (randint(gen, 3, 9),), generator=gen).tolist()
    k = randint(gen, 2, 3)
    n_new = (k + 1) ** 2
    got, target_forwards, draft_forwards = _run(learner, seed, seed, prompt, n_new, k)
    assert_equal_tokens(got, generate(build_tiny(seed), prompt, n_new),
                        name=f"speculative_generate with a draft equal to the target, k={k}")
    _, stats = ref.speculative_generate(build_tiny(seed), build_tiny(seed), prompt, n_new, k=k)
    if len(target_forwards) > stats.target_passes + 1:
        raise AssertionError(
            f"{len(target_forwards)} target forwards for {n_new} tokens with k={k} and a draft that "
            f"always agrees, where a prefill and {stats.target_passes} passes suffice: when all k "
            "drafts are accepted the same pass also gives the bonus token (the target's argmax "
            "after the last draft)")
    _check_verification(target_forwards, k)
    _check_drafts_and_rollback(target_forwards, prompt, seed, seed, n_new, k)
    _check_draft_rollback(draft_forwards)
