"""store_kv and paged decode attention against float64 attention gathered through the block table.

Pools hold the visible keys of shuffled, non-contiguous, partly shared blocks; every slot no
sequence may see is NaN, so a kernel that reads past a context length (or a -1 table entry)
returns NaN and fails.
"""
import pytest
import torch

from kernel_support import DEVICE, DTYPES, assert_matches, poisoned_outputs, randn, seed  # noqa: F401
from reference.kernels import decode_attention, paged_decode_attention, store_kv
from reference.kernels.paged_attention import BLOCK_N
from reference.kernels.torch_reference import naive_attention, paged_attention_reference

# (Hq, Hkv, D, block_size, context lengths). The interpreter's key tiles are 16 wide.
CASES = [
    (1, 1, 16, 16, [1]),                       # one key
    (9, 3, 64, 16, [1, 32, 45]),               # SmolLM2's GQA (group 3): one key, 2 full blocks, ragged
    (4, 4, 32, 8, [16, 7, 9]),                 # group 1, blocks smaller than a tile
    (8, 1, 128, 4, [13, 20]),                  # MQA
    (6, 2, 24, 32, [33, 64]),                  # D not a power of 2, blocks larger than a tile
    (2, 1, 80, 1, [7, 3]),                     # D = 80, one token per block
]
if DEVICE.type == "cuda":
    CASES += [(9, 3, 64, 16, [4097, 1, 300, 2048]), (32, 8, 128, 16, [1000, 12345]), (24, 3, 64, 256, [5000, 77])]


def block_tables_for(gen, context_lens, block_size, spare_blocks=3):
    """Shuffled block ids; every sequence after the first shares the first block of sequence 0
    (a common prefix), so that block is read under several context lengths. One -1 column of
    padding. Returns (block_tables int32 [B, max_blocks] on DEVICE, num_blocks)."""
    needed = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(needed) + spare_blocks
    free = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.full((len(context_lens), max(needed) + 1), -1, dtype=torch.int32)
    for b, n_blocks in enumerate(needed):
        for j in range(n_blocks):
            table[b, j] = table[0, 0] if b > 0 and j == 0 else free.pop()
    return table.to(DEVICE), num_blocks


