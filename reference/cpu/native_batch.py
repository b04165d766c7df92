"""An engine step on a CPU with its element-wise work in C (reference/cpu/native_batch.c).

Why: an engine step multiplies all its rows (prompt chunks and decode tokens, flattened) by every
weight matrix, and between the products `Llama.forward` runs some twenty small torch operators a
layer: the two RMSNorms (six operators each), the residual adds, RoPE, the two K/V stores,
SiLU and the product with `up`, each a dispatch, an allocation and a pass over the rows (on a
small CPU a noticeable share of an engine step beside its matrix products: `python -m
reference.bench batch`). Here each group becomes one call
that passes over the rows once: x += residual and RMSNorm together, RoPE with the K/V store into
the pool, SiLU(gate) * up. The products stay torch's (`cpu_linear.linear`, oneDNN's packed
weights) and attention stays `reference.attention.paged_attention` (its decode rows in C,
`reference.cpu.native_attention`; prompt chunks through SDPA).

`reference.cpu.CpuModel` takes this path when `serves` says so: a `PagedContext` step with the
"torch" backend, float32 weights on the CPU, every layer, the switch on (REFERENCE_NATIVE_BATCH=0
or `set_enabled` turn it off) and the native library built (reference/cpu/native_gemv.py).
Otherwise its operators run: the same arithmetic up to float rounding
(tests/model/test_native_batch.py holds both to a float64 run).
"""
from __future__ import annotations

import torch
from torch import Tensor

from reference.cpu import native_attention, native_gemv
from reference.attention import PagedPlan, paged_attention
from reference.cpu.cpu_linear import linear
from reference.switch import Switch

_switch = Switch("REFERENCE_NATIVE_BATCH")
enabled, set_enabled = _switch.enabled, _switch.set_enabled


def serves(model, context, num_layers) -> bool:
    """Whether a forward of `model` with this context runs as `paged_step` (cheapest checks first)."""
    weight = model.embed.weight
    return (_switch.on and context is not None and num_layers is None and context.backend == "torch"
            and weight.dtype == torch.float32 and weight.is_cpu and context.k_pool.dtype == torch.float32
            and native_gemv.available())


def paged_step(model, input_ids: Tensor, context, logits_rows: Tensor | None) -> Tensor:
    """`model(input_ids [1, N], context=context, logits_rows=...)` -> logits [1, R, vocab]
    (R = N, or len(logits_rows)); the step's keys and values are stored in the context's pool."""
    cfg, lib = model.config, native_gemv._library()
    threads = torch.get_num_threads()
    n = input_ids.shape[1]
    positions, slots = _checked_rows(model, context, n)
    shape = torch.tensor([cfg.n_heads, cfg.n_kv_heads, cfg.head_dim])
    x = model.embed(input_ids)[0]                                        # [N, d]: the residual stream
    h = torch.empty_like(x)                                               # its normed copy
    norms = [block.attn_norm for block in model.blocks]
    lib.batch_rms_norm(x.data_ptr(), None, norms[0].weight.data_ptr(), h.data_ptr(), n, cfg.d_model,
                       norms[0].eps, threads)
    for layer, block in enumerate(model.blocks):
        qkv = linear(h, block.attn.qkv_proj.weight)                      # [N, (H + 2 H_kv) D]
        k_cache, v_cache = context.k_pool[layer], context.v_pool[layer]
        lib.batch_rope_store(qkv.data_ptr(), positions.data_ptr(), model.rope_turns.data_ptr(), slots.data_ptr(),
                             k_cache.data_ptr(), v_cache.data_ptr(), n, shape.data_ptr(), threads)
        q = qkv.view(n, -1, cfg.head_dim)[:, :cfg.n_heads]
        if context.plan is None:
            context.plan = decode_plan(context, q, k_cache)
        attended = paged_attention(q, k_cache, v_cache, context.block_tables, context.context_lens,
                                   context.query_lens, context.plan)
        out = linear(attended.reshape(n, -1), block.attn.o_proj.weight)
        lib.batch_rms_norm(x.data_ptr(), out.data_ptr(), block.mlp_norm.weight.data_ptr(), h.data_ptr(),
                           n, cfg.d_model, block.mlp_norm.eps, threads)
        gate_up = linear(h, block.mlp.gate_up_proj.weight)               # [N, 2 d_ff]
        hidden = torch.empty(n, cfg.d_ff)
        lib.batch_silu_mul(gate_up.data_ptr(), hidden.data_ptr(), n, cfg.d_ff, threads)
        out = linear(hidden, block.mlp.down_proj.weight)
        norm = norms[layer + 1] if layer + 1 < len(norms) else model.norm   # the next norm, or the final one
        lib.batch_rms_norm(x.data_ptr(), out.data_ptr(), norm.weight.data_ptr(), h.data_ptr(), n,
                           cfg.d_model, norm.eps, threads)
    if logits_rows is not None:
        h = h[logits_rows]
    return linear(h[None], model.embed.weight).float()


def _checked_rows(model, context, n: int) -> tuple[Tensor, Tensor]:
    """The step's positions and slots as contiguous int64 [N], after a clear error unless every
    position has a RoPE row and every slot (-1: not stored) is in the pool: the C code trusts them."""
    positions = context.positions.to(torch.int64).contiguous()
    slots = context.slot_mapping.to(torch.int64).contiguous()
    pool_slots = context.k_pool.shape[1] * context.k_pool.shape[2]
    if positions.shape != (n,) or slots.shape != (n,):
        raise ValueError(f"a step of {n} tokens needs {n} positions and slots, got "
                         f"{list(positions.shape)} and {list(slots.shape)}")
    if n and not (0 <= int(positions.min()) and int(positions.max()) < model.rope_turns.shape[0]):
        raise ValueError(f"positions must be in [0, {model.rope_turns.shape[0]}), got "
                         f"{int(positions.min())} to {int(positions.max())}")
    if n and not (-1 <= int(slots.min()) and int(slots.max()) < pool_slots):
        raise ValueError(f"slots must be -1 or in [0, {pool_slots}), got {int(slots.min())} to {int(slots.max())}")
    return positions, slots


def decode_plan(context, q: Tensor, k_cache: Tensor) -> PagedPlan:
    """The step's `PagedPlan`, its decode rows read in place by `native_attention.paged_decode`
    where that runs (float32 CPU tensors, the switch on), else gathered for SDPA."""
    kernel = native_attention.paged_decode if native_attention.runs(q, k_cache) else None
    plan = PagedPlan(context.block_tables, context.context_lens, context.query_lens, q, k_cache, kernel)
    if plan.decode_kernel is not None:
        native_attention.check_tables(plan.decode_tables, plan.decode_lens, k_cache.shape[1], k_cache.shape[0])
    return plan
