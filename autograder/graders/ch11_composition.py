"""Grader for exercises/ch11_composition.ipynb (the capstone: cache, batching, prefix sharing,
speculation).

The learner gets the grader's tiny model as a proxy; every forward is recorded here (shape, cache
id, cache length before the call), so what is checked about *how* the replies were computed rests
on grader-side state. Expected tokens come from ``reference.decoding.generate`` (greedy, one
request alone) on the same model; inputs are drawn from ``torch.Generator().manual_seed(seed)``.

The proxies carry a contiguous batched cache whose rows share one length, so batching here means
rows of equal length (no paged pool, no ragged batch); speculation is verified through
``cache.truncate``.
"""
from __future__ import annotations

import torch

from autograder.rules.feedback import assert_equal_tokens
from autograder.rules.inputs import generator, randint
from autograder.rules.plugin import exercise
from autograder.boundary.refs import ModelRef
from reference.decoding import generate
from reference.model import build_tiny

VOCAB = 256  # the tiny model's vocabulary
TIMEOUT = 60  # seconds per learner call: every forward is a round trip to the grader


def _ids(gen, n: int) -> list[int]:
    return [int(t) for t in torch.randint(0, VOCAB, (n,), generator=gen)]


def _rows(got, n_rows: int, what: str) -> list[list[int]]:
    if not isinstance(got, (list, tuple)) or len(got) != n_rows \
            or not all(isinstance(r, (list, tuple)) for r in got):
        raise AssertionError(f"{what} must return a list of {n_rows} lists of token ids "
                             f"(one per request), got {type(got).__name__}")
    return [list(r) for r in got]


def _shapes(trace) -> list[tuple[int, ...]]:
    return [f.shape for f in trace]


# ------------------------------------------------------------------------ batched_generate

@exercise("batched_generate", points=3, timeout=TIMEOUT)
def test_batched_generate_equals_each_prompt_alone_in_n_new_batched_calls(learner, seed):
    gen = generator(seed)
    batch, length, n_new = randint(gen, 2, 4), randint(gen, 3, 10), randint(gen, 3, 6)
    prompts = [_ids(gen, length) for _ in range(batch)]
    got = _rows(learner.call("batched_generate", ModelRef("tiny", seed), prompts, n_new),
                batch, "batched_generate")
    model = build_tiny(seed)
    for b, prompt in enumerate(prompts):
        assert_equal_tokens(got[b], generate(model, prompt, n_new), name=f"row {b} of batched_generate",
                            hint="row b's next token is the argmax of row b's LAST logits "
                                 "(logits[:, -1]); feed each row its own newest token, shape [B, 1]")
    shapes, expected = _shapes(learner.trace), [(batch, length)] + [(batch, 1)] * (n_new - 1)
    if shapes == expected and len({f.cache for f in learner.trace}) == 1 and learner.trace[0].cache:
        return
    if len(shapes) == batch * n_new or all(s[0] == 1 for s in shapes):
        raise AssertionError(f"the model saw {len(shapes)} calls of batch {sorted({s[0] for s in shapes})} "
                             f"for {batch} prompts: the prompts were served one at a time. Make one "
                             f"cache with model.new_cache({batch}, max_len) and feed all rows together")
    raise AssertionError(f"expected one prefill of shape {expected[0]} then {n_new - 1} calls of shape "
                         f"({batch}, 1), all through one cache; the model saw {shapes}")


# ------------------------------------------------------------------ shared_prefix_generate

@exercise("shared_prefix_generate", points=3, timeout=TIMEOUT)
def test_shared_prefix_runs_the_prefix_once(learner, seed):
    gen = generator(seed + 1)
    batch, n_prefix, n_suffix, n_new = (randint(gen, 2, 4), randint(gen, 6, 14), randint(gen, 2, 5),
                                        randint(gen, 2, 5))
    prefix, suffixes = _ids(gen, n_prefix), [_ids(gen, n_suffix) for _ in range(batch)]
    got = _rows(learner.call("shared_prefix_generate", ModelRef("tiny", seed), prefix, suffixes, n_new),
                batch, "shared_prefix_generate")
    model = build_tiny(seed)
    for b, suffix in enumerate(suffixes):
        assert_equal_tokens(got[b], generate(model, prefix + suffix, n_new),
                            name=f"row {b} of shared_prefix_generate",
                            hint="the copied prefix must sit at positions 0..P-1 of every row, in "
                                 "every layer, before the suffixes are fed (append layer by layer, "
                                 "k and v expanded to the batch)")
    trace = learner.trace
    fed = sum(f.shape[0] * f.shape[1] for f in trace)
    ideal = n_prefix + batch * n_suffix + batch * (n_new - 1)
    calls = f"(P = {n_prefix}, S = {n_suffix}, B = {batch}; the model saw {_shapes(trace)})"
    expected = [(1, n_prefix), (batch, n_suffix)] + [(batch, 1)] * (n_new - 1)
    batched = trace[1:]
    lengths = [n_prefix] + [n_prefix + n_suffix + i for i in range(n_new - 1)]  # before each call
    if _shapes(trace) == expected and trace[0].cache is not None and trace[0].cache_length == 0 \
            and batched[0].cache is not None and len({f.cache for f in batched}) == 1 \
            and [f.cache_length for f in batched] == lengths:
        return
    if trace and trace[0].shape == (1, n_prefix) and all(f.shape[0] == 1 for f in batched):
        raise AssertionError(f"after the prefix the requests were served one at a time {calls}: "
                             f"copy the prefix's keys and values into every row of a batch-{batch} "
                             f"cache, then run the suffixes as ONE [{batch}, {n_suffix}] call and "
                             f"each decode step as one [{batch}, 1] call")
    if any(s == (batch, n_prefix + n_suffix) for s in _shapes(trace)) or fed >= batch * n_prefix:
        raise AssertionError(f"the prefix was computed for every row {calls}: {fed} positions fed "
                             f"where {ideal} suffice. Run it once with batch 1, then copy its keys and "
                             "values into each row of the batched cache")
    raise AssertionError(f"expected the calls {expected}: the prefix into an empty cache, then "
                         f"the batch through one batched cache that starts with the prefix "
                         f"{calls}")


