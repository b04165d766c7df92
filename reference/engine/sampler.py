"""The step's sampling: one token per sequence from its logits row, for the whole batch at once.

Each token is the one `reference.decoding.sample_next` picks for that row with the request's
settings and generator, bit for bit, so a seeded request samples the same tokens alone, in a crowd
or through `reference.decoding.generate`. What changes is the host time:

- greedy rows: one argmax over all of them;
- sampled rows: `torch.multinomial(probs, 1, generator)` is argmax(probs / q) with q ~ Exp(1) drawn
  from the generator (the exponential race, PyTorch's own method for one sample), so each request
  draws its own q row from its own generator and one division and one argmax serve the batch;
- top-p without sorting the vocabulary: the nucleus is found among the largest m + 1
  probabilities (`torch.topk`) whenever they decide it, trying m = 16, then 256, then 2048 (a
  chat model's nucleus at top-p 0.95 is usually a handful of tokens; sorting all 49,152
  probabilities costs ~8 ms on the course's CPU, the top 17 ~0.15 ms, the top 257 ~0.3 ms).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from reference import decoding

TOP_P_CANDIDATES = (16, 256, 2048)   # m tried in turn before sorting the whole vocabulary


class Sampler:
    """threads: rows of noise drawn at once (None: torch's thread count, read at each call)."""

    def __init__(self, threads: int | None = None):
        self.threads = threads
        self._pool, self._workers = None, 0

    def __call__(self, logits: Tensor, params: list, generators: list[torch.Generator]) -> list[int]:
        """logits [B, vocab] float32 (row b for request b), params: B SamplingParams, generators:
        B torch.Generators -> B token ids."""
        tokens = [0] * len(params)
        greedy = [b for b, p in enumerate(params) if p.temperature == 0.0]
        if greedy:
            rows = logits if len(greedy) == len(params) else logits[greedy]
            for b, token in zip(greedy, rows.argmax(-1).tolist()):
                tokens[b] = token
        sampled = [b for b, p in enumerate(params) if p.temperature != 0.0]
        if sampled:
            rows = logits[sampled].cpu()   # sampled on the CPU, where the requests' generators live
            probs = torch.stack([filtered_probs(row, *params[b].filters) for row, b in zip(rows, sampled)])
            q = self.exponential(probs.shape, [generators[b] for b in sampled])
            for b, token in zip(sampled, (probs / q).argmax(-1).tolist()):
                tokens[b] = token
        return tokens

    def exponential(self, shape: torch.Size, generators: list[torch.Generator]) -> Tensor:
        """q [B, vocab] ~ Exp(1), row b drawn from generators[b] exactly as torch.multinomial
        draws it (~1 ms a row for 49,152 tokens on the course's CPU). Rows from distinct
        generators are independent, so they are drawn on several threads at once."""
        q = torch.empty(shape)
        pairs = list(zip(q, generators))
        workers = min(self.threads or torch.get_num_threads(), len(pairs))
        if workers > 1 and len({id(g) for g in generators}) == len(generators):
            if self._workers != workers:
                if self._pool is not None:
                    self._pool.shutdown(wait=False)
                self._pool, self._workers = ThreadPoolExecutor(workers, "sampler"), workers
            list(self._pool.map(lambda pair: pair[0].exponential_(generator=pair[1]), pairs))
        else:
            for row, generator in pairs:
                row.exponential_(generator=generator)
        return q


def filtered_probs(logits: Tensor, temperature: float, top_k: int | None = None,
                   top_p: float | None = None) -> Tensor:
    """`reference.decoding.filtered_probs` for one row, logits [vocab] -> probabilities [vocab],
    equal to it bit for bit; top-p is cut from the largest few probabilities when they decide it."""
    probs = decoding.filtered_probs(logits, temperature, top_k, None)
    if top_p is None or temperature == 0.0:
        return probs
    for m in TOP_P_CANDIDATES:
        if m + 1 < probs.shape[-1]:
            nucleus = _top_p_from_largest(probs, top_p, m + 1)
            if nucleus is not None:
                return nucleus
    return decoding.filtered_probs(logits, temperature, top_k, top_p)


def _top_p_from_largest(probs: Tensor, top_p: float, n: int) -> Tensor | None:
    """The top-p filter of probs [vocab] computed from its n largest entries, or None when they
    cannot settle it.

    decoding.filtered_probs sorts everything and drops position i when the mass before it,
    cumsum[i] - p[i], reaches top_p. The n largest values are the sorted array's first n, and
    their cumsum is its first n entries (a running sum), so the same test runs on them. It settles
    the rest when position n - 1 is dropped (the mass before later positions only grows), and the
    kept indices are the same as a sort's when no run of equal values is cut between kept and
    dropped (otherwise which of the tied indices stays depends on the sort's order: sort then).
    """
    values, indices = probs.topk(n)
    drop = values.cumsum(-1) - values >= top_p
    if not drop[-1] or ((values[1:] == values[:-1]) & (drop[1:] != drop[:-1])).any():
        return None
    kept = indices[~drop]
    out = torch.zeros_like(probs)
    out[kept] = probs[kept]
    return out / out.sum(-1, keepdim=True)
