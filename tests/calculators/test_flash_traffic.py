"""The HBM byte counts of chapter 05's loop orders: the closed forms of
reference.calculators.flash_traffic against the loops of
reference.kernels.loop_orders, which compute attention and count every tile
they load or store."""
import pytest
import torch

from reference.calculators import flash_traffic as ft
from reference.kernels.flash_attention import hbm_bytes
from reference.kernels.loop_orders import (HBM, fa1_attention, fa2_attention,
                                           standard_attention)

SHAPES = [  # n_q, n_k, d, block_r, block_c: tiles that divide and tiles that do not
    (16, 16, 4, 4, 4), (12, 20, 8, 4, 8), (13, 29, 4, 5, 7), (7, 40, 16, 8, 3),
    (33, 9, 4, 16, 16)]


def run(loop, shape, element_bytes=2, stat_bytes=4):
    n_q, n_k, d, block_r, block_c = shape
    gen = torch.Generator().manual_seed(n_q * n_k + d)
    q = torch.randn(n_q, d, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(n_k, d, generator=gen, dtype=torch.float64) for _ in range(2))
    hbm = HBM(element_bytes, stat_bytes)
    tiles = {} if loop is standard_attention else {"block_r": block_r, "block_c": block_c}
    out = loop(q, k, v, hbm, **tiles)
    expected = torch.softmax(q @ k.T / d ** 0.5, dim=-1) @ v
    assert torch.allclose(out, expected, atol=1e-12), f"{loop.__name__} computes wrong attention"
    return hbm


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("element_bytes, stat_bytes", [(2, 4), (4, 4), (1, 2)])
def test_closed_forms_equal_the_bytes_the_loops_move(shape, element_bytes, stat_bytes):
    n_q, n_k, d, block_r, block_c = shape
    sizes = {"element_bytes": element_bytes}
    stats = {**sizes, "stat_bytes": stat_bytes}
    counted = {name: run(loop, shape, element_bytes, stat_bytes).total() for name, loop in
               [("standard", standard_attention), ("fa1", fa1_attention), ("fa2", fa2_attention)]}
    formula = {"standard": ft.standard_bytes(n_q, n_k, d, **sizes),
               "fa1": ft.fa1_bytes(n_q, n_k, d, block_c, **stats),
               "fa2": ft.fa2_bytes(n_q, n_k, d, block_r, **stats)}
    assert formula == counted, f"closed form {formula} != bytes the loops moved {counted}"


def test_fa1_rereads_and_rewrites_the_output_and_statistics_on_every_outer_step():
    n_q, n_k, d, block_r, block_c = shape = (12, 20, 8, 4, 5)
    moved = run(fa1_attention, shape).moved
    outer_steps = n_k // block_c
    assert moved["O"] == (1 + 2 * outer_steps) * n_q * d * 2, "O: initialised, then read and written per K/V tile"
    assert moved["m"] == moved["l"] == (1 + 2 * outer_steps) * n_q * 4, "m, l: like O, in fp32"
    assert moved["Q"] == outer_steps * n_q * d * 2, "Q: read in full once per K/V tile"
    assert moved["K"] == n_k * d * 2, "K: read once, in the outer loop"


def test_fa2_reads_q_once_and_k_v_once_per_query_tile():
    n_q, n_k, d, block_r, block_c = shape = (12, 20, 8, 4, 5)
    moved = run(fa2_attention, shape).moved
    assert moved["Q"] == moved["O"] == n_q * d * 2, "Q read and O written once each"
    assert moved["K"] == moved["V"] == (n_q // block_r) * n_k * d * 2, "K, V: once per query tile"
    assert moved["lse"] == n_q * 4, "one fp32 log-sum-exp per row"
    assert "m" not in moved and "l" not in moved, "m and l stay on chip"


@pytest.mark.parametrize("n, d, block", [(1024, 64, 128), (8192, 128, 64), (100, 32, 16)])
def test_fa2_and_standard_agree_with_the_kernel_modules_count(n, d, block):
    kernel = hbm_bytes(n, n, d, element_bytes=2, block_m=block)
    assert ft.fa2_bytes(n, n, d, block) == kernel["flash"], "the Triton kernel runs FA2's order"
    assert ft.standard_bytes(n, n, d) == kernel["naive"], "both count plain attention alike"


def test_with_equal_outer_tiles_fa1_moves_more_than_fa2_and_less_than_standard():
    n, d, tile = 8192, 64, 128
    fa1, fa2 = ft.fa1_bytes(n, n, d, tile), ft.fa2_bytes(n, n, d, tile)
    assert fa2 < fa1 < ft.standard_bytes(n, n, d)
    assert 1.5 < fa1 / fa2 < 1.6, "per outer step FA1 streams Q in, O in, O out; FA2 K and V"


def test_fa1_grows_as_n_squared_d_squared_over_m():
    """Theorem 2 of the FlashAttention paper: Theta(N^2 d^2 / M) accesses."""
    d, sram = 64, 100 * 1024
    _, block_c = ft.fa1_paper_tiles(sram, d)
    growth = ft.fa1_bytes(32768, 32768, d, block_c) / ft.fa1_bytes(16384, 16384, d, block_c)
    assert 3.9 < growth < 4.1, f"doubling N should about quadruple FA1's bytes, got {growth:.2f}x"


@pytest.mark.parametrize("sram, d, tiles", [(100 * 1024, 64, (64, 200)), (192 * 1024, 128, (128, 192)),
                                             (16 * 1024, 128, (16, 16))])
def test_paper_tiles_follow_algorithm_1(sram, d, tiles):
    assert ft.fa1_paper_tiles(sram, d) == tiles, "B_c = ceil(M / 4d), B_r = min(B_c, d), M in elements"
