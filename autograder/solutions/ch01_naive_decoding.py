"""Solutions of exercises/ch01_naive_decoding.ipynb, one section per solution cell.

Loaded with ``autograder.solutions.load_solutions("ch01_naive_decoding")``; never imported
as a module by the grader (each section is injected into the notebook and graded).
"""

# %% grade_id: naive_work
def naive_work(prompt_len: int, n_new: int) -> tuple[int, int]:
    """Work of the naive loop that generates `n_new` tokens after a `prompt_len`-token prompt.

    prompt_len: P >= 1. n_new: n >= 0.
    Returns (projected_positions, attention_cells), two ints: step i = 0 .. n-1 runs the model
    over L = P + i positions, adding L projected positions and L * L score cells (the full
    square matrix, before masking). With n_new == 0 nothing runs and the answer is (0, 0).
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
    """Causal scaled dot-product attention computed with the full T x T score matrix.

    q, k, v: float tensors of shape [..., T, D] with the same leading dims (e.g. [B, H, T, D]).
    Returns a tensor of shape [..., T, D] and the dtype of q: row t equals
    softmax over s <= t of (q_t . k_s / sqrt(D)), applied to the rows v_s.
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
    """Greedy decoding that re-runs `model` on the entire sequence at every step.

    model: callable, LongTensor [1, T] -> float logits [1, T, vocab] (call it without a cache).
    prompt_ids: the prompt, a non-empty list of ints. n_new: tokens to generate (>= 0).
    Returns the n_new generated ids (list of int), not including the prompt. Exactly one forward
    pass per new token; the input of step i holds len(prompt_ids) + i ids.
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
