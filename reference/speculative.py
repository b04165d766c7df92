"""Speculative decoding (chapter 10): a cheap drafter proposes, the target verifies k tokens at once.

One round: the drafter proposes k tokens d_1..d_k drawn from q; one target forward over
[last, d_1..d_k] gives the target's distributions p_1..p_{k+1}; d_i is accepted with probability
min(1, p_i(d_i) / q_i(d_i)); at the first rejection a token is drawn from norm(max(0, p_i - q_i))
and the round ends; when all k are accepted, p_{k+1} gives a bonus token for free. Every emitted
token is distributed exactly as the target alone would sample it (Leviathan et al. 2023, Chen et
al. 2023); temperature, top-k and top-p change p and q (`filtered_probs`) before the test.
Greedy decoding is the special case where p and q are one-hot: accept iff the argmaxes agree.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from reference.cpu import backend_for
from reference.decoding import check_request, check_sampling, filtered_probs
from reference.device import device_of
from reference.drafters import as_drafter


def acceptance_rate(p: Tensor, q: Tensor) -> float:
    """alpha = sum_x min(p(x), q(x)) = 1 - TV(p, q): the chance a draft from q is accepted under p.

    p, q: probability vectors [vocab] (or [..., vocab]: the mean over the leading positions).
    """
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    return float(torch.minimum(p.double(), q.double()).sum(-1).mean())


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per target pass] = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha).

    Acceptances independent with probability alpha, k drafts plus the bonus or residual token.
    Summed term by term, so alpha -> 1 gives k + 1 with no 0 / 0.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an integer >= 0, got {k}")
    return float(sum(alpha ** j for j in range(k + 1)))


def speedup(alpha: float, k: int, c: float) -> float:
    """Tokens per unit of target time: E[tokens] / (1 + k c), c = draft step / target step time."""
    if c < 0:
        raise ValueError(f"the draft cost ratio c must be >= 0, got {c}")
    return expected_tokens(alpha, k) / (1.0 + k * c)


def speculative_accept(p: Tensor, q: Tensor, draft_token: int,
                       generator: torch.Generator | None = None) -> tuple[bool, int]:
    """One position of the test: (True, draft_token) with probability min(1, p(x) / q(x)),
    else (False, y) with y drawn from the residual norm(max(0, p - q)).

    p, q: probability vectors [vocab] of the target and of the draft that proposed x = draft_token.
    The two paths add up to min(p, q) + max(0, p - q) = p: the emitted token is distributed as p.
    """
    if p.shape != q.shape or p.dim() != 1:
        raise ValueError(f"p and q must be vectors of the same size, got {tuple(p.shape)} "
                         f"and {tuple(q.shape)}")
    u = torch.rand((), generator=generator, dtype=torch.float64).item()
    if u * q[draft_token].item() < p[draft_token].item():  # u < p/q without dividing by q
        return True, draft_token
    residual = (p - q).clamp_min(0.0)
    if residual.sum().item() <= 0.0:  # p == q up to rounding: rejection had probability 0
        residual = p
    return False, int(torch.multinomial(residual, 1, generator=generator))


def bonus_token(p: Tensor, generator: torch.Generator | None = None) -> int:
    """All k drafts accepted: the target's distribution after them, p_{k+1} [vocab], gives one more."""
    return int(torch.multinomial(p, 1, generator=generator))


