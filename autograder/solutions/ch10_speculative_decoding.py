"""Solutions of exercises/ch10_speculative_decoding.ipynb, one section per solution cell.

Loaded with ``autograder.solutions.load_solutions("ch10_speculative_decoding")``; never imported
as a module by the grader (each section is injected into the notebook and graded).
"""

# %% grade_id: acceptance_rate
import torch
from torch import Tensor


def acceptance_rate(p: Tensor, q: Tensor) -> float:
    """The chance that a token drawn from the draft q is accepted under the target p.

    p, q: probability vectors [vocab] (non-negative, each summing to 1).
    Returns alpha = sum over x of min(p(x), q(x)), a float in [0, 1].
    """
    return float(torch.minimum(p.double(), q.double()).sum())


# %% grade_id: expected_tokens
def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens emitted per target pass with k drafts accepted independently with
    probability alpha: the accepted drafts plus the one token the target always adds.

    alpha in [0, 1], k >= 0 an int. alpha = 1 must give k + 1 (no division by zero).
    """
    return float(sum(alpha ** j for j in range(k + 1)))


# %% grade_id: accept_and_residual
import torch
from torch import Tensor


def accept_and_residual(p: Tensor, q: Tensor, draft_token: int) -> tuple[float, Tensor]:
    """The two halves of one verification step, for a draft token x drawn from q.

    p, q: probability vectors [vocab] of the target and of the draft (q(x) > 0).
    Returns (accept_probability, residual): the probability of keeping x, min(1, p(x) / q(x)),
    and the distribution [vocab] to draw from instead when x is rejected, max(0, p - q)
    normalised to sum 1 (return p itself when max(0, p - q) is all zeros).
    """
    accept = min(1.0, float(p[draft_token]) / float(q[draft_token]))
    residual = (p - q).clamp_min(0.0)
    total = float(residual.sum())
    return accept, (residual / total if total > 0 else p.clone())


# %% grade_id: tree_attention_mask
import torch
from torch import Tensor


def tree_attention_mask(parents: list[int]) -> Tensor:
    """Attention mask for a tree of draft tokens verified in one pass.

    parents[i] is the index of node i's parent, or -1 for a root; every parent comes before
    its children. Returns a bool tensor [n, n] with mask[i, j] True exactly when node j is
    node i itself or one of its ancestors (parent, grandparent, ...).
    """
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i] |= mask[parent]
    return mask


# %% grade_id: speculative_generate
import torch


def speculative_generate(target, draft, prompt_ids: list[int], n_new: int, k: int,
                         target_cache, draft_cache) -> list[int]:
    """Greedy speculative decoding: the draft proposes k tokens, one target pass verifies them.

    target, draft: models called as model(ids [1, T], cache=cache) -> logits [1, T, vocab].
    target_cache, draft_cache: empty KV caches (with .length and .truncate(n)) for each model.
    Returns the n_new token ids greedy decoding of `target` alone would produce.
    Each round: the draft proposes d_1..d_k greedily; ONE target forward over
    [last token, d_1..d_k] checks them; keep the drafts up to the first one that differs from
    the target's argmax, then add the target's own token (its correction, or the bonus token
    when all k agree); cut both caches back so that they hold every kept token but the last
    (when all k drafts are accepted, the draft's cache never saw d_k: feed it to catch up).
    """
    tokens, out = list(prompt_ids), []
    if len(tokens) > 1:
        target(torch.tensor([tokens[:-1]]), cache=target_cache)
        draft(torch.tensor([tokens[:-1]]), cache=draft_cache)
    while len(out) < n_new:
        n_draft = min(k, n_new - len(out) - 1)
        feed, drafts = [tokens[-1]], []
        for _ in range(n_draft):
            token = int(draft(torch.tensor([feed]), cache=draft_cache)[0, -1].argmax())
            drafts.append(token)
            feed = [token]
        best = target(torch.tensor([tokens[-1:] + drafts]), cache=target_cache)[0].argmax(-1).tolist()
        kept = 0
        while kept < len(drafts) and drafts[kept] == best[kept]:
            kept += 1
        new = drafts[:kept] + [best[kept]]
        tokens += new
        out += new
        target_cache.truncate(len(tokens) - 1)
        draft_cache.truncate(min(draft_cache.length, len(tokens) - 1))
        if draft_cache.length < len(tokens) - 1:  # all drafts kept: the last one was never fed
            draft(torch.tensor([tokens[draft_cache.length:-1]]), cache=draft_cache)
    return out[:n_new]
