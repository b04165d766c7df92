"""Sampling-exact verification of a draft *tree* (chapter 10): SpecInfer's multi-step
speculative sampling (Miao et al. 2024, Algorithm 2 "VerifyStochastic").

A chain (`reference.speculative.accept_drafts`) tests one draft per position. A tree offers
several siblings for the same position, and testing each against the same target p with
min(1, p / q) is not exact: every sibling gets its own chance at the overlap min(p, q), so the
tokens both models like come out too often. The exact rule is recursive. At a node with target
distribution p and children c_1..c_m, test c_1 against p; if it is rejected, the target's
distribution for the next test becomes the residual p <- norm(max(0, p - q_1)) and c_2 is tested
against that, and so on; when every child is rejected, the token is drawn from the last residual.
An accepted child becomes the node, and the walk goes on below it with its own p and children;
an accepted leaf gets the bonus token from the target's distribution after it.

Exact provided each child's token was drawn from the q it is tested with, given its ancestors and
its earlier siblings and independently of the acceptance coins: siblings drawn i.i.d. from the
drafter's q (duplicates allowed), or deterministic candidates such as a top-k list (q one-hot:
accept c with probability p(c), the residual is p with c removed and renormalised). Siblings drawn
*without* replacement need the conditional q of each draw, which the caller passes row by row.
"""
from __future__ import annotations

import torch
from torch import Tensor


def check_tree(tokens: list[int], parents: list[int]) -> list[list[int]]:
    """children[r]: the nodes whose parent is row r - 1 (row 0 the root), in the order given.

    parents[i] is -1 for a child of the root (the last committed token) or an earlier node."""
    if len(tokens) != len(parents):
        raise ValueError(f"{len(tokens)} tree tokens but {len(parents)} parents")
    children: list[list[int]] = [[] for _ in range(len(tokens) + 1)]
    for i, parent in enumerate(parents):
        if isinstance(parent, bool) or not isinstance(parent, int) or not -1 <= parent < i:
            raise ValueError(f"parents[{i}] = {parent!r}: a parent must be -1 or an earlier node (< {i})")
        children[parent + 1].append(i)
    return children


def accept_tree(p: Tensor, tokens: list[int], parents: list[int], q: Tensor | None = None,
                generator: torch.Generator | None = None) -> tuple[list[int], list[int]]:
    """One round of tree verification under sampling, exact for the target's distribution.

    tokens, parents: the draft tree, n nodes; parents[i] = -1 for a child of the root (the last
        committed token), else an earlier node (breadth-first order does).
    p: float [n + 1, vocab], the target's (filtered) next-token probabilities: row 0 at the root
        (after the last committed token), row i + 1 after node i. `verify_tree` returns node i's
        row; the root's comes from the pass that fed the last token: the previous one when that
        token is cached, or this one when it is fed as the tree's single root node (then
        `verify_tree` over [last] + tokens returns all n + 1 rows, through softmax).
    q: float [n, vocab], row i the distribution node i's token was drawn from (given its path and
        its earlier siblings), or None for deterministic candidates (each one-hot at its token).
    Returns (tokens to emit, accepted nodes): the accepted path, root first, as node indices, and
    the emitted tokens, which are the path's tokens followed by one more, drawn from the residual
    where every child was rejected or from the target's row after an accepted leaf. So
    len(emitted) == len(path) + 1, between 1 and depth + 1 tokens per round.
    `speculative.keep_branch(cache, prefix, parents, path)` then keeps the path's K/V rows.
    A chain (parents [-1, 0, 1, ...]) draws the same random numbers as `accept_drafts` and gives
    the same tokens for the same generator state.
    """
    children = check_tree(tokens, parents)
    if p.dim() != 2 or p.shape[0] != len(tokens) + 1:
        raise ValueError(f"p must be [{len(tokens) + 1}, vocab], got {tuple(p.shape)}")
    if q is not None and q.shape != (len(tokens), p.shape[1]):
        raise ValueError(f"q must be [{len(tokens)}, {p.shape[1]}], got {tuple(q.shape)}")
    path: list[int] = []
    row = 0                                    # the node whose children are tested (0 = root)
    while True:
        weights, total = p[row], 1.0           # the target's distribution: weights / total
        for child in children[row]:
            x = tokens[child]
            if q is None:
                q_child = torch.zeros_like(weights)
                q_child[x] = 1.0
            else:
                q_child = q[child]
            u = torch.rand((), generator=generator, dtype=torch.float64).item()
            if u * q_child[x].item() * total < weights[x].item():   # u < p'(x) / q(x)
                path.append(child)
                row = child + 1
                break
            residual = (weights / total - q_child).clamp_min(0.0)  # rejected: p' <- max(0, p' - q)
            if residual.sum().item() > 0.0:    # else p' == q up to rounding: rejection had probability 0
                weights, total = residual, residual.sum().item()
        else:                                  # every child rejected, or a leaf accepted: one more token
            last = int(torch.multinomial(weights, 1, generator=generator))
            return [tokens[i] for i in path] + [last], path
