"""The graders' large-score inputs: only a running max keeps their softmax finite."""
import math

import torch

from autograder.rules.inputs import climbing_scores, generator, large_rows


def test_large_rows_deal_every_kind_of_row():
    offsets, directions = large_rows(generator(0), (2, 3))
    kinds = {(o > 0, d > 0) for o, d in zip(offsets.flatten().tolist(), directions.flatten().tolist())}
    assert len(kinds) == 4, f"a kind of row is missing: {kinds}"
    assert ((offsets.abs() >= 900) & (offsets.abs() <= 1100)).all()


def test_climbing_scores_are_exact_in_float32_and_leave_float64s_exp_range():
    gen = generator(0)
    n_keys, tile = 64, 16
    for dim in (16, 32, 64):
        q, k = (torch.randn(n, dim, generator=gen) for n in (8, n_keys))
        offsets, directions = large_rows(gen, (8,))
        q32, k32 = climbing_scores(q, k, torch.arange(n_keys), offsets, directions)
        exact = q32.double() @ k32.double().T
        assert torch.equal((q32 @ k32.T).double(), exact), "q . k must be exact in float32"
        scores = exact / math.sqrt(dim)
        trend = (scores[:, -tile:].mean(-1) - scores[:, :tile].mean(-1)) * directions
        assert (trend > 48 * 32 - 300).all(), f"rows do not climb or fall by 32 per key: {trend}"
        assert ((scores[:, :tile].mean(-1) - offsets).abs() < 8 * 32 + 300).all()
        raw = torch.exp(scores).sum(-1)              # float64, no max subtracted
        escapes = (offsets > 0) | (directions < 0)   # at once; the fourth kind after ~50 keys
        assert not (torch.isfinite(raw) & (raw > 0))[escapes].any()
        first_tile = torch.exp(scores - scores[:, :tile].amax(-1, keepdim=True)).sum(-1)
        assert not torch.isfinite(first_tile)[directions > 0].any(), "a max taken once holds"
        assert torch.isfinite(torch.softmax(scores, -1)).all()