def paged_inputs(case, dtype, seed):
    """q, k_cache, v_cache, block_tables, context_lens and the float64 reference output."""
    n_q_heads, n_kv_heads, head_dim, block_size, lens = case
    gen = torch.Generator().manual_seed(seed)
    tables, num_blocks = block_tables_for(gen, lens, block_size)
    context_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    k_cache = randn(gen, num_blocks, block_size, n_kv_heads, head_dim, dtype=dtype)
    v_cache = randn(gen, num_blocks, block_size, n_kv_heads, head_dim, dtype=dtype)
    visible = torch.zeros(num_blocks * block_size, dtype=torch.bool, device=DEVICE)
    for b, n in enumerate(lens):
        positions = torch.arange(n, device=DEVICE)
        visible[tables[b, positions // block_size].long() * block_size + positions % block_size] = True
    for cache in (k_cache, v_cache):
        cache.view(-1, n_kv_heads, head_dim)[~visible] = float("nan")
    q = randn(gen, len(lens), n_q_heads, head_dim, dtype=dtype)
    reference = paged_attention_reference(q, k_cache, v_cache, tables, context_lens)
    return q, k_cache, v_cache, tables, context_lens, reference


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_paged_decode_matches_float64(case, dtype, seed):
    q, k_cache, v_cache, tables, lens, reference = paged_inputs(case, dtype, seed)
    out = paged_decode_attention(q, k_cache, v_cache, tables, lens)
    assert out.dtype == dtype and out.shape == q.shape
    assert_matches(out, reference, dtype, seed, f"paged_decode_attention {case}")


def test_every_num_splits_gives_the_same_result(seed):
    """One split, uneven splits, and more splits than a short sequence has tiles (empty splits)."""
    q, k_cache, v_cache, tables, lens, reference = paged_inputs((3, 1, 32, 4, [50, 3, 17]), torch.float32, seed)
    tiles = -(-50 // BLOCK_N)
    for num_splits in sorted({1, 2, 3, tiles, tiles + 3}):
        out = paged_decode_attention(q, k_cache, v_cache, tables, lens, num_splits=num_splits)
        assert_matches(out, reference, torch.float32, seed, f"num_splits={num_splits}")


def test_paged_equals_contiguous_decode_on_the_same_keys(seed):
    """The same keys laid out contiguously give decode_attention's result; a strided q and a
    layer of a 5-D pool (the engine's k_pool[layer]) are read through their strides."""
    gen = torch.Generator().manual_seed(seed)
    n_kv_heads, head_dim, block_size, n_keys = 3, 64, 16, 40
    k, v = (randn(gen, 1, n_kv_heads, n_keys, head_dim) for _ in range(2))
    qkv = randn(gen, 1, 9 + 2 * n_kv_heads, head_dim)
    q = qkv[:, :9]
    blocks = torch.randperm(8, generator=gen)[:3].to(torch.int32)
    tables = torch.cat([blocks, torch.tensor([-1], dtype=torch.int32)])[None].to(DEVICE)
    k_pool, v_pool = (randn(gen, 2, 8, block_size, n_kv_heads, head_dim) for _ in range(2))
    for pool, x in ((k_pool, k), (v_pool, v)):
        padded = torch.cat([x[0].transpose(0, 1), x.new_zeros(3 * block_size - n_keys, n_kv_heads, head_dim)])
        pool[1, blocks.long()] = padded.view(3, block_size, n_kv_heads, head_dim)
    lens = torch.tensor([n_keys], dtype=torch.int32, device=DEVICE)
    reference = naive_attention(q.double()[:, :, None], k.double(), v.double())[0][:, :, 0]
    assert_matches(paged_decode_attention(q, k_pool[1], v_pool[1], tables, lens), reference, torch.float32,
                   seed, "paged on pool layer 1")
    assert_matches(decode_attention(q, k, v), reference, torch.float32, seed, "contiguous decode")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_kv_heads, head_dim", [(3, 64), (2, 24)], ids=["Hkv=3 D=64", "Hkv=2 D=24"])
def test_store_kv_writes_its_slots_and_nothing_else(n_kv_heads, head_dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    num_blocks, block_size, n_tokens = 6, 4, 9
    k_cache, v_cache = (randn(gen, num_blocks, block_size, n_kv_heads, head_dim, dtype=dtype) for _ in range(2))
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:n_tokens]
    slots[torch.randperm(n_tokens, generator=gen)[:3]] = -1                  # three padded tokens
    fused = randn(gen, n_tokens, 3 * n_kv_heads, head_dim, dtype=dtype)     # k, v as strided views
    k, v = fused[:, n_kv_heads:2 * n_kv_heads], fused[:, 2 * n_kv_heads:]
    expect_k, expect_v = k_cache.clone(), v_cache.clone()
    stored = slots >= 0
    expect_k.view(-1, n_kv_heads, head_dim)[slots[stored]] = k[stored.to(DEVICE)]
    expect_v.view(-1, n_kv_heads, head_dim)[slots[stored]] = v[stored.to(DEVICE)]
    store_kv(k, v, k_cache, v_cache, slots.to(DEVICE))
    assert torch.equal(k_cache, expect_k), f"k_cache differs from the expected pool (seed {seed})"
    assert torch.equal(v_cache, expect_v), f"v_cache differs from the expected pool (seed {seed})"


def test_store_then_attend_as_the_engine_does(seed):
    """A decode step: store each sequence's new K/V at its next slot (a NaN slot until now, inside
    the sequence's last block), then attend with the lengths one longer."""
    q, k_cache, v_cache, tables, lens, _ = paged_inputs((9, 3, 64, 16, [15, 5, 30]), torch.float32, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    positions = lens.long()
    slots = tables.long().gather(1, (positions // 16)[:, None])[:, 0] * 16 + positions % 16
    new_k, new_v = (randn(gen, 3, 3, 64) for _ in range(2))
    store_kv(new_k, new_v, k_cache, v_cache, slots)
    lens = lens + 1
    reference = paged_attention_reference(q, k_cache, v_cache, tables, lens)
    assert not torch.isnan(reference).any(), "a new key was not stored"
    assert_matches(paged_decode_attention(q, k_cache, v_cache, tables, lens), reference, torch.float32,
                   seed, "after store_kv")


def zeros(*shape, dtype=torch.float32, device=DEVICE):
    return torch.zeros(shape, dtype=dtype, device=device)


def ints(values, dtype=torch.int32, device=DEVICE):
    return torch.tensor(values, dtype=dtype, device=device)


Q, POOL, TABLE, LENS = zeros(2, 4, 16), zeros(3, 4, 2, 16), ints([[0, 1], [2, -1]]), ints([5, 3])


@pytest.mark.parametrize("args, error, message", [
    (([0.0], POOL, POOL, TABLE, LENS), TypeError, "q must be a torch.Tensor"),
    ((zeros(2, 4, 1, 16), POOL, POOL, TABLE, LENS), ValueError, "q must have 3 dimensions"),
    ((Q.half(), POOL, POOL, TABLE, LENS), TypeError, "share one dtype"),
    ((Q, POOL, zeros(3, 4, 1, 16), TABLE, LENS), ValueError, "same shape"),
    ((zeros(2, 3, 16), POOL, POOL, TABLE, LENS), ValueError, "multiple of K/V heads"),
    ((zeros(2, 4, 32), POOL, POOL, TABLE, LENS), ValueError, "does not match"),
    ((Q, POOL, POOL, TABLE.long(), LENS), TypeError, "block_tables must have dtype torch.int32"),
    ((Q, POOL, POOL, TABLE, LENS.float()), TypeError, "context_lens must have dtype torch.int32"),
    ((Q, POOL, POOL, ints([[0, 1], [2, -1]], device="meta"), LENS), ValueError, "block_tables is on meta"),
    ((Q, POOL, POOL, TABLE[:1], LENS), ValueError, "one row per sequence"),
    ((Q, POOL, POOL, TABLE, ints([5, 0])), ValueError, "at least 1"),
    ((Q, POOL, POOL, TABLE, ints([9, 3])), ValueError, "exceeds the block table's capacity"),
    ((Q, POOL, POOL, TABLE, ints([5, 6])), ValueError, r"block ids -1..2 within the context.*-1 only past the context"),
    ((Q, POOL, POOL, ints([[0, 3], [2, -1]]), LENS), ValueError, "valid ids are 0..2"),
], ids=["list", "rank", "dtypes", "k/v shapes", "gqa", "head dim", "table int64", "lens float", "device",
        "batch", "length 0", "past capacity", "-1 inside", "block out of pool"])
def test_paged_decode_rejects_bad_input(args, error, message):
    with pytest.raises(error, match=message):
        paged_decode_attention(*args)


K = zeros(3, 2, 16)


@pytest.mark.parametrize("args, error, message", [
    ((K, K, POOL, POOL, ints([0, -1, 11], torch.int32)), TypeError, "slot_mapping must have dtype torch.int64"),
    ((K, K, POOL, POOL, ints([0, -1], torch.int64)), ValueError, "2 entries for 3 tokens"),
    ((K, K, POOL, POOL, ints([0, -1, 12], torch.int64)), ValueError, r"slots must lie in \[-1, 12\)"),
    ((K, K, POOL, POOL, ints([0, -2, 1], torch.int64)), ValueError, r"slots must lie in \[-1, 12\)"),
    ((K.half(), K.half(), POOL, POOL, ints([0, 1, 2], torch.int64)), TypeError, "share one dtype"),
    ((zeros(3, 2, 32), zeros(3, 2, 32), POOL, POOL, ints([0, 1, 2], torch.int64)), ValueError, "does not match"),
    ((K, zeros(3, 1, 16), POOL, POOL, ints([0, 1, 2], torch.int64)), ValueError, "k and v must have the same shape"),
], ids=["slots int32", "slots length", "slot past pool", "slot below -1", "dtype", "head dim", "k/v shapes"])
def test_store_kv_rejects_bad_input(args, error, message):
    with pytest.raises(error, match=message):
        store_kv(*args)


def test_tiny_model_decode_step_through_the_paged_kernels(seed):
    """The engine's path: prefill two prompts into a shuffled pool (torch gather), then one decode
    step with PagedContext(backend="triton") gives each sequence the logits of a plain forward."""
    from reference.context import PagedContext
    from reference.model import build_tiny
    model = build_tiny(seed=0).to(DEVICE)
    cfg, block_size = model.config, 4
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(cfg.vocab_size, (n,), generator=gen) for n in (5, 9)]
    tables = torch.randperm(8, generator=gen)[:6].view(2, 3).to(torch.int32)
    k_pool, v_pool = (torch.zeros(cfg.n_layers, 8, block_size, cfg.n_kv_heads, cfg.head_dim, device=DEVICE)
                      for _ in range(2))

    def step(token_ids, positions, query_lens, backend):
        seq = torch.repeat_interleave(torch.arange(2), torch.tensor(query_lens))
        slots = tables[seq, positions // block_size].long() * block_size + positions % block_size
        lens = torch.tensor([int(positions[seq == b].max()) + 1 for b in range(2)], dtype=torch.int32)
        context = PagedContext(positions.to(DEVICE), slots.to(DEVICE), query_lens, lens.to(DEVICE),
                               tables.to(DEVICE), k_pool, v_pool, backend=backend)
        return model(token_ids[None].to(DEVICE), context=context)[0]

    step(torch.cat(prompts), torch.cat([torch.arange(5), torch.arange(9)]), [5, 9], "torch")
    new_tokens = torch.randint(cfg.vocab_size, (2,), generator=gen)
    logits = step(new_tokens, torch.tensor([5, 9]), [1, 1], "triton")
    for b, prompt in enumerate(prompts):
        full = torch.cat([prompt, new_tokens[b:b + 1]])
        assert_matches(logits[b], model(full[None].to(DEVICE))[0, -1], torch.float32, seed, f"sequence {b}")
