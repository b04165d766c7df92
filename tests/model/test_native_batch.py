"""reference.cpu.native_batch: an engine step (through `reference.cpu.CpuModel`) whose element-wise
work runs in C gives the logits and
stores the keys and values that the model's own operators give in float64, serves only the steps
it should, and refuses positions or slots outside the model or the pool before writing anything."""
import copy
import os
import subprocess
import sys

import pytest
import torch

from reference.cpu import CpuModel, native_batch, native_gemv
from reference.context import PagedContext
from reference.model import TINY, ModelConfig
from test_cpu_linear import relative_error
from test_native_attention import engine_replies
from test_native_step import ODD, random_model

pytestmark = pytest.mark.skipif(not native_gemv.available(),
                                reason=f"native code not built here: {native_gemv.describe()}")


def paged_step_inputs(model, context_lens, query_lens, block_size=4, seed=0):
    """ids [1, N] and a PagedContext for one engine step: sequence b has context_lens[b] positions
    after the step, of which the last query_lens[b] are fed now; the earlier ones already hold
    random keys and values in a pool of shuffled blocks. The pool follows the model's dtype."""
    cfg, g = model.config, torch.Generator().manual_seed(seed)
    dtype = model.embed.weight.dtype
    needed = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(needed) + 3
    shape = (cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
    k_pool, v_pool = torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)
    order, used = torch.randperm(num_blocks, generator=g), 0
    tables = torch.full((len(context_lens), max(needed)), -1, dtype=torch.int32)
    positions, slots = [], []
    for b, (n, t) in enumerate(zip(context_lens, query_lens)):
        tables[b, :needed[b]] = order[used:used + needed[b]].int()
        used += needed[b]
        for p in range(n - t, n):
            positions.append(p)
            slots.append(int(tables[b, p // block_size]) * block_size + p % block_size)
    ids = torch.randint(0, cfg.vocab_size, (1, sum(query_lens)), generator=g)
    context = PagedContext(positions=torch.tensor(positions), slot_mapping=torch.tensor(slots),
                           query_lens=list(query_lens), context_lens=torch.tensor(context_lens, dtype=torch.int32),
                           block_tables=tables, k_pool=k_pool, v_pool=v_pool)
    return ids, context


@pytest.fixture
def native_calls(monkeypatch):
    calls, real = [], native_batch.paged_step
    monkeypatch.setattr(native_batch, "paged_step", lambda *a: calls.append(a) or real(*a))
    return calls


# One layer, rows wide enough that a step of 1,100 tokens passes PARALLEL_FLOATS in every C loop.
WIDE = ModelConfig(vocab_size=97, d_model=72, n_layers=1, n_heads=3, n_kv_heads=1, head_dim=24,
                   d_ff=80, rope_base=10000.0, max_seq_len=1200)
STEPS = {
    "mixed": ([9, 14, 30, 5], [1, 1, 30, 3]),   # two decodes, a whole prompt, a chunk after a cached prefix
    "decodes": ([6, 40, 17], [1, 1, 1]),
}


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@pytest.mark.parametrize("cfg, steps", [
    *((TINY, steps) for steps in STEPS.values()), *((ODD, steps) for steps in STEPS.values()),
    (WIDE, ([1100], [1100])),                   # one long prompt: its rows split over the threads
], ids=["tiny-mixed", "tiny-decodes", "odd-mixed", "odd-decodes", "wide-prompt"])
def test_step_equals_the_operators_in_float64(native_calls, threads, cfg, steps):
    context_lens, query_lens = steps
    model = random_model(cfg, seed=threads)
    model64 = copy.deepcopy(model).double()                  # float64 never takes the native path
    ids, context = paged_step_inputs(model, context_lens, query_lens)
    _, context64 = paged_step_inputs(model64, context_lens, query_lens)
    rows = torch.tensor([i for i in range(ids.shape[1]) if i % 3 != 1])   # some rows' logits only
    got = CpuModel(model)(ids, context=context, logits_rows=rows)
    want = model64(ids, context=context64, logits_rows=rows)
    assert len(native_calls) == 1
    assert got.shape == want.shape == (1, len(rows), cfg.vocab_size) and got.dtype == torch.float32
    assert relative_error(got, want) < 1e-5
    for mine, theirs in ((context.k_pool, context64.k_pool), (context.v_pool, context64.v_pool)):
        assert relative_error(mine, theirs) < 1e-5, "the stored keys or values differ"


def test_unstored_rows_leave_the_pool_alone():
    """slot -1: the row is computed but its keys and values are not stored anywhere."""
    model = random_model(TINY, seed=0)
    ids, context = paged_step_inputs(model, [8, 5], [1, 5])
    context = PagedContext(positions=context.positions, slot_mapping=torch.tensor([-1, *context.slot_mapping[1:]]),
                           query_lens=context.query_lens, context_lens=context.context_lens,
                           block_tables=context.block_tables, k_pool=context.k_pool, v_pool=context.v_pool)
    before = context.k_pool.clone()
    CpuModel(model)(ids, context=context)
    changed = (context.k_pool != before).any(-1).any(-1).nonzero()    # (layer, block, slot) written
    written = {int(b) * 4 + int(s) for _, b, s in changed.tolist()}
    assert written == set(context.slot_mapping[1:].tolist())


def test_steps_it_must_not_serve_take_the_operators(native_calls):
    model = random_model(TINY, seed=0)
    fast = CpuModel(model)
    ids, context = paged_step_inputs(model, [9, 7], [1, 7])
    fast(ids, context=context, num_layers=1)                      # a self-speculative draft
    model(ids, context=context)                                   # the plain model
    previous = native_batch.set_enabled(False)
    fast(ids, context=context)
    native_batch.set_enabled(previous)
    assert native_calls == []
    fast(ids, context=context)
    assert len(native_calls) == 1


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.positions.__setitem__(0, 10_000), "positions"),
    (lambda c: c.slot_mapping.__setitem__(1, 10_000), "slots"),
    (lambda c: c.slot_mapping.__setitem__(1, -2), "slots"),
])
def test_rows_outside_the_model_or_pool_are_refused_before_writing(edit, message):
    model = random_model(TINY, seed=0)
    ids, context = paged_step_inputs(model, [9, 7], [1, 7])
    edit(context)
    before = context.k_pool.clone(), context.v_pool.clone()
    with pytest.raises(ValueError, match=message):
        CpuModel(model)(ids, context=context)
    assert torch.equal(context.k_pool, before[0]) and torch.equal(context.v_pool, before[1])


def test_engine_replies_equal_with_and_without_native_batch():
    model = random_model(TINY, seed=5)
    assert engine_replies(model, native_batch, True) == engine_replies(model, native_batch, False)


def test_environment_switch():
    code = "from reference.cpu import native_batch; print(native_batch.enabled())"
    env = {**os.environ, "REFERENCE_NATIVE_BATCH": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
