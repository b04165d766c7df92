"""The engine's decode attention on a CPU, reading the paged pool in place (reference/cpu/native_attention.c).

Why: a batched decode step of the engine attends each sequence's one new query over all its cached
keys. The torch path (`reference.attention.decode_rows_attention`) gathers those keys and values out
of the pool into a padded [B, H_kv, L, D] copy and then runs SDPA over the copy: the K/V bytes are
read, written and read again, and SDPA's CPU kernel, built for many queries, spends most of its
time on a single one. The C loop reads each key and value row once where it lies and keeps an
online softmax per query head: a step's attention costs one read of its K/V bytes
(`python -m reference.bench batch` measures the engine with and without it).

`reference.attention` takes this path by itself for the decode rows of a "torch" paged step when
`runs` says so: float32 CPU tensors, the switch on (REFERENCE_NATIVE_ATTENTION=0 or `set_enabled`
turn it off) and the native library built (reference/cpu/native_gemv.py: a C compiler, not switched
off by REFERENCE_NATIVE_GEMV=0). Otherwise the gather and SDPA run: the same arithmetic up to float
rounding (tests/model/test_native_attention.py holds both to a float64 computation).
"""
from __future__ import annotations

import torch
from torch import Tensor

from reference.cpu import native_gemv
from reference.switch import Switch

_switch = Switch("REFERENCE_NATIVE_ATTENTION")
enabled, set_enabled = _switch.enabled, _switch.set_enabled

MAX_HEADS = 64   # query heads that native_attention.c's per-sequence arrays hold


def runs(q: Tensor, k_cache: Tensor) -> bool:
    """Whether decode attention of queries q over this pool layer takes the native path."""
    return (_switch.on and q.dtype == k_cache.dtype == torch.float32 and q.is_cpu and k_cache.is_cpu
            and q.shape[1] <= MAX_HEADS and native_gemv.available())


def paged_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                 context_lens: Tensor) -> Tensor:
    """One query per sequence over its keys in a paged pool -> [B, H, D] (float32, CPU).

    q [B, H, D] (rows may be strided: a view of the QKV product; heads and dims contiguous);
    k_cache, v_cache: one layer of the pool [num_blocks, block_size, H_kv, D], contiguous;
    block_tables [B, M] int32 (-1 past a sequence's blocks); context_lens [B] int32, each in
    [1, M * block_size], whose blocks are all in [0, num_blocks). The tables are trusted here
    (`check_tables` checks them once per step): the C loop reads wherever they point.
    """
    B, H, D = q.shape
    num_blocks, block_size, n_kv, head_dim = k_cache.shape
    if not (head_dim == D and H % n_kv == 0 and q.stride()[1:] == (D, 1) and k_cache.is_contiguous()
            and v_cache.shape == k_cache.shape and v_cache.is_contiguous()
            and block_tables.dtype == context_lens.dtype == torch.int32 and block_tables.is_contiguous()
            and block_tables.shape[0] == B and context_lens.shape == (B,) and context_lens.is_contiguous()):
        raise ValueError(f"paged_decode: q {list(q.shape)} strides {q.stride()}, pool layer "
                         f"{list(k_cache.shape)}, tables {list(block_tables.shape)} {block_tables.dtype}, "
                         f"lengths {list(context_lens.shape)} {context_lens.dtype}: see the docstring")
    out = torch.empty(B, H, D)
    shape = torch.tensor([H, n_kv, D, block_size, block_tables.shape[1]])
    native_gemv._library().paged_decode_attention(
        shape.data_ptr(), q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
        block_tables.data_ptr(), context_lens.data_ptr(), B, out.data_ptr(), torch.get_num_threads())
    return out


def check_tables(block_tables: Tensor, context_lens: Tensor, block_size: int, num_blocks: int) -> None:
    """A clear error unless every sequence's context fits its table and every block it reads is
    in the pool (what `paged_decode` trusts)."""
    if len(context_lens) == 0:
        return
    if int(context_lens.min()) < 1 or int(context_lens.max()) > block_tables.shape[1] * block_size:
        raise ValueError(f"context lengths {context_lens.tolist()} must be in [1, "
                         f"{block_tables.shape[1] * block_size}] for tables of {block_tables.shape[1]} blocks")
    used = torch.arange(block_tables.shape[1]) * block_size < context_lens[:, None]
    read = block_tables[used]
    if int(read.min()) < 0 or int(read.max()) >= num_blocks:
        raise ValueError(f"a block table points outside the pool of {num_blocks} blocks "
                         f"(blocks read: {int(read.min())} to {int(read.max())})")
