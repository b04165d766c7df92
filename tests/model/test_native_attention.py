"""reference.cpu.native_attention: the engine's decode attention read in place from the paged pool
equals attention computed in float64 over the same keys, whatever the block size, head layout,
thread count or row stride, serves the decode rows of a mixed step beside the gather's prompt
chunks, and refuses tables that point outside the pool before reading anything."""
import os
import subprocess
import sys

import pytest
import torch

from types import SimpleNamespace

from reference.cpu import native_attention, native_batch, native_gemv
from reference.attention import paged_attention
from test_cpu_linear import relative_error

pytestmark = pytest.mark.skipif(not native_gemv.available(),
                                reason=f"native code not built here: {native_gemv.describe()}")


def paged_pool(context_lens, block_size, n_kv, head_dim, seed, spare_blocks=5):
    """K and V pools [num_blocks, block_size, n_kv, head_dim] and int32 tables whose blocks are a
    shuffled selection of the pool (-1 past each sequence's blocks)."""
    g = torch.Generator().manual_seed(seed)
    needed = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(needed) + spare_blocks
    k = torch.randn(num_blocks, block_size, n_kv, head_dim, generator=g)
    v = torch.randn(num_blocks, block_size, n_kv, head_dim, generator=g)
    order, used = torch.randperm(num_blocks, generator=g), 0
    tables = torch.full((len(context_lens), max(needed) + 2), -1, dtype=torch.int32)
    for b, m in enumerate(needed):
        tables[b, :m] = order[used:used + m].int()
        used += m
    return k, v, tables, torch.tensor(context_lens, dtype=torch.int32)


