# %% grade_id: batched_generate
import torch


def batched_generate(model, prompts: list[list[int]], n_new: int) -> list[list[int]]:
    """Greedy decoding of several equal-length prompts at once, through one batched KV cache.

    model: callable model(ids [B, T], cache=cache) -> logits [B, T, vocab]; model.new_cache(batch,
    max_len) returns an empty cache whose B rows all hold the same number of positions.
    prompts: B >= 1 non-empty lists of ints, all of the same length P. n_new: tokens per prompt (>= 1).
    Returns B lists of n_new new ids, row b equal to greedy decoding of prompts[b] alone.
    Model calls: one prefill of shape [B, P], then n_new - 1 of shape [B, 1], all with the cache.
    """
    batch, length = len(prompts), len(prompts[0])
    if any(len(p) != length for p in prompts):
        raise ValueError("batched_generate needs prompts of one length")
    cache = model.new_cache(batch, length + n_new)
    with torch.no_grad():
        logits = model(torch.tensor(prompts, dtype=torch.long), cache=cache)
        tokens = logits[:, -1].argmax(-1)
        generated = [[int(t)] for t in tokens]
        for _ in range(n_new - 1):
            logits = model(tokens.view(batch, 1), cache=cache)
            tokens = logits[:, -1].argmax(-1)
            for row, t in zip(generated, tokens):
                row.append(int(t))
    return generated


# %% grade_id: shared_prefix_generate
import torch


def shared_prefix_generate(model, prefix: list[int], suffixes: list[list[int]], n_new: int
                           ) -> list[list[int]]:
    """Greedy replies to B requests sharing one prefix, which is computed once and copied to all.

    The prefix (a system prompt) is run ONCE, its keys and values are copied into every row of a
    batched cache, then the suffixes and the decode steps run batched.

    model: as in batched_generate. prefix: non-empty list of ints. suffixes: B >= 1 non-empty lists
    of ints, all of one length S. n_new >= 1.
    Returns B lists of n_new new ids, row b equal to greedy decoding of prefix + suffixes[b] alone.
    Model calls: [1, len(prefix)] into a batch-1 cache, then (after copying its K/V into a batch-B
    cache with cache.read / cache.append, layer by layer) [B, S], then n_new - 1 of [B, 1].
    """
    batch, n_layers = len(suffixes), model.config.n_layers
    shared = model.new_cache(1, len(prefix))
    cache = model.new_cache(batch, len(prefix) + len(suffixes[0]) + n_new)
    with torch.no_grad():
        model(torch.tensor([prefix], dtype=torch.long), cache=shared)
        for layer in range(n_layers):
            k, v = shared.read(layer)
            cache.append(layer, k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1))
        logits = model(torch.tensor(suffixes, dtype=torch.long), cache=cache)
        tokens = logits[:, -1].argmax(-1)
        generated = [[int(t)] for t in tokens]
        for _ in range(n_new - 1):
            logits = model(tokens.view(batch, 1), cache=cache)
            tokens = logits[:, -1].argmax(-1)
            for row, t in zip(generated, tokens):
                row.append(int(t))
    return generated


# %% grade_id: serve
def serve(model, requests: list[tuple[list[int], int]], max_batch: int) -> list[list[int]]:
    """Serve many requests with static batches of equal-length prompts, each reply cut to length.

    Group requests whose prompts have the same length, decode each group with `batched_generate`
    (at most max_batch rows per group), and cut each reply to its own max_new_tokens.

    requests: (prompt_ids, max_new_tokens) pairs, prompts of different lengths, max_new_tokens >= 1.
    max_batch: most rows in one model call (>= 1).
    Returns one list of new ids per request, in request order; reply i has requests[i][1] tokens,
    equal to greedy decoding of that prompt alone.
    Model calls: a group runs as many steps as its longest reply, so put requests of one prompt
    length together, longest replies first, and never more than max_batch rows per call.
    """
    by_length: dict[int, list[int]] = {}
    for index, (prompt, _) in enumerate(requests):
        by_length.setdefault(len(prompt), []).append(index)
    replies: list[list[int] | None] = [None] * len(requests)
    for indices in by_length.values():
        indices.sort(key=lambda i: -requests[i][1])
        for start in range(0, len(indices), max_batch):
            group = indices[start:start + max_batch]
            longest = requests[group[0]][1]
            outputs = batched_generate(model, [list(requests[i][0]) for i in group], longest)
            for i, out in zip(group, outputs):
                replies[i] = out[:requests[i][1]]
    return replies


# %% grade_id: lookup_generate
import torch


def lookup_generate(model, prompt_ids: list[int], source: list[int], n_new: int, k: int,
                    ngram: int = 2) -> list[int]:
    """Greedy speculative decoding of an input-grounded request, with drafts copied from `source`.

    The request edits or rewrites a passage, so its reply copies much of `source`: the model
    verifies each draft in one call, and the cache is rolled back past every rejected draft token.

    model: as in batched_generate (use batch 1). prompt_ids: non-empty list of ints.
    source: list of ints, the passage the reply is expected to copy from. n_new >= 1.
    k: most draft tokens per verification (>= 1). ngram: length of the tail to look up (>= 1).
    Draft rule: find the LATEST occurrence in `source` of the last `ngram` tokens of the sequence
    (prompt + new tokens so far) and propose the tokens that follow it: at most k, and never more
    than are still needed (n_new - new tokens so far - 1); no occurrence, no draft. The latest
    occurrence is the one that starts last, even at the very end of `source` (then no draft).
    Returns the n_new new ids, identical to plain greedy decoding. Model calls: one prefill
    [1, len(prompt_ids)], then one [1, 1 + len(draft)] per verification feeding the newest token
    and the draft; after each, cache.truncate keeps only the accepted tokens' keys and values.
    """
    cache = model.new_cache(1, len(prompt_ids) + n_new)
    tokens = [int(t) for t in prompt_ids]
    with torch.no_grad():
        logits = model(torch.tensor([tokens], dtype=torch.long), cache=cache)
        tokens.append(int(logits[0, -1].argmax()))
        while len(tokens) - len(prompt_ids) < n_new:
            still_needed = n_new - (len(tokens) - len(prompt_ids)) - 1
            draft, tail = [], tokens[-ngram:]
            for start in range(len(source) - ngram, -1, -1):   # latest occurrence first
                if source[start:start + ngram] == tail:
                    draft = source[start + ngram:start + ngram + min(k, still_needed)]
                    break
            logits = model(torch.tensor([[tokens[-1]] + draft], dtype=torch.long), cache=cache)
            best = logits[0].argmax(-1).tolist()   # the model's choice after each fed token
            accepted = 0
            while accepted < len(draft) and draft[accepted] == best[accepted]:
                accepted += 1
            tokens += draft[:accepted] + [best[accepted]]
            cache.truncate(len(tokens) - 1)        # K/V of every token but the newest
    return tokens[len(prompt_ids):]

