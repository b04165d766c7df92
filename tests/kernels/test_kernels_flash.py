"""Flash attention forward against float64 attention: output and log-sum-exp, every element."""
import itertools

import pytest
import torch

from kernel_support import (DEVICE, DTYPES, LSE_TOLERANCE, assert_matches, poisoned_outputs,  # noqa: F401
                            randn, seed, sweep_sample)
from reference.kernels import flash_attention
from reference.kernels.flash_attention import hbm_bytes
from reference.kernels.torch_reference import naive_attention, tiled_attention

# (B, Hq, Hkv, Nq, Nk, D, causal). Interpreter tiles are 16 x 16, so N > 16 spans several tiles;
# on a GPU (tiles of 64-128) the larger cases below cross tile edges too.
CASES = [
    (1, 1, 1, 1, 1, 16, False),          # one query, one key
    (1, 2, 1, 1, 1, 16, True),
    (1, 3, 1, 37, 37, 16, True),         # GQA 3, odd N, square causal
    (2, 2, 2, 19, 45, 32, False),        # Nq < Nk
    (1, 2, 2, 19, 45, 32, True),         # Nq < Nk causal: prefill after a cached prefix
    (1, 8, 1, 17, 33, 64, True),         # GQA 8
    (1, 8, 1, 33, 17, 64, False),        # Nq > Nk without a mask
    (1, 2, 1, 16, 32, 128, False),       # exact tile multiples
    (1, 3, 3, 1, 50, 64, True),          # a single causal query sees every key
    (2, 6, 2, 48, 48, 16, True),         # several full tiles on and off the diagonal
]
if DEVICE.type == "cuda":
    CASES += [(2, 9, 3, 300, 300, 64, True), (1, 4, 1, 129, 1000, 128, True), (2, 3, 1, 257, 255, 32, False),
              (1, 2, 2, 1000, 1000, 128, False), (1, 16, 2, 77, 4099, 64, True)]


def check_case(case, dtype, seed, sm_scale=None):
    batch, n_q_heads, n_kv_heads, n_q, n_k, head_dim, causal = case
    gen = torch.Generator().manual_seed(seed)
    q = randn(gen, batch, n_q_heads, n_q, head_dim, dtype=dtype)
    k = randn(gen, batch, n_kv_heads, n_k, head_dim, dtype=dtype)
    v = randn(gen, batch, n_kv_heads, n_k, head_dim, dtype=dtype)
    out, lse = flash_attention(q, k, v, causal=causal, sm_scale=sm_scale, return_lse=True)
    ref_out, ref_lse = naive_attention(q.double(), k.double(), v.double(), causal, sm_scale)
    assert out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (batch, n_q_heads, n_q)
    assert_matches(out, ref_out, dtype, seed, f"flash_attention {case}")
    lse_error = (lse.double().cpu() - ref_lse.cpu()).abs().max().item()     # NaN fails too
    assert lse_error <= LSE_TOLERANCE, f"lse {case} ({dtype}): max error {lse_error:.2e} (KERNEL_TEST_SEED={seed})"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_flash_attention_matches_float64(case, dtype, seed):
    check_case(case, dtype, seed)


@pytest.mark.kernel_sweep
def test_flash_attention_shape_sweep(seed):
    """Head dims x GQA ratios x causal x lengths x dtypes; a random sample unless KERNEL_SWEEP=all."""
    lengths = [(1, 1), (7, 7), (5, 33), (33, 65), (64, 64)]
    if DEVICE.type == "cuda":
        lengths += [(100, 1030), (513, 513), (1, 2000)]
    cases = [((1, 3 * ratio if ratio < 8 else 8, 3 if ratio < 8 else 1, n_q, n_k, d, causal), dtype)
             for d, ratio, causal, (n_q, n_k), dtype in itertools.product(
                 [16, 32, 64, 128], [1, 3, 8], [False, True], lengths, DTYPES)]
    for case, dtype in sweep_sample(cases, seed):
        check_case(case, dtype, seed)


