"""reference.cpu.native_step: a pass over 1 to 16 new positions of one sequence in one native call
(through `reference.cpu.CpuModel`: a decode step, a verification of drafts, a short prompt) equals
the model's own operators run in float64, writes the cache as they do (by position too), gives the
logit rows asked for, serves only the passes it should, and fails as they do on a full cache or a
bad token."""
import copy
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from reference.cpu import CpuModel, backend_for, native_gemv, native_step
from reference.decoding import generate
from reference.kv_cache import KVCache
from reference.model import TINY, Llama, ModelConfig, build_tiny
from test_cpu_linear import relative_error

pytestmark = pytest.mark.skipif(not native_gemv.available(),
                                reason=f"native code not built here: {native_gemv.describe()}")

# Sizes that are no multiple of anything the C code groups by (8 or 32 rows, 16 lanes), one K/V head.
ODD = ModelConfig(vocab_size=97, d_model=40, n_layers=3, n_heads=5, n_kv_heads=1, head_dim=8,
                  d_ff=72, rope_base=10000.0, max_seq_len=64)
# Attention's vector paths on groups of more heads than it takes at once: 5 heads of 32 per K/V
# head (4, then 1), 3 heads of 128 (2, then 1).
GROUPS = ModelConfig(vocab_size=97, d_model=48, n_layers=2, n_heads=10, n_kv_heads=2, head_dim=32,
                     d_ff=40, rope_base=10000.0, max_seq_len=64)
WIDE = ModelConfig(vocab_size=97, d_model=48, n_layers=2, n_heads=3, n_kv_heads=1, head_dim=128,
                   d_ff=40, rope_base=10000.0, max_seq_len=64)