def one_hot(token: int, vocab: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The distribution [vocab] of a drafter that proposes `token` for certain."""
    q = torch.zeros(vocab, dtype=dtype)
    q[token] = 1.0
    return q


def accept_drafts(p: Tensor, drafts: list[int], q: Tensor | None,
                  generator: torch.Generator | None = None) -> tuple[list[int], int, int]:
    """The acceptance test over one round of drafts, left to right, stopping at the first rejection.

    p: the target's probabilities [len(drafts) + 1, vocab] at the last token and after each draft;
    q: the drafter's [len(drafts), vocab], or None for a deterministic drafter (one-hot).
    Returns (tokens to emit, drafts checked, drafts accepted): the accepted drafts, then the
    residual sample at the rejection or, when every draft passed, the bonus token from p[-1].
    Shared by `speculative_generate` and the engine (`reference.engine.speculation`).
    """
    emitted = []
    for i, token in enumerate(drafts):
        q_i = q[i] if q is not None else one_hot(token, p.shape[-1], p.dtype)
        accepted, token = speculative_accept(p[i], q_i, token, generator)
        emitted.append(token)
        if not accepted:
            return emitted, i + 1, i
    emitted.append(bonus_token(p[len(drafts)], generator))
    return emitted, len(drafts), len(drafts)


@dataclass
class SpecStats:
    """Counters of one `speculative_generate` call.

    proposed: draft tokens proposed; checked: drafts that reached the acceptance test (the ones
    after a rejection are discarded unchecked); accepted: drafts accepted; target_passes:
    verification forwards of the target (the prompt's prefill not counted); new_tokens: tokens
    returned; seconds: wall time of the call, draft_seconds of it in the drafter.
    """
    proposed: int = 0
    checked: int = 0
    accepted: int = 0
    target_passes: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    draft_seconds: float = 0.0

    @property
    def alpha_hat(self) -> float:
        """Measured acceptance rate accepted / checked, the estimate of alpha. (accepted / proposed
        is lower: a rejection discards the drafts after it without a test.)"""
        return self.accepted / self.checked if self.checked else float("nan")

    @property
    def tokens_per_pass(self) -> float:
        return self.new_tokens / self.target_passes if self.target_passes else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else float("nan")


def speculative_generate(target, draft, prompt_ids: list[int], max_new_tokens: int, *, k: int = 4,
                         temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                         seed: int | None = None, stop_ids: list[int] | None = None,
                         backend: str = "auto") -> tuple[list[int], SpecStats]:
    """Generate like `reference.decoding.generate(target, ...)`, drafting k tokens per target pass.

    draft: a drafter (`reference.drafters`) or a model with the target's call interface.
    Returns (new token ids, SpecStats). Greedy output equals `generate`'s token for token;
    sampled output has the target's distribution. A token in stop_ids ends the output, excluded.

    Cache invariant: at the start of every round the target's cache holds the keys and values of
    every token of the sequence except the last one (cache.length == len(sequence) - 1). The round
    feeds [last, d_1..d_k] (k + 1 positions); with m drafts accepted, the entries of last and
    d_1..d_m stay valid and those of the rejected drafts are cut off: cache.truncate(len - 1) on
    the grown sequence restores the invariant. The drafter keeps its own cache (see drafters).
    backend: how the target runs (`reference.cpu.backend_for`, as in `generate`).
    """
    check_request(target, prompt_ids, max_new_tokens)
    target = backend_for(target, backend)
    check_sampling(temperature, top_k, top_p)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k}")
    drafter = as_drafter(draft)
    draft_vocab = getattr(getattr(draft, "config", None), "vocab_size", target.config.vocab_size)
    if draft_vocab != target.config.vocab_size:
        raise ValueError(f"draft vocabulary ({draft_vocab}) differs from the target's "
                         f"({target.config.vocab_size})")
    generator = torch.Generator()
    if seed is None:
        generator.seed()  # nondeterministic
    else:
        generator.manual_seed(seed)

    def to_probs(logits: Tensor) -> Tensor:
        return filtered_probs(logits, temperature, top_k, top_p)

    stats, stop, start = SpecStats(), set(stop_ids or ()), time.perf_counter()
    tokens, out = list(prompt_ids), []
    max_len = len(tokens) + max_new_tokens
    cache = target.new_cache(batch=1, max_len=max_len)
    if len(tokens) > 1:
        target(torch.tensor([tokens[:-1]], device=device_of(target)), cache=cache)  # prefill: all but the last
    drafter.reset(max_len)
    while len(out) < max_new_tokens:
        # Draft no more than can be kept: a round emits up to len(drafts) + 1 tokens.
        draft_start = time.perf_counter()
        drafts, q = drafter.propose(tokens, min(k, max_new_tokens - len(out) - 1), to_probs, generator)
        stats.draft_seconds += time.perf_counter() - draft_start
        logits = target(torch.tensor([tokens[-1:] + drafts], device=device_of(target)), cache=cache)[0]
        p = to_probs(logits.cpu())  # [len+1, vocab], on the CPU with the generator
        stats.target_passes += 1
        stats.proposed += len(drafts)
        new, checked, accepted = accept_drafts(p, drafts, q, generator)
        stats.checked += checked
        stats.accepted += accepted
        for token in new:
            if token in stop:
                stats.new_tokens, stats.seconds = len(out), time.perf_counter() - start
                return out, stats
            out.append(token)
        tokens += new
        cache.truncate(len(tokens) - 1)  # the invariant: everything but the last token
    stats.new_tokens, stats.seconds = len(out), time.perf_counter() - start
    return out, stats


def tree_attention_mask(parents: list[int]) -> Tensor:
    """bool [n, n]: mask[i, j] is True when node j is node i or one of its ancestors.

    parents[i] is the index of node i's parent, -1 for a root; a parent comes before its
    children (breadth-first order does). Each node then sees only the path from its root.
    """
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if isinstance(parent, bool) or not isinstance(parent, int) or not -1 <= parent < i:
            raise ValueError(f"parents[{i}] = {parent!r}: a parent must be -1 or an earlier node (< {i})")
        if parent >= 0:
            mask[i] |= mask[parent]
    return mask


def tree_depths(parents: list[int]) -> list[int]:
    """Depth of each node (roots at 0): its position offset after the cached prefix."""
    depths: list[int] = []
    for parent in parents:
        depths.append(0 if parent < 0 else depths[parent] + 1)
    return depths


def verify_tree(model, cache, tree_ids: list[int], parents: list[int]) -> Tensor:
    """Target logits [n, vocab] for every node of a draft tree, in one forward pass.

    Node i sits at position cache.length + depth(i) and attends to the whole cached prefix and
    to its own ancestors (`tree_attention_mask`): its logits (row i) equal those of running its
    branch alone, the target's next-token logits after node i. The target's logits at the root,
    after the last committed token, come from the pass that fed that token: the previous pass
    when it is already cached, or this one when it is fed as the tree's single root node
    (tree_ids = [last] + nodes, every node's parent index shifted by one and the former roots'
    parents 0); then row 0 is the root's and row i + 1 node i's, the rows `tree_verify.accept_tree`
    takes as p. The cache then holds the prefix and every node's K/V in the order given, row
    prefix + i for node i: `keep_branch` keeps the accepted branch (truncating alone would keep
    the first nodes in that order, which are not a branch in general).
    """
    if len(tree_ids) != len(parents):
        raise ValueError(f"{len(tree_ids)} tree tokens but {len(parents)} parents")
    prefix = cache.length
    positions = prefix + torch.tensor(tree_depths(parents), dtype=torch.long, device=device_of(model))
    seen_prefix = torch.ones(len(parents), prefix, dtype=torch.bool)
    mask = torch.cat([seen_prefix, tree_attention_mask(parents)], dim=1).to(device_of(model))
    return model(torch.tensor([tree_ids], device=device_of(model)), positions, cache, mask=mask)[0]


def keep_branch(cache, prefix: int, parents: list[int], path: list[int]) -> int:
    """Keep an accepted branch of a verified draft tree in `cache` and drop the other nodes.

    cache: a `reference.kv_cache.KVCache` as `verify_tree` left it: positions < prefix hold the
        sequence, and node i's keys and values sit in row prefix + i of every layer, computed
        at position prefix + depth(i).
    parents: the tree (`verify_tree`'s parents). path: the accepted nodes, root first, each the
        child of the one before (the greedy walk, or `tree_verify.accept_tree`'s second result).
    A branch's rows are not contiguous in general (the branch 1 -> 4 sits in rows prefix + 1 and
    prefix + 4), so cutting the cache at prefix + len(path) alone would keep nodes 0 and 1. The
    path's rows are first gathered into rows prefix, prefix + 1, ..., which are exactly their
    positions (prefix + depth), in every layer of K and V; then the cache is cut after them.
    Medusa copies the accepted rows into place the same way. Returns the new length,
    prefix + len(path).
    """
    n = len(parents)
    if prefix < 0 or prefix + n > cache.length:
        raise ValueError(f"the cache holds {cache.length} positions, not a prefix of {prefix} "
                         f"and {n} tree nodes")
    for depth, node in enumerate(path):
        parent = -1 if depth == 0 else path[depth - 1]
        if not (isinstance(node, int) and 0 <= node < n and parents[node] == parent):
            raise ValueError(f"path {path} is not a branch from a root of the tree: node "
                             f"{node!r} at step {depth} should be a child of {parent}")
    kept = prefix + len(path)
    rows = torch.tensor([prefix + node for node in path], dtype=torch.long, device=cache.k.device)
    for buffer in (cache.k, cache.v):         # [layers, batch, kv heads, max_len, head_dim]
        buffer[:, :, :, prefix:kept] = buffer[:, :, :, rows]   # the gather copies first
    cache.truncate(kept)
    return kept
