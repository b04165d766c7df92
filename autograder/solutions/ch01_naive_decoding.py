"""Solutions of exercises/ch01_naive_decoding.ipynb, one section per solution cell.

Loaded with ``autograder.solutions.load_solutions("ch01_naive_decoding")``; never imported
as a module by the grader (each section is injected into the notebook and graded).
"""

# %% grade_id: naive_work
def naive_work(prompt_len: int, n_new: int) -> tuple[int, int]:
    """Work done by the naive decoding loop, counted as in CONTRIBUTING.md.

    Step i (0 <= i < n_new) feeds L = prompt_len + i positions to the model: every one of
    them is projected again (L rows) and attention fills a full L x L score matrix.
    Returns (projected_positions, attention_cells).
    """
    projected, cells = 0, 0
    for step in range(n_new):
        seq_len = prompt_len + step
        projected += seq_len
        cells += seq_len * seq_len
    return projected, cells


# %% grade_id: causal_attention
import math

import torch
from torch import Tensor


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Scaled dot-product attention with a causal mask over the full T x T score matrix.

    q, k, v: [..., T, D] floating tensors with the same leading dims. Returns [..., T, D]:
    row t is a softmax-weighted mix of v[..., :t+1, :] with weights
    softmax(q_t . k_s / sqrt(D)) over the allowed positions s <= t.
    """
    n_pos, dim = q.shape[-2], q.shape[-1]
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(dim)
    future = torch.ones(n_pos, n_pos, dtype=torch.bool, device=q.device).triu(diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, v)


# %% grade_id: naive_generate
import torch


def naive_generate(model, prompt_ids: list[int], n_new: int) -> list[int]:
    """Greedy decoding without a cache: every step re-runs the model on the whole sequence.

    model(ids) takes a LongTensor [1, T] and returns logits [1, T, vocab]. The next token is
    the argmax of the last row. Returns the n_new generated ids only (not the prompt).
    """
    seq = [int(t) for t in prompt_ids]
    generated: list[int] = []
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(torch.tensor([seq], dtype=torch.long))
            token = int(torch.argmax(logits[0, -1]))
            generated.append(token)
            seq.append(token)
    return generated