def random_model(cfg: ModelConfig, seed: int) -> Llama:
    gen = torch.Generator().manual_seed(seed)
    model = Llama(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(base + torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    return model.eval()


@pytest.fixture
def native_calls(monkeypatch):
    """A list that gets one entry per pass a `CpuModel` hands to the native code: its new positions."""
    calls, real = [], native_step.forward
    monkeypatch.setattr(native_step, "forward", lambda *a: calls.append(a[1].shape[1]) or real(*a))
    return calls


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@pytest.mark.parametrize("cfg", [TINY, ODD, GROUPS, WIDE], ids=["tiny", "odd", "groups", "wide"])
def test_steps_equal_the_operators_in_float64(native_calls, threads, cfg):
    model = random_model(cfg, seed=threads)
    fast, model64 = CpuModel(model), copy.deepcopy(model).double()
    prompt = torch.randint(0, cfg.vocab_size, (1, 7), generator=torch.Generator().manual_seed(1))
    cache, cache64 = model.new_cache(1, 20), model64.new_cache(1, 20)
    fast(prompt, cache=cache), model64(prompt, cache=cache64)
    for step, token in enumerate(torch.randint(0, cfg.vocab_size, (9,)).tolist()):
        got = fast(torch.tensor([[token]]), cache=cache)
        want = model64(torch.tensor([[token]]), cache=cache64)
        assert got.shape == want.shape == (1, 1, cfg.vocab_size) and got.dtype == torch.float32
        assert relative_error(got, want) < 1e-5, f"logits differ at step {step}"
        assert cache.length == cache64.length == 8 + step
    assert native_calls == [7] + [1] * 9                     # the prompt, then every step
    n = cache.length
    for name in ("k", "v"):
        assert relative_error(getattr(cache, name)[..., :n, :], getattr(cache64, name)[..., :n, :]) < 1e-5
        assert not getattr(cache, name)[..., n:, :].any(), "wrote past the new position"


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@pytest.mark.parametrize("cfg", [TINY, ODD, GROUPS, WIDE], ids=["tiny", "odd", "groups", "wide"])
@pytest.mark.parametrize("rows", [2, 5, 16])
def test_passes_over_several_positions_equal_the_operators_in_float64(native_calls, threads, cfg, rows):
    """T new positions after a prefix of 9, the pass ending exactly at max_len: the logits of every
    row, and the keys and values written at the T positions (none past them), as float64's."""
    model = random_model(cfg, seed=rows + threads)
    fast, model64 = CpuModel(model), copy.deepcopy(model).double()
    gen = torch.Generator().manual_seed(rows)
    prompt, ids = (torch.randint(0, cfg.vocab_size, (1, n), generator=gen) for n in (9, rows))
    cache, cache64 = model.new_cache(1, 9 + rows), model64.new_cache(1, 9 + rows)
    fast(prompt, cache=cache), model64(prompt, cache=cache64)
    got, want = fast(ids, cache=cache), model64(ids, cache=cache64)
    assert native_calls == [9, rows]
    assert got.shape == want.shape == (1, rows, cfg.vocab_size) and got.dtype == torch.float32
    assert relative_error(got, want) < 1e-5
    assert cache.length == cache64.length == 9 + rows
    for name in ("k", "v"):
        assert relative_error(getattr(cache, name)[..., 9:, :], getattr(cache64, name)[..., 9:, :]) < 1e-5


def test_a_pass_writes_by_position_and_gives_the_rows_asked_for(native_calls):
    """positions p .. p + T - 1 with p before the cache's end overwrite the tail (a verification
    after rejected drafts), as the operators do; logits_rows picks rows (negative from the end)."""
    model = random_model(ODD, seed=13)
    fast, model64 = CpuModel(model), copy.deepcopy(model).double()
    cache, cache64 = model.new_cache(1, 24), model64.new_cache(1, 24)
    fast(torch.arange(1, 13)[None], cache=cache), model64(torch.arange(1, 13)[None], cache=cache64)
    ids, positions = torch.tensor([[5, 6, 7, 8]]), torch.arange(9, 13)
    for rows in (None, torch.tensor([-1]), torch.tensor([2, 0, 3, 3])):
        got = fast(ids, positions, cache, logits_rows=rows)
        want = model64(ids, positions, cache64, logits_rows=rows)
        assert got.shape == want.shape and relative_error(got, want) < 1e-5
        assert cache.length == 13
    for name in ("k", "v"):
        assert relative_error(getattr(cache, name)[..., :13, :], getattr(cache64, name)[..., :13, :]) < 1e-5
    assert native_calls == [12, 4, 4, 4]


def test_thread_count_may_change_between_steps(native_calls):
    model = build_tiny(seed=3)
    fast, model64 = CpuModel(model), copy.deepcopy(model).double()
    cache, cache64 = model.new_cache(1, 16), model64.new_cache(1, 16)
    fast(torch.tensor([[1, 2, 3]]), cache=cache), model64(torch.tensor([[1, 2, 3]]), cache=cache64)
    before = torch.get_num_threads()
    try:
        for threads in (3, 1, 2, 4):
            torch.set_num_threads(threads)
            token = torch.tensor([[threads * 11]])
            assert relative_error(fast(token, cache=cache), model64(token, cache=cache64)) < 1e-5
    finally:
        torch.set_num_threads(before)
    assert native_calls == [3, 1, 1, 1, 1]


def test_greedy_tokens_equal_the_operators_on_smollm2(real_model, native_calls):
    model, tok = real_model
    prompt = tok.chat_ids("Name three primary colours.")
    native = generate(model, prompt, 24, backend="cpu")
    assert len(native_calls) == 23                          # every step after the prefill
    previous = native_step.set_enabled(False)
    try:
        operators = generate(model, prompt, 24, backend="cpu")
    finally:
        native_step.set_enabled(previous)
    assert native == operators == generate(model, prompt, 24, backend="torch")


def test_passes_it_does_not_serve_take_the_operators(native_calls):
    model = build_tiny(seed=4)
    fast = CpuModel(model)
    token, two = torch.tensor([[5]]), torch.tensor([[5, 6]])

    def prefilled(batch=1):
        cache = model.new_cache(batch, 32)
        model(torch.tensor([[1, 2, 3]] * batch), cache=cache)              # the plain model: no call
        return cache

    fast(two, cache=prefilled(), positions=torch.tensor([3, 5]))             # not a run (a tree)
    fast(two, cache=prefilled(), positions=torch.tensor([3, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match="cannot write at position 4"):
        fast(two, cache=prefilled(), positions=torch.tensor([4, 5]))         # past the cache's end
    fast(token, cache=prefilled(), num_layers=1)                             # a self-draft
    fast(two, cache=prefilled(), logits_rows=torch.tensor([True, False]))    # a mask, not indices
    fast(two, cache=prefilled(), logits_rows=torch.tensor([0, 1, 1]))        # more rows than the pass
    fast(token, cache=prefilled(), mask=torch.ones(1, 4, dtype=torch.bool))
    fast(token.int(), cache=prefilled())                                     # the C code reads int64
    fast(torch.arange(17)[None], cache=prefilled())                          # more than 16 positions
    fast(token)                                                              # no cache
    fast(torch.tensor([[5], [6]]), cache=prefilled(batch=2))                 # two sequences
    unaligned = prefilled()
    fast(token, cache=unaligned, num_layers=1)                               # layer 0 is ahead
    fast(token, cache=unaligned)
    shallow = KVCache(1, 1, TINY.n_kv_heads, 8, TINY.head_dim)              # another model's depth
    with pytest.raises(IndexError):
        fast(token, cache=shallow)
    model.attention_backend = "naive"
    fast(token, cache=prefilled())
    model.attention_backend = "sdpa"
    previous = native_step.set_enabled(False)
    fast(two, cache=prefilled())
    native_step.set_enabled(previous)
    assert native_calls == []
    fast(two, cache=prefilled(), positions=torch.tensor([2, 3]), logits_rows=torch.tensor([-1]))
    fast(torch.arange(16)[None], cache=prefilled())
    assert native_calls == [2, 16]


def test_what_someone_watches_runs_as_operators(native_calls, monkeypatch):
    """A hook inside the model is refused when a CpuModel is built (the native step would skip
    it), and "auto" then runs the plain model; a cache whose append records sees the operators."""
    model = build_tiny(seed=8)
    seen = []
    handle = model.blocks[1].attn.o_proj.register_forward_hook(lambda m, inp, out: seen.append(out.shape))
    with pytest.raises(ValueError, match="hook is registered on blocks.1.attn.o_proj"):
        CpuModel(model)
    assert backend_for(model) is model
    generate(model, [1, 2, 3], 2)
    handle.remove()
    assert seen == [(1, 3, TINY.d_model), (1, 1, TINY.d_model)] and native_calls == []
    fast = backend_for(model)
    assert isinstance(fast, CpuModel) and backend_for(model) is fast
    cache = model.new_cache(1, 16)
    fast(torch.tensor([[1, 2, 3]]), cache=cache)
    assert native_calls == [3]
    del seen[:], native_calls[:]
    plain = cache.append
    cache.append = lambda layer, k, v: seen.append(k.shape) or plain(layer, k, v)
    fast(torch.tensor([[5]]), cache=cache)
    del cache.append
    assert seen == [(1, TINY.n_kv_heads, 1, TINY.head_dim)] * TINY.n_layers and native_calls == []
    with monkeypatch.context() as patch:
        patch.setattr(KVCache, "append", lambda self, *a: seen.append("class") or plain.__func__(self, *a))
        fast(torch.tensor([[6]]), cache=cache)
    assert seen[-1] == "class" and native_calls == []
    fast(torch.tensor([[7]]), cache=cache)
    assert len(native_calls) == 1 and cache.length == 6


def test_the_environment_switch_turns_it_off():
    code = "from reference.cpu import native_step; print(native_step.enabled())"
    env = {**os.environ, "REFERENCE_NATIVE_STEP": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_a_full_cache_and_a_bad_token_are_clear_errors(native_calls):
    fast = CpuModel(build_tiny(seed=5))
    cache = fast.new_cache(1, 6)
    fast(torch.tensor([[1, 2, 3, 4]]), cache=cache)
    with pytest.raises(ValueError, match="KV cache full: 4 \\+ 3 tokens exceed max_len=6"):
        fast(torch.tensor([[5, 6, 7]]), cache=cache)
    fast(torch.tensor([[5, 6]]), cache=cache)
    with pytest.raises(ValueError, match="KV cache full"):
        fast(torch.tensor([[5]]), cache=cache)
    cache.truncate(3)
    k = cache.k.clone()
    with pytest.raises(IndexError, match="token id 256 is outside the vocabulary"):
        fast(torch.tensor([[TINY.vocab_size]]), cache=cache)
    with pytest.raises(IndexError, match="token id -1 is outside the vocabulary"):
        fast(torch.tensor([[7, -1, 8]]), cache=cache)
    assert cache.length == 3 and torch.equal(cache.k, k), "a refused pass must leave the cache as it was"
    assert native_calls == [4, 3, 2, 1, 1, 3]


def test_a_replaced_weight_is_read_from_its_new_buffer(native_calls):
    model = build_tiny(seed=6)
    fast = CpuModel(model)                               # the table of weights is built here
    token = torch.tensor([[7]])
    cache = model.new_cache(1, 8)
    fast(torch.tensor([[1, 2]]), cache=cache)
    fast(token, cache=cache)
    with torch.no_grad():
        qkv = model.blocks[1].attn.qkv_proj
        qkv.weight = nn.Parameter(2 * qkv.weight.detach())
    model64 = copy.deepcopy(model).double()
    cache, cache64 = model.new_cache(1, 8), model64.new_cache(1, 8)
    fast(torch.tensor([[1, 2]]), cache=cache), model64(torch.tensor([[1, 2]]), cache=cache64)
    assert relative_error(fast(token, cache=cache), model64(token, cache=cache64)) < 1e-5
    assert native_calls == [2, 1, 2, 1]


def test_the_floor_reads_and_writes_nothing_the_model_holds():
    model = build_tiny(seed=7)
    cache = model.new_cache(1, 8)
    model(torch.tensor([[1, 2, 3]]), cache=cache)
    k, v = cache.k.clone(), cache.v.clone()
    state = {name: p.clone() for name, p in model.state_dict().items()}
    native_step.stream_weights(model, cache)
    assert torch.equal(cache.k, k) and torch.equal(cache.v, v) and cache.length == 3
    assert all(torch.equal(p, state[name]) for name, p in model.state_dict().items())
    with pytest.raises(ValueError, match="1 to max_len"):
        native_step.stream_weights(model, model.new_cache(1, 8))


def test_the_panel_layout_puts_every_weight_where_the_c_code_reads_it():
    """Panel p, chunk c, row r, lane k holds weight[16 c + k, 32 p + r]; zeros past the edges."""
    n_out, n_in = 37, 45                                  # neither a multiple of 16 nor of 32
    weight = torch.randn(n_out, n_in)                     # [out, in], as nn.Linear stores it
    dest = torch.full(tuple(native_step._packed_shape(weight, "panels")), float("nan"))
    native_step._pack_panels(dest, weight)
    panels, chunks = dest.shape[:2]
    for o in range(chunks * 16):
        for i in range(panels * 32):
            want = weight[o, i].item() if o < n_out and i < n_in else 0.0
            assert dest[i // 32, o // 16, i % 32, o % 16].item() == want, (o, i)


@pytest.mark.parametrize("layout", ["strips", "paired strips"])
def test_the_strip_layouts_put_every_weight_where_the_c_code_reads_it(layout):
    """Strip g, row i, lane k holds weight[32 g + k, i] (strips), or for gate/up (out = 2 d_ff)
    the gate column 16 g + k for k < 16, the up column d_ff + 16 g + k - 16 after (paired strips);
    zeros where that column does not exist."""
    d_ff, n_in = 37, 5                                    # no multiple of 16 or 32
    n_out = 2 * d_ff if layout == "paired strips" else 45
    weight = torch.randn(n_out, n_in)
    dest = torch.full(tuple(native_step._packed_shape(weight, layout)), float("nan"))
    native_step._PACKERS[layout](dest, weight)
    assert dest.shape == ((-(-d_ff // 16) if layout == "paired strips" else 2), n_in, 32)
    for g in range(dest.shape[0]):
        for k in range(32):
            if layout == "strips":
                column = 32 * g + k if 32 * g + k < n_out else None
            else:
                unit = 16 * g + k % 16
                column = (unit + (d_ff if k >= 16 else 0)) if unit < d_ff else None
            for i in range(n_in):
                want = weight[column, i].item() if column is not None else 0.0
                assert dest[g, i, k].item() == want, (g, i, k)


def test_the_packed_copy_is_counted_and_dropped_on_request():
    model = random_model(ODD, seed=9)
    assert native_step.packed_bytes(model) == 0
    CpuModel(model)                                                    # packs when built
    d, qkv_out = ODD.d_model, (ODD.n_heads + 2 * ODD.n_kv_heads) * ODD.head_dim
    per_layer = [-(-qkv_out // 32) * 32 * d,                           # QKV in strips of 32 columns
                 -(-(ODD.n_heads * ODD.head_dim) // 32) * 32 * -(-d // 16) * 16,   # O in panels
                 -(-ODD.d_ff // 16) * 32 * d,                          # gate/up: 16 units a strip
                 -(-ODD.d_ff // 32) * 32 * -(-d // 16) * 16]           # down in panels
    matrices = per_layer * ODD.n_layers + [-(-ODD.vocab_size // 32) * 32 * d]   # the tied head
    padded = sum(-(-floats * 4 // 64) * 64 for floats in matrices)     # each piece 64-byte aligned
    assert native_step.packed_bytes(model) == padded
    native_step.forget(model)
    assert native_step.packed_bytes(model) == 0


def _scale_in_place(model):
    with torch.no_grad():
        model.blocks[1].mlp.down_proj.weight.mul_(3)


def _assign_data(model):
    up = model.blocks[0].mlp.gate_up_proj
    up.weight.data = up.weight.detach() * -2                          # a new buffer


def _load_state(model):
    state = {name: (2 * p if name == "embed.weight" else p) for name, p in model.state_dict().items()}
    model.load_state_dict(state)


def _through_data_then_forget(model):
    model.blocks[2].attn.o_proj.weight.data.mul_(0.5)    # bypasses the version counter
    native_step.forget(model)


@pytest.mark.parametrize("change", [_scale_in_place, _assign_data, _load_state, _through_data_then_forget])
def test_a_weight_changed_after_packing_is_read_as_changed(native_calls, change):
    model, got, want = _step_after(change, seed=10)
    assert relative_error(got, want) < 1e-5
    assert native_calls == [2, 1, 2, 1]


def _step_after(change, seed: int):
    """(model, its CpuModel's logits, float64's) for a decode step after `change(model)`, made
    once a native step has packed the weights; the prefix is prefilled again after the change."""
    model = random_model(ODD, seed=seed)
    fast = CpuModel(model)                                # packs the weights
    cache = model.new_cache(1, 8)
    fast(torch.tensor([[1, 2]]), cache=cache)
    fast(torch.tensor([[3]]), cache=cache)
    change(model)
    model64 = copy.deepcopy(model).double()
    cache, cache64 = model.new_cache(1, 8), model64.new_cache(1, 8)
    fast(torch.tensor([[1, 2]]), cache=cache), model64(torch.tensor([[1, 2]]), cache=cache64)
    token = torch.tensor([[4]])
    return model, fast(token, cache=cache), model64(token, cache=cache64)


class _Doubled(nn.Module):
    def forward(self, weight):
        return 2 * weight


def _parametrize(model):
    nn.utils.parametrize.register_parametrization(model.blocks[0].mlp.down_proj, "weight", _Doubled())


def test_a_weight_the_c_code_cannot_read_is_served_by_the_operators():
    """After a native step, a parametrization (the weight computed at each access): the same
    call runs the operators, no traceback, and equals float64."""
    model, got, want = _step_after(_parametrize, seed=11)
    assert relative_error(got, want) < 1e-5
    assert native_step.packed_bytes(model) == 0, "the packed copy of the old weights was kept"


def test_a_replaced_module_gets_a_new_cpu_model():
    """A CpuModel serves the modules it was built on; `backend_for` builds another once one of
    them was replaced (a module of another kind: the plain model)."""
    model = random_model(ODD, seed=12)
    fast = backend_for(model)
    model.blocks[1].mlp.down_proj = nn.Linear(ODD.d_ff, ODD.d_model, bias=False)
    again = backend_for(model)
    assert isinstance(again, CpuModel) and again is not fast
    model.blocks[1].mlp = nn.Identity()
    with pytest.raises(ValueError, match="not all of the kinds"):
        CpuModel(model)
    assert backend_for(model) is model