# ---------------------------------------------------------------------------------- serve

def _workload(gen):
    """Requests of 2-3 prompt lengths, 2 * max_batch per length, long and short replies
    alternating within a length (so groups cut in arrival order waste steps), lengths interleaved
    at random; and the batch limit."""
    max_batch = randint(gen, 2, 3)
    queues = []
    for length in (torch.randperm(8, generator=gen)[:randint(gen, 2, 3)] + 3).tolist():
        replies = [randint(gen, 4, 6) if i % 2 == 0 else randint(gen, 1, 2) for i in range(2 * max_batch)]
        queues.append([(_ids(gen, length), n) for n in replies])
    requests = []
    while any(queues):
        queue = [q for q in queues if q][randint(gen, 0, sum(1 for q in queues if q) - 1)]
        requests.append(queue.pop(0))
    return requests, max_batch


def _fewest_calls(requests, max_batch: int) -> int:
    """Calls of the best static batching: per prompt length, replies longest first, max_batch rows
    per group, a group as many calls as its longest reply."""
    calls = 0
    for length in {len(p) for p, _ in requests}:
        replies = sorted((n for p, n in requests if len(p) == length), reverse=True)
        calls += sum(replies[i] for i in range(0, len(replies), max_batch))
    return calls


@exercise("serve", points=3, timeout=TIMEOUT)
def test_serve_batches_equal_lengths_and_replies_exactly(learner, seed):
    gen = generator(seed + 2)
    requests, max_batch = _workload(gen)
    got = _rows(learner.call("serve", ModelRef("tiny", seed), [list(r) for r in requests], max_batch),
                len(requests), "serve")
    model = build_tiny(seed)
    for i, (prompt, n_new) in enumerate(requests):
        assert_equal_tokens(got[i], generate(model, prompt, n_new), name=f"reply {i} of serve",
                            hint="reply i answers requests[i] (keep request order) and has exactly "
                                 "requests[i][1] tokens: cut what the group's longer steps produced")
    shapes = _shapes(learner.trace)
    widest, fewest, one_by_one = max(s[0] for s in shapes), _fewest_calls(requests, max_batch), \
        sum(n for _, n in requests)
    sizes = [s[0] for s in shapes]
    calls = f"{len(shapes)} model calls (batch sizes {sizes[:12]}{' …' if len(sizes) > 12 else ''})"
    if widest > max_batch:
        raise AssertionError(f"a call fed {widest} rows; max_batch is {max_batch}")
    if len(shapes) <= fewest:
        return
    if len(shapes) >= one_by_one:
        raise AssertionError(f"{calls} for {len(requests)} requests and {one_by_one} tokens: one model "
                             "call per token per request. Group the requests whose prompts have the "
                             "same length and decode each group in one batched call per step")
    raise AssertionError(f"{calls}; static batching needs only {fewest}. Put every request of one "
                         "prompt length into as few groups as max_batch allows, and sort each "
                         "length's requests longest reply first, so short replies wait inside long "
                         "groups instead of making groups of their own")


# ------------------------------------------------------------------------ lookup_generate

def _grounded_case(gen, model, ngram: int):
    """A prompt, a source passage that is the model's own greedy reply with a few tokens changed
    (an edit task: most of the reply is copied, some is not), n_new, k. Decoys go first: every
    n-gram of the passage followed by other tokens, in a shuffled order, so that a tail's
    EARLIEST occurrence drafts junk and only its latest one (the docstring's rule) the passage."""
    prompt, n_new, k = _ids(gen, randint(gen, 4, 8)), randint(gen, 14, 20), randint(gen, 3, 4)
    reply = generate(model, prompt, n_new)
    source = prompt[-ngram:] + list(reply)
    for position in torch.randperm(n_new - 2, generator=gen)[:2].tolist():
        source[ngram + 1 + position] = (source[ngram + 1 + position] + 1 + randint(gen, 0, 200)) % VOCAB
    decoys = []
    for start in torch.randperm(len(source) - ngram, generator=gen).tolist():
        decoys += source[start:start + ngram] + _ids(gen, k)
    return prompt, decoys + source, n_new, k, reply


