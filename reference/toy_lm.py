"""A toy language model with the model call interface, for exact statistics (chapter 10).

`BigramModel(table)`: the next-token distribution after token t is table[t], whatever came
before. Its distributions are known exactly, so a sampler run through it can be compared with
them (chi-square, total variation), and with every row equal it is context-free: acceptances in
speculative decoding are then independent with a known alpha. It has what `generate` and
`speculative_generate` use: `config.vocab_size`, `config.max_seq_len`, `new_cache`, and
`model(ids [B, T], cache=cache) -> logits [B, T, vocab]`; its cache keeps only a length.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import Tensor


class LengthCache:
    """All a context-free model's cache needs: how many positions it holds, and truncate."""

    def __init__(self, max_len: int):
        self.length, self.max_len = 0, max_len

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate to {n}: cache holds {self.length} tokens")
        self.length = n


class BigramModel:
    """Logits log(table[t]) at every position holding token t; table [vocab, vocab], rows sum to 1."""

    def __init__(self, table: Tensor, max_seq_len: int = 10**7):
        if table.dim() != 2 or table.shape[0] != table.shape[1]:
            raise ValueError(f"table must be [vocab, vocab], got {tuple(table.shape)}")
        self.table = table
        self.config = SimpleNamespace(vocab_size=table.shape[0], max_seq_len=max_seq_len)

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> LengthCache:
        return LengthCache(max_len or self.config.max_seq_len)

    def __call__(self, input_ids: Tensor, cache: LengthCache | None = None) -> Tensor:
        if cache is not None:
            if cache.length + input_ids.shape[1] > cache.max_len:
                raise ValueError(f"cache full: {cache.length} + {input_ids.shape[1]} > {cache.max_len}")
            cache.length += input_ids.shape[1]
        return self.table[input_ids].log()


def random_table(vocab: int, generator: torch.Generator, concentration: int = 1) -> Tensor:
    """[vocab, vocab] rows drawn from a symmetric Dirichlet with integer concentration (higher:
    flatter rows): each entry a Gamma(concentration) draw, a sum of exponentials, normalised."""
    uniforms = torch.rand(vocab, vocab, concentration, generator=generator, dtype=torch.float64)
    gamma = -uniforms.clamp_min(1e-300).log().sum(-1)
    return (gamma / gamma.sum(-1, keepdim=True)).float()
