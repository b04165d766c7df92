"""Drafters for speculative decoding (chapter 10): who proposes the next k tokens.

Every drafter has two methods:

    reset(max_len)                       a new sequence of at most max_len tokens begins
    propose(tokens, k, to_probs, generator) -> (draft_ids, draft_probs)

`tokens` is the whole sequence so far (prompt and accepted output); `draft_ids` are at most k
proposed continuations; `draft_probs` [len(draft_ids), vocab] is the distribution q each was drawn
from (after `to_probs`, the same temperature / top-k / top-p as the target), or None for a
deterministic drafter, whose q is one-hot on the token it proposes.

- `PromptLookupDrafter`: no model; copies what followed the last n-gram's previous occurrence.
- `ModelDrafter`: any model with the target's call interface (`new_cache`, `model(ids, cache=)`).
- `FirstLayers`: the first L layers of the target, its final norm and its head, as such a model
  (self-speculative decoding by layer skipping); `layer_skip_drafter(model, L)` wraps it.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from reference.device import device_of
from reference.kv_cache import KVCache

ToProbs = Callable[[Tensor], Tensor]


class PromptLookupDrafter:
    """Propose the continuation of the most recent earlier occurrence of the last n tokens.

    Tries n = max_ngram down to min_ngram and proposes up to k tokens that followed the latest
    match, but at most `unigram_drafts` after a match of a single token: one shared token is weak
    evidence (on open chat it matched on 207 of 250 steps for 3 accepted drafts; capping it at one
    draft cut the proposals to 71 and cost one extra pass on the grounded task, 37 against 36).
    Input-grounded tasks (edit this code, rewrite this passage) repeat long spans of the prompt,
    so the copies are often right; open-ended chat rarely matches.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, unigram_drafts: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if unigram_drafts < 0:
            raise ValueError(f"unigram_drafts must be >= 0, got {unigram_drafts}")
        self.max_ngram, self.min_ngram, self.unigram_drafts = max_ngram, min_ngram, unigram_drafts

    def reset(self, max_len: int) -> None:
        """Nothing to forget: every proposal is read off the sequence itself."""

    def propose(self, tokens: list[int], k: int, to_probs: ToProbs | None = None,
                generator: torch.Generator | None = None) -> tuple[list[int], None]:
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            tail = tokens[-n:]
            # latest start i < len - n with tokens[i:i+n] == tail (the tail itself excluded)
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start:start + n] == tail:
                    return tokens[start + n:start + n + (k if n > 1 else min(k, self.unigram_drafts))], None
        return [], None


class ModelDrafter:
    """Draft k tokens one at a time with a (small) model that keeps its own KV cache.

    Invariant: the cache holds the keys and values of `self.fed`, the tokens run through the
    model. A proposal cuts the cache back to the longest prefix `fed` shares with the sequence
    (rejected drafts fall away: the rollback), then runs the rest of the sequence. The sequence
    passed to successive calls must only grow (`reset` starts a new one).
    """

    def __init__(self, model):
        self.model = model
        self.cache: KVCache | None = None
        self.fed: list[int] = []
        self.agreed = 0  # fed[:agreed] is known to equal the sequence

    def reset(self, max_len: int) -> None:
        self.cache = self.model.new_cache(batch=1, max_len=max_len)
        self.fed, self.agreed = [], 0

    def propose(self, tokens: list[int], k: int, to_probs: ToProbs,
                generator: torch.Generator | None = None) -> tuple[list[int], Tensor]:
        if self.cache is None:
            raise RuntimeError("call reset(max_len) before propose")
        if k == 0:
            return [], torch.empty(0)
        shared = self.agreed  # at least one token is run: its logits give the first draft
        while shared < min(len(self.fed), len(tokens) - 1) and self.fed[shared] == tokens[shared]:
            shared += 1
        self.cache.truncate(shared)
        feed = tokens[shared:]
        del self.fed[shared:]
        ids, probs = [], []
        for _ in range(k):
            logits = self.model(torch.tensor([feed], device=device_of(self.model)), cache=self.cache)[0, -1].cpu()
            self.fed += feed
            q = to_probs(logits)
            token = int(torch.multinomial(q, 1, generator=generator))
            ids.append(token)
            probs.append(q)
            feed = [token]
        self.agreed = len(tokens)  # the last draft is never run: its logits are not needed
        return ids, torch.stack(probs)


class FirstLayers:
    """The first n_layers blocks of `model`, its final norm and its tied head, as a model.

    Shares the weights (nothing is copied) and has the call interface the drafters use:
    `config`, `new_cache(batch, max_len)` (n_layers layers deep) and `self(ids, cache=cache)`.
    """

    def __init__(self, model, n_layers: int):
        if not 1 <= n_layers <= model.config.n_layers:
            raise ValueError(f"n_layers must be in 1..{model.config.n_layers}, got {n_layers}")
        self.model, self.n_layers, self.config = model, n_layers, model.config

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        cfg, p = self.config, self.model.embed.weight
        return KVCache(self.n_layers, batch, cfg.n_kv_heads, max_len or cfg.max_seq_len,
                       cfg.head_dim, dtype=p.dtype, device=p.device)

    def __call__(self, input_ids: Tensor, cache: KVCache | None = None) -> Tensor:
        return self.model(input_ids, cache=cache, num_layers=self.n_layers)


def layer_skip_drafter(model, n_layers: int) -> ModelDrafter:
    """Self-speculative drafter: the target's first n_layers layers draft, all of them verify."""
    return ModelDrafter(FirstLayers(model, n_layers))


def as_drafter(draft):
    """A drafter as is; a model (anything with `new_cache`) wrapped in a `ModelDrafter`."""
    if hasattr(draft, "propose") and hasattr(draft, "reset"):
        return draft
    if hasattr(draft, "new_cache"):
        return ModelDrafter(draft)
    raise TypeError(f"draft must be a drafter (reset, propose) or a model (new_cache), "
                    f"got {type(draft).__name__}")