def attention64(q, k, v, tables, context_lens, query_lens):
    """Causal attention of each sequence's last query_lens[b] positions, in float64 -> [N, H, D]."""
    H, block_size, n_kv = q.shape[1], k.shape[1], k.shape[2]
    rows, first = [], 0
    for b, (n, t) in enumerate(zip(context_lens.tolist(), query_lens)):
        positions = torch.arange(n)
        blocks = tables[b].long()[positions // block_size]
        keys = k.double()[blocks, positions % block_size].repeat_interleave(H // n_kv, dim=1)
        values = v.double()[blocks, positions % block_size].repeat_interleave(H // n_kv, dim=1)
        scores = torch.einsum("thd,shd->hts", q[first:first + t].double(), keys) / q.shape[-1] ** 0.5
        visible = positions[None, :] <= torch.arange(n - t, n)[:, None]
        weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        rows.append(torch.einsum("hts,shd->thd", weights, values))
        first += t
    return torch.cat(rows)


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@pytest.mark.parametrize("block_size, n_heads, n_kv, head_dim", [
    (16, 9, 3, 64),     # SmolLM2's heads, the engine's block size
    (4, 6, 2, 8),       # runs shorter than RUN, head_dim below a vector
    (32, 4, 4, 24),     # two runs a block, multi-head attention, head_dim no multiple of 16
    (8, 5, 1, 16),      # multi-query attention
])
def test_decode_equals_float64_attention(threads, block_size, n_heads, n_kv, head_dim):
    lens = [1, block_size, block_size + 1, 3 * block_size - 1, 77, 290]
    k, v, tables, context_lens = paged_pool(lens, block_size, n_kv, head_dim, seed=block_size + threads)
    # q as the engine passes it: a view of the QKV product, rows strided past the K and V heads.
    qkv = torch.randn(len(lens), n_heads + 2 * n_kv, head_dim, generator=torch.Generator().manual_seed(3))
    q = qkv[:, :n_heads]
    out = native_attention.paged_decode(q, k, v, tables, context_lens)
    want = attention64(q, k, v, tables, context_lens, [1] * len(lens))
    assert out.shape == want.shape and out.dtype == torch.float32
    for b in range(len(lens)):
        assert relative_error(out[b], want[b]) < 1e-5, f"sequence {b} ({lens[b]} positions) differs"


def test_scores_far_apart_keep_their_weights():
    """Scores spread over hundreds of units: the running max is replaced many times and most
    weights underflow, as in a sharply peaked softmax."""
    k, v, tables, context_lens = paged_pool([300, 45], 16, 3, 64, seed=7)
    k *= 30 * torch.rand(k.shape[:2], generator=torch.Generator().manual_seed(9))[..., None, None]
    q = 3 * torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(8))
    out = native_attention.paged_decode(q, k, v, tables, context_lens)
    want = attention64(q, k, v, tables, context_lens, [1, 1])
    assert relative_error(out, want) < 1e-5


@pytest.mark.parametrize("native", [True, False], ids=["native", "gather"])
def test_mixed_step_serves_decodes_natively_beside_prompt_chunks(monkeypatch, native):
    """A step of two decodes, a whole prompt and a chunk: the decode rows go to the native loop
    (or, switched off, to the gather), the chunks to SDPA; every row equals float64 attention."""
    calls = []
    real = native_attention.paged_decode
    monkeypatch.setattr(native_attention, "paged_decode", lambda *a: calls.append(a) or real(*a))
    previous = native_attention.set_enabled(native)
    try:
        context_lens, query_lens = [1, 37, 20, 9], [1, 1, 20, 4]
        k, v, tables, lens = paged_pool(context_lens, 4, 2, 8, seed=11)
        q = torch.randn(sum(query_lens), 6, 8, generator=torch.Generator().manual_seed(12))
        step = SimpleNamespace(block_tables=tables, context_lens=lens, query_lens=query_lens)
        out = paged_attention(q, k, v, tables, lens, query_lens, native_batch.decode_plan(step, q, k))
    finally:
        native_attention.set_enabled(previous)
    assert relative_error(out, attention64(q, k, v, tables, lens, query_lens)) < 1e-5
    assert len(calls) == native
    if native:
        assert calls[0][0].shape == (2, 6, 8)          # only the two decode rows


def engine_replies(model, switch, native: bool) -> list[list[int]]:
    """Greedy replies of `model` served by the engine (chunked prompts beside decodes) with the
    fast path behind `switch` (a module with `set_enabled`) on or off."""
    from reference.engine import LLM, SamplingParams
    from reference.tokenizer import ByteTokenizer

    prompts = [[1, 2, 3], list(range(5, 40)), [7] * 18, list(range(60, 64))]
    previous = switch.set_enabled(native)
    try:
        llm = LLM(model, tokenizer=ByteTokenizer(), max_num_seqs=4, block_size=4, max_num_batched_tokens=24)
        outs = llm.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    finally:
        switch.set_enabled(previous)
    return [o.token_ids for o in outs]


def test_engine_replies_equal_with_and_without_native_attention():
    """The tiny model served with chunked prompts beside decodes: the same greedy replies."""
    from reference.model import build_tiny

    model = build_tiny(3)
    assert engine_replies(model, native_attention, True) == engine_replies(model, native_attention, False)


@pytest.mark.parametrize("table_edit, lens_edit, message", [
    (lambda t: t.__setitem__((1, 0), 10_000), None, "outside the pool"),
    (lambda t: t.__setitem__((0, 0), -1), None, "outside the pool"),
    (None, lambda n: n.__setitem__(1, 0), "context lengths"),
    (None, lambda n: n.__setitem__(0, 10_000), "context lengths"),
])
def test_bad_tables_are_refused_before_reading(table_edit, lens_edit, message):
    k, v, tables, lens = paged_pool([5, 9], 4, 1, 8, seed=0)
    for edit, value in ((table_edit, tables), (lens_edit, lens)):
        if edit is not None:
            edit(value)
    q = torch.randn(2, 2, 8)
    step = SimpleNamespace(block_tables=tables, context_lens=lens, query_lens=[1, 1])
    with pytest.raises(ValueError, match=message):
        native_batch.decode_plan(step, q, k)


def test_wrong_layout_is_a_clear_error():
    k, v, tables, lens = paged_pool([5, 9], 4, 1, 8, seed=0)
    with pytest.raises(ValueError, match="paged_decode"):
        native_attention.paged_decode(torch.randn(2, 2, 8), k, v, tables.long(), lens)
    with pytest.raises(ValueError, match="paged_decode"):
        native_attention.paged_decode(torch.randn(2, 8, 2).transpose(1, 2), k, v, tables, lens)


def test_switch_and_when_it_runs():
    q, k = torch.randn(2, 9, 64), torch.randn(4, 16, 3, 64)
    assert native_attention.runs(q, k)
    assert not native_attention.runs(q.double(), k.double())
    previous = native_attention.set_enabled(False)
    try:
        assert not native_attention.runs(q, k)
    finally:
        native_attention.set_enabled(previous)
    code = "from reference.cpu import native_attention; print(native_attention.enabled())"
    env = {**os.environ, "REFERENCE_NATIVE_ATTENTION": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
