"""The fused softmax kernel against a float64 softmax: fresh inputs, poisoned outputs, edge rows."""
import os
import subprocess
import sys

import pytest
import torch

from kernel_support import DEVICE, DTYPES, assert_matches, poisoned_outputs, randn, seed  # noqa: F401
from reference.kernels import softmax
from reference.kernels.softmax import MAX_BLOCK, softmax_torch
from reference.kernels.torch_reference import online_softmax

# (shape, scale): single-block rows of odd and power-of-two widths, leading batch dims, rows
# longer than one block (the two-sweep path) and large values that overflow exp without the max.
SHAPES = [((1, 1), 1.0), ((3, 5), 1.0), ((4, 128), 1.0), ((2, 3, 97), 3.0), ((5, 1000), 1.0),
          ((3, 7), 1e4), ((2, MAX_BLOCK + 3), 1.0), ((2, 2 * MAX_BLOCK + 1), 50.0)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, scale", SHAPES, ids=str)
def test_softmax_matches_float64(shape, scale, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn(gen, *shape, dtype=dtype, scale=scale)
    out = softmax(x)
    assert out.dtype == dtype and out.device == x.device
    assert_matches(out, torch.softmax(x.double(), dim=-1), dtype, seed, f"softmax {shape} scale {scale}")


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's 0/0
@pytest.mark.parametrize("n_cols", [9, MAX_BLOCK + 5], ids=["one block", "two sweeps"])
def test_softmax_minus_inf_entries_and_rows(n_cols, seed):
    """-inf entries get probability 0 (also a whole leading block of them); an all -inf row is NaN
    like torch.softmax's."""
    gen = torch.Generator().manual_seed(seed)
    x = randn(gen, 4, n_cols, scale=5.0)
    x[0, : n_cols - 2] = float("-inf")           # only the last two entries are finite
    x[1, ::2] = float("-inf")
    x[2] = float("-inf")                          # no finite entry
    out = softmax(x)
    ref = torch.softmax(x.double(), dim=-1)
    assert torch.isnan(out[2]).all(), "an all -inf row must give NaN (as torch.softmax does)"
    assert (out[0, : n_cols - 2] == 0).all() and (out[1, ::2] == 0).all(), "exp(-inf) must be exactly 0"
    assert_matches(out, ref, torch.float32, seed, "softmax with -inf")


def test_softmax_non_contiguous_input(seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn(gen, 33, 20).t()                    # rows of stride 20: copied once, then fused
    assert_matches(softmax(x), torch.softmax(x.double(), dim=-1), torch.float32, seed, "transposed input")


def test_torch_versions_agree(seed):
    """The readable references: unfused ops and the tile-by-tile online softmax."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 50, generator=gen, dtype=torch.float64) * 30
    ref = torch.softmax(x, dim=-1)
    assert torch.allclose(softmax_torch(x), ref, rtol=1e-12, atol=1e-15)
    for tile in (1, 7, 50, 64):
        assert torch.allclose(online_softmax(x, tile), ref, rtol=1e-12, atol=1e-15), f"tile {tile}"
    # A first tile of only -inf must not poison the row: exp(-inf - -inf) would be NaN.
    x[:, :7] = float("-inf")
    got = online_softmax(x, 7)
    assert not got.isnan().any(), "a leading all -inf tile made the row NaN"
    assert torch.allclose(got, torch.softmax(x, dim=-1), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("bad, error, message", [
    ([1.0, 2.0], TypeError, "torch.Tensor"),
    (torch.arange(6).view(2, 3), TypeError, "dtype torch.int64"),
    (torch.zeros(3, 0), ValueError, "non-empty last dimension"),
    (torch.tensor(1.0), ValueError, "non-empty last dimension"),
], ids=["list", "int64", "empty row", "scalar"])
def test_softmax_rejects_bad_input(bad, error, message):
    if isinstance(bad, torch.Tensor):
        bad = bad.to(DEVICE)
    with pytest.raises(error, match=message):
        softmax(bad)


@pytest.mark.skipif(DEVICE.type == "cuda", reason="the message is for machines without a GPU")
def test_cpu_without_interpreter_says_what_is_needed():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import torch\nfrom reference.kernels import softmax\n"
            "try:\n    softmax(torch.ones(2, 3))\nexcept ValueError as err:\n    print(err)\n")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "need a CUDA device" in result.stdout and "TRITON_INTERPRET=1" in result.stdout, result.stdout + result.stderr
