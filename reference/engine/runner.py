"""Runs the model once per step for every scheduled sequence, over one paged K/V pool.

The step's tokens are flattened into a single row of N tokens (prompt chunks and decode tokens
side by side), so every weight matrix is read once for the whole batch; the `PagedContext` tells
attention where each sequence's keys live (block tables) and where the new ones go (slot mapping).
"""
from __future__ import annotations

import torch
from torch import Tensor

from reference.context import PagedContext
from reference.engine.sequence import Sequence
from reference.paging import BlockManager


class ModelRunner:
    """Owns the K/V pool: k_pool, v_pool [n_layers, num_blocks, block_size, n_kv_heads, head_dim]."""

    def __init__(self, model, num_blocks: int, block_size: int, attention: str = "torch"):
        cfg = model.config
        p = model.embed.weight
        shape = (cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
        self.model = model
        self.attention = attention
        self.k_pool = torch.zeros(shape, dtype=p.dtype, device=p.device)
        self.v_pool = torch.zeros(shape, dtype=p.dtype, device=p.device)

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
    def run(self, batch: list[tuple[Sequence, int]], blocks: BlockManager) -> list[Tensor]:
        """Feed each (sequence, n) its next n tokens (its drafts included); return, per sequence,
        logits [1 + len(drafts), vocab] (float32) at its last token and at each draft."""
        device = self.k_pool.device
        tokens, positions, slots, tables, rows, counts = [], [], [], [], [], []
        for seq, n in batch:
            start = seq.num_computed
            tokens += [seq.token_at(p) for p in range(start, start + n)]
            positions += range(start, start + n)
            slots += blocks.slot_mapping(seq.request_id, start, start + n)
            tables.append(blocks.block_table(seq.request_id))
            counts.append(1 + len(seq.draft_ids))
            rows += range(len(tokens) - counts[-1], len(tokens))
        width = max(len(t) for t in tables)
        block_tables = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)
        context = PagedContext(
            positions=torch.tensor(positions, device=device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            query_lens=[n for _, n in batch],
            context_lens=torch.tensor([seq.num_computed + n for seq, n in batch], dtype=torch.int32, device=device),
            block_tables=block_tables, k_pool=self.k_pool, v_pool=self.v_pool, backend=self.attention)
        ids = torch.tensor([tokens], device=device)
        logits = self.model(ids, context=context, logits_rows=torch.tensor(rows, device=device))[0]
        return list(logits.split(counts))
