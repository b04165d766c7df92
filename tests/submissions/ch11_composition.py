"""Known-wrong and cheating submissions for chapter 11 (see tests/grading/test_selfcheck.py).

Each section is the body of one solution cell, written in full or, for a slip, as
`# replace:` / `# with:` edits of the solution section (autograder/solutions/__init__.py);
none may earn the exercise's full points.
The `serve` variants carry their own helpers, so they are judged on their own batching.
"""

# %% grade_id: batched_generate | wrong: right tokens, but one request at a time
# expect: served one at a time
def batched_generate(model, prompts, n_new):
    replies = []
    for prompt in prompts:
        cache = model.new_cache(1, len(prompt) + n_new)
        logits = model(torch.tensor([prompt]), cache=cache)
        reply = [int(logits[0, -1].argmax())]
        while len(reply) < n_new:
            logits = model(torch.tensor([[reply[-1]]]), cache=cache)
            reply.append(int(logits[0, -1].argmax()))
        replies.append(reply)
    return replies


# %% grade_id: batched_generate | cheat: the reference decoding loop, through the course on sys.path
# expect: is not allowed
import os
import sys

sys.path.insert(0, os.environ.get("AUTOGRADER_ROOT", "."))
from reference.decoding import generate as _generate


def batched_generate(model, prompts, n_new):
    return [_generate(model, prompt, n_new) for prompt in prompts]


# %% grade_id: shared_prefix_generate | wrong: recomputes the shared prefix in every row
# expect: the prefix was computed for every row
# replace:
#     shared = model.new_cache(1, len(prefix))
# with:

# replace:
#         model(torch.tensor([prefix], dtype=torch.long), cache=shared)
#         for layer in range(n_layers):
#             k, v = shared.read(layer)
#             cache.append(layer, k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1))
#         logits = model(torch.tensor(suffixes, dtype=torch.long), cache=cache)
# with:
#         logits = model(torch.tensor([prefix + s for s in suffixes], dtype=torch.long), cache=cache)


# %% grade_id: shared_prefix_generate | cheat: the prefix once, then each request alone at batch 1 (truncate back to the prefix)
# expect: served one at a time
def shared_prefix_generate(model, prefix, suffixes, n_new):
    cache = model.new_cache(1, len(prefix) + len(suffixes[0]) + n_new)
    model(torch.tensor([prefix]), cache=cache)
    replies = []
    for suffix in suffixes:
        cache.truncate(len(prefix))
        reply = [int(model(torch.tensor([suffix]), cache=cache)[0, -1].argmax())]
        while len(reply) < n_new:
            reply.append(int(model(torch.tensor([[reply[-1]]]), cache=cache)[0, -1].argmax()))
        replies.append(reply)
    return replies


# %% grade_id: shared_prefix_generate | cheat: imports the reference generate
# expect: is not allowed
from reference.decoding import generate as _generate


def shared_prefix_generate(model, prefix, suffixes, n_new):
    return [_generate(model, prefix + s, n_new) for s in suffixes]


# %% grade_id: serve | wrong: one model call per token per request (a cached loop each)
# expect: one model call per token per request
def serve(model, requests, max_batch):
    replies = []
    for prompt, n_new in requests:
        cache = model.new_cache(1, len(prompt) + n_new)
        logits = model(torch.tensor([prompt]), cache=cache)
        reply = [int(logits[0, -1].argmax())]
        while len(reply) < n_new:
            logits = model(torch.tensor([[reply[-1]]]), cache=cache)
            reply.append(int(logits[0, -1].argmax()))
        replies.append(reply)
    return replies


# %% grade_id: serve | wrong: groups by length but cuts groups in arrival order (no sort)
# expect: static batching needs only
def _batch(model, prompts, n_new):
    batch = len(prompts)
    cache = model.new_cache(batch, len(prompts[0]) + n_new)
    tokens = model(torch.tensor(prompts), cache=cache)[:, -1].argmax(-1)
    replies = [[int(t)] for t in tokens]
    for _ in range(n_new - 1):
        tokens = model(tokens.view(batch, 1), cache=cache)[:, -1].argmax(-1)
        for reply, t in zip(replies, tokens):
            reply.append(int(t))
    return replies


def serve(model, requests, max_batch):
    groups = {}
    for i, (prompt, _) in enumerate(requests):
        groups.setdefault(len(prompt), []).append(i)
    replies = [None] * len(requests)
    for indices in groups.values():
        for start in range(0, len(indices), max_batch):
            chunk = indices[start:start + max_batch]
            longest = max(requests[i][1] for i in chunk)
            for i, reply in zip(chunk, _batch(model, [requests[i][0] for i in chunk], longest)):
                replies[i] = reply[:requests[i][1]]
    return replies


# %% grade_id: serve | cheat: the course's engine, found through AUTOGRADER_ROOT
# expect: is not allowed
import os
import sys

sys.path.insert(0, os.environ.get("AUTOGRADER_ROOT", "."))
from reference.decoding import generate as _generate
import reference.engine  # noqa: F401


def serve(model, requests, max_batch):
    return [_generate(model, prompt, n_new) for prompt, n_new in requests]


# %% grade_id: lookup_generate | wrong: never rolls the cache back after a rejected draft
# expect: the cache was never cut back
# replace:
#     cache = model.new_cache(1, len(prompt_ids) + n_new)
# with:
#     cache = model.new_cache(1, len(prompt_ids) + n_new * (k + 1))

# replace:
#             cache.truncate(len(tokens) - 1)        # K/V of every token but the newest
# with:


# %% grade_id: lookup_generate | wrong: drafts from the EARLIEST occurrence of the tail in the source
# expect: its latest occurrence
# replace:
#             for start in range(len(source) - ngram, -1, -1):   # latest occurrence first
# with:
#             for start in range(len(source) - ngram + 1):

# %% grade_id: lookup_generate | wrong: plain greedy decoding, no draft ever verified
# expect: no draft was verified
def lookup_generate(model, prompt_ids, source, n_new, k, ngram=2):
    cache = model.new_cache(1, len(prompt_ids) + n_new)
    tokens = [int(model(torch.tensor([prompt_ids]), cache=cache)[0, -1].argmax())]
    while len(tokens) < n_new:
        tokens.append(int(model(torch.tensor([[tokens[-1]]]), cache=cache)[0, -1].argmax()))
    return tokens


# %% grade_id: lookup_generate | cheat: verifies each draft without a cache, re-running the whole sequence (nothing to roll back)
# expect: every call must go through one cache
# replace:
#     cache = model.new_cache(1, len(prompt_ids) + n_new)
# with:
#     cache = model.new_cache(1, len(prompt_ids))

# replace:
#             logits = model(torch.tensor([[tokens[-1]] + draft], dtype=torch.long), cache=cache)
#             best = logits[0].argmax(-1).tolist()   # the model's choice after each fed token
# with:
#             logits = model(torch.tensor([tokens + draft], dtype=torch.long))
#             best = logits[0, len(tokens) - 1:].argmax(-1).tolist()

# replace:
#             cache.truncate(len(tokens) - 1)        # K/V of every token but the newest
# with:


# %% grade_id: lookup_generate | cheat: the reference greedy loop, imported under another name
# expect: is not allowed
import importlib

_decoding = importlib.import_module("reference.decoding")


def lookup_generate(model, prompt_ids, source, n_new, k, ngram=2):
    return _decoding.generate(model, list(prompt_ids), n_new)
