"""Keeping fewer tokens: KV eviction policies applied to the model's cache while it decodes.

A policy decides, after every forward, which cached positions survive; the others are dropped
and their slots reused, so the cache never holds more than ``policy.budget`` tokens between
steps (a step attends over those and its own new key).

- `SinkWindow(n_sink, window)`: StreamingLLM (Xiao et al., 2023). Keep the first ``n_sink``
  positions, the *attention sinks* that soak up the attention no other token claims, and the
  last ``window``. ``SinkWindow(0, window)`` is plain window attention.
- `HeavyHitters(n_heavy, window)`: H2O (Zhang et al., 2023). Keep the last ``window``
  positions and, of the older ones, the ``n_heavy`` with the largest attention accumulated so
  far (summed over the query heads that read a K/V head, over every query since the token
  arrived). Each layer and K/V head keeps its own set.

Positions. Our cache stores keys *after* RoPE, each rotated by the position it was computed at.
With ``reindex=False`` (the default) nothing moves: a kept key keeps its real position, and a new
query is rotated by its real position, so eviction is exactly attention with the evicted keys
masked out (tests/compression/test_eviction.py checks this against the full cache and a mask). That is
H2O's setting, and fine while the real positions stay inside the model's trained context.
StreamingLLM instead assigns positions *within the cache* (slot 0, 1, ...), so that a stream
longer than the trained context never shows the model a distance it has not seen; the paper
caches keys before RoPE and rotates them at every step. ``reindex=True`` does the same on our
post-RoPE cache: RoPE rotations compose (R_a R_b = R_{a+b}), so a key moved from slot j to
slot i is rotated once more by i - j, and the new query takes the slot index as its position.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from reference.context import DenseContext
from reference.decoding import generate
from reference.model import interleave_tables, rope_tables, rotate_pairs


def sink_window_keep(length: int, n_sink: int, window: int) -> list[int]:
    """The positions of range(length) that StreamingLLM keeps: the first n_sink and the last window.

    All of them while length <= n_sink + window; ascending, without duplicates.
    """
    if min(length, n_sink, window) < 0:
        raise ValueError(f"length, n_sink and window must be >= 0, got {length}, {n_sink}, {window}")
    if length <= n_sink + window:
        return list(range(length))
    return list(range(n_sink)) + list(range(length - window, length))


def heavy_hitter_keep(scores: Tensor, n_heavy: int, window: int) -> Tensor:
    """Slots H2O keeps of ``scores`` [..., n] (accumulated attention, slots in position order).

    The last ``window`` slots always; of the others, the ``n_heavy`` with the largest score (the
    earlier slot on a tie). Returns ascending slot indices [..., min(n, n_heavy + window)].
    """
    n = scores.shape[-1]
    if n <= n_heavy + window:
        return torch.arange(n).expand(*scores.shape[:-1], n)
    older = scores[..., :n - window]
    heavy = older.sort(dim=-1, descending=True, stable=True).indices[..., :n_heavy]
    recent = torch.arange(n - window, n).expand(*scores.shape[:-1], window)
    return torch.cat([heavy, recent], dim=-1).sort(dim=-1).values


@dataclass(frozen=True)
class SinkWindow:
    """StreamingLLM: the first ``n_sink`` positions and the last ``window``."""
    n_sink: int
    window: int
    reindex: bool = False
    needs_scores = False

    @property
    def budget(self) -> int:
        return self.n_sink + self.window

    @property
    def name(self) -> str:
        base = f"window {self.window}" if self.n_sink == 0 else f"{self.n_sink} sinks + window {self.window}"
        return base + (", cache positions" if self.reindex else "")

    def keep(self, scores: Tensor) -> Tensor:
        """Slots kept [..., k] of a cache whose slots hold ascending positions (scores unused)."""
        n = scores.shape[-1]
        slots = torch.tensor(sink_window_keep(n, self.n_sink, self.window))
        return slots.expand(*scores.shape[:-1], len(slots))


@dataclass(frozen=True)
class HeavyHitters:
    """H2O: the last ``window`` positions and the ``n_heavy`` older ones most attended so far."""
    n_heavy: int
    window: int
    reindex: bool = False
    needs_scores = True

    @property
    def budget(self) -> int:
        return self.n_heavy + self.window

    @property
    def name(self) -> str:
        return f"H2O: {self.n_heavy} heavy + window {self.window}"

    def keep(self, scores: Tensor) -> Tensor:
        return heavy_hitter_keep(scores, self.n_heavy, self.window)


@dataclass
class _ScoringContext(DenseContext):
    """A dense step that also adds each key's attention probability to ``scores`` [L, B, Hkv, S]
    (summed over the query heads of its group and over the step's queries)."""
    scores: Tensor | None = None

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        out = super().attend(layer, q, k, v)
        if self.scores is not None:
            keys, _ = self.cache.read(layer)                       # [B, Hkv, S, D]
            B, T, H, D = q.shape
            S, group = keys.shape[2], H // keys.shape[1]
            # query head h reads K/V head h // group: [B, Hkv, group * T, D]
            queries = q.transpose(1, 2).reshape(B, keys.shape[1], group * T, D)
            logits = queries @ keys.transpose(-1, -2) / math.sqrt(D)
            if T > 1:   # the T queries are the last T positions: end-aligned causal
                row = torch.arange(T, device=q.device).repeat(group)
                hidden = torch.arange(S, device=q.device)[None, :] > (S - T + row)[:, None]
                logits = logits.masked_fill(hidden, float("-inf"))
            self.scores[layer, :, :, :S] += torch.softmax(logits.double(), dim=-1).sum(2)
        return out


@dataclass
class EvictionRun:
    """What `generate_evicting` did.

    tokens: the greedy token after each step (with ``forced``, the model's own top choice
    while the forced tokens are fed). logprobs: log-probability of each forced token (empty
    without ``forced``). positions: real positions held at the end, [n_layers, batch, n_kv_heads,
    kept] (ascending per row). max_kept: most tokens held between steps. kept_bytes: K and V
    bytes of max_kept tokens (all layers, per sequence); reserved_bytes: the buffers allocated.
    history: with ``trace=True``, ``positions`` after every forward (the prefill first).
    """
    tokens: list[list[int]]
    logprobs: list[list[float]]
    positions: Tensor
    max_kept: int
    kept_bytes: int
    reserved_bytes: int
    history: list[Tensor] = field(default_factory=list)


def _rotate(keys: Tensor, delta: Tensor, head_dim: int, base: float) -> Tensor:
    """Rotate post-RoPE keys [..., k, D] by a further ``delta`` positions [..., k]."""
    cos, sin = rope_tables(head_dim, base, delta.reshape(-1))
    cos2, sin2 = interleave_tables(cos, sin)
    shape = (*delta.shape, head_dim)
    return rotate_pairs(keys, cos2.reshape(shape).to(keys.dtype), sin2.reshape(shape).to(keys.dtype))


def generate_evicting(model, prompt_ids: list[int], max_new_tokens: int,
                      policies: list | object, *, forced: list[int] | None = None,
                      trace: bool = False) -> EvictionRun:
    """Greedy decoding with a cache that evicts after every forward, one sequence per policy.

    The prompt is prefilled in one forward (full attention within it), then every forward is
    followed by an eviction down to the policy's budget. ``policies``: one policy or a list of
    policies with the same budget, decoded as a batch (sequence b follows policies[b]).
    forced: tokens fed in place of the model's choices (teacher forcing, the same for every
    sequence): then ``tokens`` holds the top choice at each step and ``logprobs`` the
    log-probability of the forced token, so a run measures agreement with a reference
    continuation. Returns an `EvictionRun`.
    """
    policies = list(policies) if isinstance(policies, (list, tuple)) else [policies]
    budget = policies[0].budget
    if budget < 1 or any(p.budget != budget for p in policies):
        raise ValueError(f"the policies of one run need one budget >= 1, got {[p.budget for p in policies]}")
    if forced is not None and len(forced) < max_new_tokens:
        raise ValueError(f"forced holds {len(forced)} tokens, fewer than max_new_tokens={max_new_tokens}")
    cfg = model.config
    B, P = len(policies), len(prompt_ids)
    capacity = max(P, budget + 1)
    cache = model.new_cache(batch=B, max_len=capacity)
    device = model.device
    scoring = any(p.needs_scores for p in policies)
    scores = torch.zeros(cfg.n_layers, B, cfg.n_kv_heads, capacity, dtype=torch.float64,
                         device=device) if scoring else None
    positions = torch.arange(P, device=device).expand(cfg.n_layers, B, cfg.n_kv_heads, P).clone()
    reindex = torch.tensor([p.reindex for p in policies], device=device)
    tokens: list[list[int]] = [[] for _ in range(B)]
    logprobs: list[list[float]] = [[] for _ in range(B)]
    history, max_kept = [], 0

    feed = torch.tensor([prompt_ids] * B, device=device)
    context = _ScoringContext(**vars(DenseContext.for_step(cache, P, None, device, model.attention_backend)),
                              scores=scores)
    for step in range(max_new_tokens):
        logits = model(feed, context=context)[:, -1]
        if forced is not None:   # how likely this cache finds the reference's next token
            lp = torch.log_softmax(logits.double(), dim=-1)[:, forced[step]]
            for b in range(B):
                logprobs[b].append(float(lp[b]))
        choice = logits.argmax(-1)
        for b in range(B):
            tokens[b].append(int(choice[b]))
        positions = _evict(cache, positions, scores, policies, reindex, cfg)
        max_kept = max(max_kept, cache.length)
        if trace:
            history.append(positions.clone())
        if step == max_new_tokens - 1:
            break
        nxt = choice if forced is None else torch.full((B,), forced[step], device=device)
        feed = nxt[:, None]
        real = P + step                                     # the position of the token fed now
        slot = cache.length
        rope = torch.where(reindex, slot, real)[:, None]    # [B, 1]: each sequence's query position
        positions = torch.cat([positions, torch.full((*positions.shape[:3], 1), real, device=device)], -1)
        context = _ScoringContext(torch.tensor([real], device=device), rope, cache, None,
                                  model.attention_backend, scores=scores)
    per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * cache.k.element_size()
    return EvictionRun(tokens, logprobs, positions, max_kept, max_kept * per_token,
                       cache.nbytes() // B, history)


def _evict(cache, positions: Tensor, scores: Tensor | None, policies: list, reindex: Tensor,
           cfg) -> Tensor:
    """Cut every (layer, sequence, K/V head) row of the cache down to its policy's kept slots."""
    n = cache.length
    if n <= policies[0].budget:
        return positions
    keep = torch.stack([p.keep(scores[:, b, :, :n] if scores is not None else positions[:, b])
                        for b, p in enumerate(policies)], dim=1).to(positions.device)   # [L, B, H, k]
    k = keep.shape[-1]
    index = keep[..., None].expand(*keep.shape, cfg.head_dim)
    kept_k = cache.k[:, :, :, :n].gather(3, index)
    kept_v = cache.v[:, :, :, :n].gather(3, index)
    if bool(reindex.any()):   # StreamingLLM: slot i's key rotated from its old slot to position i
        delta = torch.arange(k, device=keep.device) - keep
        rotated = _rotate(kept_k, delta, cfg.head_dim, cfg.rope_base)
        kept_k = torch.where(reindex[None, :, None, None, None], rotated, kept_k)
    cache.k[:, :, :, :k] = kept_k
    cache.v[:, :, :, :k] = kept_v
    if scores is not None:
        scores[..., :k] = scores[..., :n].gather(3, keep)
        scores[..., k:] = 0
    cache.truncate(k)
    return positions.gather(3, keep)


def policy_ladder(budget: int, n_sink: int = 4) -> dict[str, object]:
    """The four policies the book compares at one budget (the same number of tokens kept)."""
    half = budget // 2
    return {"window": SinkWindow(0, budget),
            "sinks + window": SinkWindow(n_sink, budget - n_sink),
            "sinks + window, cache positions": SinkWindow(n_sink, budget - n_sink, reindex=True),
            "H2O": HeavyHitters(half, budget - half)}


def evaluate_eviction(model, prompt_ids: list[int], n_tokens: int, budgets: list[int],
                      n_sink: int = 4) -> tuple[list[int], list[dict]]:
    """Compare `policy_ladder`'s policies with the full cache on one greedy continuation.

    The full cache's greedy continuation of ``n_tokens`` tokens is the reference; each policy's
    cache is then fed the same tokens (`generate_evicting` with ``forced``). Per (budget, policy)
    a dict: policy, budget, agreement (fraction of the steps whose top choice is the reference
    token), first_divergence (the first step where it is not: free-running greedy decoding with
    that cache would leave the reference there; None if never), delta_nll (mean negative
    log-likelihood of the reference tokens, minus the full cache's), kept_bytes. Returns
    (reference tokens, rows). Cost: one greedy run, then ``n_tokens`` batched steps per budget.
    """
    reference = generate(model, prompt_ids, n_tokens)
    logits = model(torch.tensor([prompt_ids + reference[:-1]], device=model.device))[0, len(prompt_ids) - 1:]
    full_nll = -float(torch.log_softmax(logits.double(), -1)[torch.arange(n_tokens), reference].mean())
    rows = []
    for budget in budgets:
        ladder = policy_ladder(budget, n_sink)
        run = generate_evicting(model, prompt_ids, n_tokens, list(ladder.values()), forced=reference)
        for name, tokens, logprobs in zip(ladder, run.tokens, run.logprobs):
            same = [a == b for a, b in zip(tokens, reference)]
            rows.append(dict(policy=name, budget=budget, agreement=sum(same) / n_tokens,
                             first_divergence=None if all(same) else same.index(False),
                             delta_nll=-sum(logprobs) / n_tokens - full_nll, kept_bytes=run.kept_bytes))
    return reference, rows
