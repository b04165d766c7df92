"""reference.incoherent: the rotation is orthogonal and leaves Q K^T alone,
and it shrinks the quantisation error that outlier channels cause."""
import pytest
import torch

from reference.incoherent import outlier_channels, random_hadamard, roundtrip, score_error


@pytest.mark.parametrize("dim", [1, 2, 64, 128])
def test_random_hadamard_is_orthogonal_and_keeps_scores(dim):
    gen = torch.Generator().manual_seed(dim)
    r = random_hadamard(dim, gen)
    assert torch.allclose(r @ r.T, torch.eye(dim, dtype=torch.float64), atol=1e-12), "R R^T must be I"
    q, k = torch.randn(5, dim, dtype=torch.float64), torch.randn(7, dim, dtype=torch.float64)
    assert torch.allclose((q @ r) @ (k @ r).T, q @ k.T, atol=1e-10), "rotating Q and K alike keeps Q K^T"


def test_random_hadamard_refuses_sizes_that_are_not_powers_of_two():
    with pytest.raises(ValueError, match="power of two"):
        random_hadamard(48, torch.Generator())


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
@pytest.mark.parametrize("block_rows", [None, 16])
def test_rotation_shrinks_the_error_outlier_channels_cause(fmt, block_rows):
    gen = torch.Generator().manual_seed(0)
    q = outlier_channels(128, 64, [3, 41], 30.0, gen)
    k = outlier_channels(128, 64, [3, 41], 30.0, gen)
    plain = score_error(q, k, fmt, block_rows=block_rows)
    rotated = score_error(q, k, fmt, random_hadamard(64, gen), block_rows=block_rows)
    assert rotated < plain / 2, f"{fmt}: rotated error {rotated:.2e} not below half of {plain:.2e}"


def test_block_scales_follow_each_block_and_a_ragged_split_is_refused():
    x = torch.ones(8, 4, dtype=torch.float64)
    x[4:] *= 1000.0
    assert torch.allclose(roundtrip(x, "int8", 4), x, rtol=1e-2), "each block needs its own scale"
    with pytest.raises(ValueError, match="blocks of 3"):
        roundtrip(x, "int8", 3)
