"""Runs the model once per step for every scheduled sequence, over one paged K/V pool.

The step's tokens are flattened into a single row of N tokens (prompt chunks and decode tokens
side by side), so every weight matrix is read once for the whole batch; the `PagedContext` tells
attention where each sequence's keys live (block tables) and where the new ones go (slot mapping).
"""
from __future__ import annotations

import time
from array import array

import torch
from torch import Tensor

from reference.context import PagedContext
from reference.engine.sequence import Sequence
from reference.paging import BlockManager


def triton_runs_on(device: torch.device) -> None:
    """Refuse, before any request is taken, an engine whose Triton kernels cannot run where its
    pool lives: compiled kernels need CUDA tensors, CPU tensors need the interpreter."""
    from reference.kernels.checks import INTERPRETED
    if device.type != "cuda" and not INTERPRETED:
        raise ValueError(f"attention='triton' runs Triton kernels, which need the model on a CUDA GPU, "
                         f"not {device}: use attention='torch' there, or set TRITON_INTERPRET=1 before "
                         "importing reference.kernels to interpret them")


class ModelRunner:
    """Owns the K/V pool: k_pool, v_pool [n_layers, num_blocks, block_size, n_kv_heads, head_dim]."""

    def __init__(self, model, num_blocks: int, block_size: int, attention: str = "torch"):
        cfg = model.config
        p = model.embed.weight
        shape = (cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
        if attention == "triton":
            triton_runs_on(p.device)
        self.model = model
        self.attention = attention
        self.k_pool = torch.zeros(shape, dtype=p.dtype, device=p.device)
        self.v_pool = torch.zeros(shape, dtype=p.dtype, device=p.device)
        self.model_seconds = 0.0     # wall time inside the model's forward, summed over steps

    @staticmethod
    def bytes_per_block(model, block_size: int) -> int:
        """K and V bytes of one block across all layers."""
        cfg, p = model.config, model.embed.weight
        return 2 * cfg.n_layers * block_size * cfg.n_kv_heads * cfg.head_dim * p.element_size()

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: block dst gets block src's K/V in every layer."""
        for src, dst in copies:
            self.k_pool[:, dst] = self.k_pool[:, src]
            self.v_pool[:, dst] = self.v_pool[:, src]

    @torch.inference_mode()
    def run(self, batch: list[tuple[Sequence, int]], blocks: BlockManager) -> Tensor:
        """Feed each (sequence, n) its next n tokens (its drafts included); return logits
        [R, vocab] float32: for each sequence whose feed reaches its last token, in batch order,
        the rows at that token and at each draft (1 + len(drafts) rows). A prompt chunk that is
        not its prompt's last gets no row. Adds the model call's time to `model_seconds`.

        The step's lists are built a run at a time (a slice of tokens, a range of positions, a
        block's run of slots), not a token at a time, and become tensors once.
        """
        device = self.k_pool.device
        tokens, positions, slots, rows, tables = [], [], [], [], []
        for seq, n in batch:
            start = seq.num_computed
            tokens += seq.tokens_between(start, start + n)
            positions += range(start, start + n)
            slots += blocks.slots(seq.request_id, start, start + n)
            tables.append(blocks.block_table(seq.request_id))
            if seq.feeds_to_end(n):
                rows += range(len(tokens) - 1 - len(seq.draft_ids), len(tokens))
        width = max(len(t) for t in tables)
        block_tables = int_tensor([b for t in tables for b in t + [-1] * (width - len(t))], torch.int32)
        context = PagedContext(
            positions=int_tensor(positions).to(device), slot_mapping=int_tensor(slots).to(device),
            query_lens=[n for _, n in batch],
            context_lens=int_tensor([seq.num_computed + n for seq, n in batch], torch.int32).to(device),
            block_tables=block_tables.view(len(tables), width).to(device),
            k_pool=self.k_pool, v_pool=self.v_pool, backend=self.attention)
        ids = int_tensor(tokens).to(device)[None]
        logits_rows = None if len(rows) == len(tokens) else int_tensor(rows).to(device)
        begin = time.perf_counter()
        logits = self.model(ids, context=context, logits_rows=logits_rows)[0]
        self.model_seconds += time.perf_counter() - begin
        return logits


def int_tensor(values: list[int], dtype: torch.dtype = torch.int64) -> Tensor:
    """torch.tensor(values, dtype=dtype) for a flat list of ints, a few times faster: `array`
    packs the list in C and the tensor shares its buffer."""
    if not values:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(array("q" if dtype == torch.int64 else "i", values), dtype=dtype)