def test_flash_attention_sm_scale_and_strided_inputs(seed):
    """A custom scale, and q/k/v as transposed views [B, N, H, D] -> [B, H, N, D] like the model's."""
    gen = torch.Generator().manual_seed(seed)
    q = randn(gen, 1, 21, 4, 32).transpose(1, 2)
    k, v = randn(gen, 1, 40, 2, 32).transpose(1, 2), randn(gen, 1, 40, 2, 32).transpose(1, 2)
    out = flash_attention(q, k, v, causal=True, sm_scale=0.3)
    assert_matches(out, naive_attention(q.double(), k.double(), v.double(), True, 0.3)[0],
                   torch.float32, seed, "strided views, sm_scale 0.3")


def test_tiled_attention_in_pytorch_is_exact(seed):
    """The readable loop nest gives attention in float64 for any tile sizes."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, 19, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 1, 45, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    for causal, (bm, bn) in itertools.product([False, True], [(16, 16), (5, 7), (64, 64)]):
        out, lse = tiled_attention(q, k, v, causal, block_m=bm, block_n=bn)
        ref_out, ref_lse = naive_attention(q, k, v, causal)
        assert torch.allclose(out, ref_out, atol=1e-12) and torch.allclose(lse, ref_lse, atol=1e-12), (causal, bm, bn)


def test_hbm_bytes_counts():
    """N = 1024, D = 64, fp16, 128-row tiles: naive moves the 4 N^2 score traffic, flash re-reads K, V 8 times."""
    counts = hbm_bytes(1024, 1024, 64, element_bytes=2, block_m=128)
    assert counts["naive"] == 4 * 1024 * 64 * 2 + 4 * 1024 * 1024 * 2
    assert counts["flash"] == (2 * 1024 + 2 * 1024 * 8) * 64 * 2 + 4 * 1024


def tensors(*shapes, dtype=torch.float32):
    return [torch.zeros(s, dtype=dtype, device=DEVICE) for s in shapes]


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((None, None, None), {}, TypeError, "must be a torch.Tensor"),
    (tensors((1, 2, 4, 16), (1, 2, 4, 16), (1, 2, 4, 16), dtype=torch.int32), {}, TypeError, "dtype torch.int32"),
    (tensors((1, 2, 4, 16), (1, 2, 4, 16)) + tensors((1, 2, 4, 16), dtype=torch.float16), {}, TypeError, "one dtype"),
    (tensors((2, 4, 16), (1, 2, 4, 16), (1, 2, 4, 16)), {}, ValueError, "4 dimensions"),
    (tensors((1, 3, 4, 16), (1, 2, 4, 16), (1, 2, 4, 16)), {}, ValueError, "multiple of K/V heads"),
    (tensors((1, 2, 4, 48), (1, 2, 4, 48), (1, 2, 4, 48)), {}, ValueError, "head dim must be one of"),
    (tensors((1, 2, 4, 16), (1, 2, 4, 16), (1, 2, 5, 16)), {}, ValueError, "same shape"),
    (tensors((1, 2, 4, 16), (2, 2, 4, 16), (2, 2, 4, 16)), {}, ValueError, "does not match q"),
    (tensors((1, 2, 5, 16), (1, 2, 4, 16), (1, 2, 4, 16)), {"causal": True}, ValueError, "Nq <= Nk"),
    (tensors((1, 2, 0, 16), (1, 2, 4, 16), (1, 2, 4, 16)), {}, ValueError, "at least one query"),
], ids=["not tensors", "int32", "mixed dtypes", "rank", "gqa", "head dim", "k/v shapes", "batch", "causal Nq>Nk", "empty"])
def test_flash_attention_rejects_bad_input(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        flash_attention(*args, **kwargs)


def test_flash_attention_rejects_mixed_devices():
    q = torch.zeros(1, 2, 4, 16, device=DEVICE)
    with pytest.raises(ValueError, match="one device"):
        flash_attention(q, torch.zeros(1, 2, 4, 16, device="meta"), torch.zeros(1, 2, 4, 16, device="meta"))