def _lookup_calls(prompt, source, reply, n_new, k, ngram) -> list[tuple[list[int], int]]:
    """(tokens fed, cache length before) of each verification under the docstring's draft rule:
    the newest kept token and the draft looked up in ``source``."""
    tokens, calls = list(prompt) + [reply[0]], []
    while len(tokens) - len(prompt) < n_new:
        done = len(tokens) - len(prompt)
        draft, tail = [], tokens[-ngram:]
        for start in range(len(source) - ngram, -1, -1):
            if source[start:start + ngram] == tail:
                draft = source[start + ngram:start + ngram + min(k, n_new - done - 1)]
                break
        accepted = 0
        while accepted < len(draft) and draft[accepted] == reply[done + accepted]:
            accepted += 1
        calls.append(([tokens[-1], *draft], len(tokens) - 1))
        tokens += reply[done:done + accepted + 1]
    return calls


@exercise("lookup_generate", points=3, timeout=TIMEOUT)
def test_lookup_generate_is_exact_and_verifies_drafts_with_rollback(learner, seed):
    gen, ngram = generator(seed + 3), 2
    model = build_tiny(seed)
    prompt, source, n_new, k, reply = _grounded_case(gen, model, ngram)
    got = learner.call("lookup_generate", ModelRef("tiny", seed), prompt, source, n_new, k, ngram)
    trace = learner.trace
    lengths = [f.cache_length for f in trace]
    fed = [f.shape[1] for f in trace]
    never_cut = len(trace) > 1 and all(lengths[i + 1] == lengths[i] + fed[i] for i in range(len(trace) - 1))
    assert_equal_tokens(list(got) if isinstance(got, (list, tuple)) else got, reply,
                        name="lookup_generate", hint=(
                            "the cache was never cut back (the cache length before each call grew by "
                            "everything fed): after a rejection, cache.truncate to the accepted tokens"
                            if never_cut else
                            "accept draft[i] only while it equals the argmax after the token before it; "
                            "the first mismatch is replaced by that argmax and ends the step"))
    verifications = _lookup_calls(prompt, source, reply, n_new, k, ngram)
    expected = [(len(fed_tokens), length) for fed_tokens, length in verifications]
    seen = [(f.shape[1], f.cache_length) for f in trace[1:]]
    calls = f"(verifications expected as (tokens fed, cache length before): {expected}; seen: {seen})"
    if not trace or trace[0].shape != (1, len(prompt)) or trace[0].cache_length != 0:
        raise AssertionError(f"the first call must be the prefill, shape (1, {len(prompt)}), into an "
                             f"empty cache {calls}")
    if max(fed[1:], default=1) == 1:
        raise AssertionError(f"{len(trace) - 1} calls of one token each for {n_new} tokens: no draft "
                             f"was verified {calls}. Feed the newest token and the draft together")
    if any(f.cache is None for f in trace) or len({f.cache for f in trace}) > 1:
        raise AssertionError(f"every call must go through one cache, the prefill's {calls}: "
                             "verify the draft in the cache and cut it back after a rejection "
                             "(re-running the whole sequence without a cache is not speculation)")
    if any(n > k + 1 for n, _ in seen):
        raise AssertionError(f"a verification fed more than k + 1 = {k + 1} tokens {calls}: feed "
                             "the newest token and a draft of at most k tokens")
    if len(seen) > len(expected):
        raise AssertionError(f"{len(seen)} verification calls where the draft rule needs "
                             f"{len(expected)} {calls}: accept every draft token that matches, and look "
                             "the tail up in `source` (its latest occurrence)")
    if seen == expected:   # every part: exactly the newest token and the looked-up draft fed
        for number, (f, (want, _)) in enumerate(zip(trace[1:], verifications), start=1):
            if list(f.tokens) != want:
                raise AssertionError(
                    f"verification {number} fed {list(f.tokens)} where the draft rule gives "
                    f"{want}: the newest kept token, then the tokens that follow the latest "
                    "occurrence of the tail in `source` (at most k); verify exactly those")
        return
    if seen != expected:
        first = next(i for i, (a, b) in enumerate(zip(seen + [None] * len(expected), expected))
                     if a != b)
        got_call = seen[first] if first < len(seen) else "missing"
        raise AssertionError(f"verification {first + 1} was {got_call} where the draft rule gives "
                             f"{expected[first]} {calls}: draft from the "
                             "LATEST occurrence of the tail in `source`, at most k tokens and never "
                             "more than are still needed; after a rejection cut the cache back to "
                             "the accepted tokens")
