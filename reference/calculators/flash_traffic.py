"""HBM bytes of one head's attention forward under three loop orders (chapter 05).

All counts are for one head with n_q queries and n_k keys of head_dim d:
element_bytes per element of Q, K, V, O, S and P (2 for fp16), stat_bytes per
entry of the per-row statistics m, l and the log-sum-exp (4: fp32).

- standard: three kernels. Q K^T writes S, the softmax reads S and writes P,
  P V reads P: b [(2 n_q + 2 n_k) d + 4 n_q n_k].
- FlashAttention 1 (Dao et al. 2022, Algorithm 1): K/V tiles of block_c keys
  in the OUTER loop, every query tile in the inner loop. O, l and m start in
  HBM (written once), and each outer step reads Q, O, l, m of every row and
  writes O, l, m back: 2 n_k d b + n_q d b + 2 n_q s
  + ceil(n_k / block_c) (3 n_q d b + 4 n_q s).
- FlashAttention 2 (Dao 2023): query tiles of block_r rows OUTER, K/V tiles
  inner. Q read once, K and V once per query tile, O and the log-sum-exp
  written once: (2 n_q + 2 n_k ceil(n_q / block_r)) d b + n_q s.

The inner tile size changes no byte count: whichever tensor the inner loop
streams is read in full once per outer step. `reference.kernels.loop_orders`
runs the three loops and counts the same bytes tile by tile (the tests compare).
"""
from __future__ import annotations


def standard_bytes(n_q: int, n_k: int, head_dim: int,
                   element_bytes: int = 2) -> int:
    """Bytes of the three-kernel attention: Q, K, V, O once, S and P twice."""
    inputs_outputs = (2 * n_q + 2 * n_k) * head_dim
    return (inputs_outputs + 4 * n_q * n_k) * element_bytes


def fa1_bytes(n_q: int, n_k: int, head_dim: int, block_c: int,
              element_bytes: int = 2, stat_bytes: int = 4) -> int:
    """Bytes of FlashAttention 1's order: K/V tiles of block_c keys outside."""
    outer_steps = -(-n_k // block_c)
    kv_once = 2 * n_k * head_dim * element_bytes
    initialise = n_q * head_dim * element_bytes + 2 * n_q * stat_bytes
    per_step = 3 * n_q * head_dim * element_bytes + 4 * n_q * stat_bytes
    return kv_once + initialise + outer_steps * per_step


def fa2_bytes(n_q: int, n_k: int, head_dim: int, block_r: int,
              element_bytes: int = 2, stat_bytes: int = 4) -> int:
    """Bytes of FlashAttention 2's order: query tiles of block_r rows outside."""
    outer_steps = -(-n_q // block_r)
    q_and_o = 2 * n_q * head_dim * element_bytes
    kv_per_step = 2 * n_k * head_dim * element_bytes
    return q_and_o + outer_steps * kv_per_step + n_q * stat_bytes


def fa1_paper_tiles(sram_bytes: int, head_dim: int,
                    element_bytes: int = 2) -> tuple[int, int]:
    """(block_r, block_c) by Algorithm 1's rule for an SRAM of M elements:
    block_c = ceil(M / 4d), block_r = min(ceil(M / 4d), d)."""
    elements = sram_bytes // element_bytes
    block_c = -(-elements // (4 * head_dim))
    return min(block_c, head_dim), block_c
