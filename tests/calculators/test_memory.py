"""KV-cache memory accounting: the formula, the presets, the seed tables, and a real cache's bytes.

The seed documents' published numbers appear here as the claims under test; every value we
compare them with is computed by ``reference.calculators.memory``. Where a seed uses another convention or
is wrong, the test that says so is named after it.
"""
import pytest
import torch

from reference.kv_cache import KVCache
from reference.calculators.hardware import GPUS, gpu
from reference.calculators.memory import (MODELS, kv_cache_bytes, kv_cache_bytes_for,
                                          max_concurrent_sequences, mla_kv_bytes, model, tensor_bytes)
from reference.model import TINY

GiB, GB, KiB = 2**30, 10**9, 2**10

# Seed 001, section 3: cache at 32,000 tokens, fp16, batch 1, printed with two decimals in GiB.
SEED_001_32K_GIB = {"Llama 3.1 8B": "3.91", "Llama 3.1 70B": "9.77", "Llama 3.1 405B": "15.38",
                    "Qwen 3 32B": "7.81", "Qwen 2.5 72B": "9.77", "Mistral Large 2": "10.74",
                    "DeepSeek V3": "2.10", "Kimi K2": "2.10"}


def test_formula_counts_k_and_v_per_kv_head():
    b = kv_cache_bytes(layers=3, kv_heads=2, head_dim=8, tokens=5, batch=4, dtype="fp16")
    assert b == 2 * 3 * 2 * 8 * 5 * 4 * 2
    assert kv_cache_bytes(layers=3, kv_heads=2, head_dim=8, tokens=5, dtype="fp32") == 2 * b // 4
    assert kv_cache_bytes(layers=3, kv_heads=2, head_dim=8, tokens=0) == 0


@pytest.mark.parametrize("dtype,per_element", [("fp32", 4), ("fp16", 2), ("bf16", 2), ("fp8", 1),
                                               ("int8", 1), ("int4", 0.5), (torch.bfloat16, 2),
                                               (torch.float32, 4), (torch.int8, 1)])
def test_bytes_per_element(dtype, per_element):
    elements = 2 * 4 * 2 * 16 * 10
    assert kv_cache_bytes(layers=4, kv_heads=2, head_dim=16, tokens=10, dtype=dtype) == elements * per_element


def test_group_metadata_scale_and_zero_point():
    # int8 and fp8 are symmetric: one fp16 scale per group; int4 is asymmetric: scale + zero point.
    n = 2 * 1 * 2 * 32 * 64                           # elements in K and V together
    groups = n // 32
    assert kv_cache_bytes(layers=1, kv_heads=2, head_dim=64, tokens=32, dtype="int8", group_size=32) == n + 2 * groups
    assert kv_cache_bytes(layers=1, kv_heads=2, head_dim=64, tokens=32, dtype="int4", group_size=32) == n // 2 + 4 * groups
    assert tensor_bytes(3, "int4") == 2               # odd element counts round up to whole bytes


@pytest.mark.parametrize("kwargs,error", [
    (dict(tokens=-1), ValueError), (dict(layers=-2), ValueError), (dict(dtype="fp12"), ValueError),
    (dict(dtype=torch.complex64), ValueError), (dict(tokens=1.5), TypeError),
    (dict(dtype="fp16", group_size=32), ValueError), (dict(dtype="int4", group_size=0), ValueError)])
def test_bad_input_is_a_one_line_error(kwargs, error):
    args = dict(layers=2, kv_heads=2, head_dim=8, tokens=4) | kwargs
    with pytest.raises(error, match=r"^[^\n]+$"):
        kv_cache_bytes(**args)


def test_sizes_written_as_whole_floats_are_accepted():
    # Readers write `80e9` bytes and `32e3` tokens: a float holding a whole number is that number.
    as_ints = dict(gpu_bytes=80 * 10**9, weight_bytes=16 * 10**9, per_token_bytes=131072,
                   tokens_per_seq=32000, overhead_bytes=4 * 10**9)
    as_floats = dict(gpu_bytes=80e9, weight_bytes=16e9, per_token_bytes=131072.0,
                     tokens_per_seq=32e3, overhead_bytes=4e9)
    got = max_concurrent_sequences(**as_floats)
    assert got == max_concurrent_sequences(**as_ints) == 14 and type(got) is int
    # 80.5e9 is 80,500,000,000: a whole number of bytes, so it is accepted too
    assert max_concurrent_sequences(**(as_floats | dict(gpu_bytes=80.5e9))) == 14
    b = kv_cache_bytes(layers=2.0, kv_heads=2, head_dim=8e0, tokens=4e3)
    assert b == kv_cache_bytes(layers=2, kv_heads=2, head_dim=8, tokens=4000) and type(b) is int
    assert mla_kv_bytes(layers=2, latent_dim=512.0, rope_dim=64, tokens=3) == 2 * 576 * 3 * 2
    assert tensor_bytes(64, "int8", group_size=32.0) == 64 + 2 * 2


@pytest.mark.parametrize("value, message", [
    (80.5, "gpu_bytes must be a whole number, got 80.5"),
    (1e9 + 0.5, "gpu_bytes must be a whole number"),
    (float("inf"), "gpu_bytes must be a whole number, got inf"),
    (float("nan"), "gpu_bytes must be a whole number, got nan"),
    ("80e9", "gpu_bytes must be a whole number .* got str '80e9'"),
    (True, "gpu_bytes must be a whole number, got the bool True")])
def test_a_fractional_or_non_numeric_size_is_refused_by_name(value, message):
    with pytest.raises(TypeError, match=f"^{message}") as info:
        max_concurrent_sequences(gpu_bytes=value, weight_bytes=0, per_token_bytes=1,
                                 tokens_per_seq=1)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="^gpu_bytes must be >= 0, got -80000000000$"):
        max_concurrent_sequences(gpu_bytes=-80e9, weight_bytes=0, per_token_bytes=1,
                                 tokens_per_seq=1)


def test_unknown_model_lists_the_presets():
    with pytest.raises(ValueError, match="Llama 3.1 8B"):
        kv_cache_bytes_for("GPT-5", 100)
    with pytest.raises(ValueError, match="unknown model"):
        model("llama")


def test_mla_has_no_factor_two():
    assert mla_kv_bytes(layers=2, latent_dim=512, rope_dim=64, tokens=3, batch=2) == 2 * 576 * 3 * 2 * 2


def test_every_preset_names_its_source():
    assert len(MODELS) == 11
    for m in MODELS.values():
        assert m.source.startswith("https://huggingface.co/"), m.name
        assert m.q_heads % m.kv_heads == 0 and m.attention in {"MHA", "GQA", "MQA", "MLA"}
        assert (m.attention == "MHA") == (m.q_heads == m.kv_heads and m.attention != "MLA")


def test_seed_001_table_at_32000_tokens():
    for name, claimed in SEED_001_32K_GIB.items():
        ours = f"{kv_cache_bytes_for(name, 32_000) / GiB:.2f}"
        if MODELS[name].attention == "MLA":
            continue  # see test_seed_001_mla_rows_are_misrounded
        assert ours == claimed, name


def test_seed_001_mla_rows_are_misrounded():
    # 61 * 576 * 2 * 32,000 = 2,248,704,000 bytes = 2.0943 GiB: two decimals give 2.09, not 2.10.
    for name in ("DeepSeek V3", "Kimi K2"):
        value = kv_cache_bytes_for(name, 32_000) / GiB
        assert f"{value:.2f}" == "2.09" != SEED_001_32K_GIB[name]
        assert abs(value - 2.10) < 0.01


def test_seed_001_prose_per_token_and_long_context():
    assert MODELS["Llama 3.1 8B"].bytes_per_token() == 128 * KiB
    assert kv_cache_bytes_for("Llama 3.1 8B", 32 * 1024) == 4 * GiB
    assert MODELS["Llama 3.1 70B"].bytes_per_token() == 320 * KiB
    assert kv_cache_bytes_for("Llama 3.1 70B", 128 * 1024) == 40 * GiB
    per_layer = kv_cache_bytes(layers=1, kv_heads=8, head_dim=128, tokens=1)
    assert per_layer == 4096                                   # the calculator's "4096 B"
    # "12.2% of an H100": 9.77 GiB over 80 GiB. The H100 has 80 GB (decimal) on its data sheet.
    cache = kv_cache_bytes_for("Llama 3.1 70B", 32_000)
    assert f"{cache / (80 * GiB):.1%}" == "12.2%"
    assert f"{cache / GPUS['H100 SXM'].hbm_bytes:.1%}" == "13.1%"


def test_seed_001_fp8_claim_two_versus_one_sequence_is_wrong():
    # "fp16 -> fp8 at 70B and 32K is the difference between two sequences and one on an H100."
    # The weights alone (bf16) do not fit on one H100; with fp8 weights the cache fits 0 vs 1.
    m, hbm = MODELS["Llama 3.1 70B"], GPUS["H100 SXM"].hbm_bytes
    fits = {(w, kv): max_concurrent_sequences(gpu_bytes=hbm, weight_bytes=m.weight_bytes(w),
                                              per_token_bytes=m.bytes_per_token(kv), tokens_per_seq=32_000)
            for w in ("bf16", "fp8") for kv in ("fp16", "fp8")}
    assert fits == {("bf16", "fp16"): 0, ("bf16", "fp8"): 0, ("fp8", "fp16"): 0, ("fp8", "fp8"): 1}


def test_seed_000_tables_at_4k_use_gib_labelled_gb():
    n = 4096
    mha_70b = kv_cache_bytes(layers=80, kv_heads=64, head_dim=128, tokens=n)
    rows = {  # seed claim (written "GB") -> our bytes
        "2.0": kv_cache_bytes_for("LLaMA-2 7B", n), "10.0": mha_70b,
        "1.25": kv_cache_bytes_for("LLaMA-2 70B", n), "0.16": kv_cache_bytes(layers=80, kv_heads=1, head_dim=128, tokens=n),
        "2.5": kv_cache_bytes(layers=80, kv_heads=64, head_dim=128, tokens=n, dtype="int4")}
    for claimed, ours in rows.items():
        assert f"{ours / GiB:.{len(claimed.split('.')[1])}f}" == claimed
        assert f"{ours / GB:.{len(claimed.split('.')[1])}f}" != claimed
    # per-token-per-layer bytes of the section 9.1 table
    one = dict(layers=1, head_dim=128, tokens=1)
    assert [kv_cache_bytes(kv_heads=h, **one) for h in (64, 8, 1)] == [32768, 4096, 512]
    assert mla_kv_bytes(layers=1, latent_dim=512, rope_dim=64, tokens=1) == 1152
    assert kv_cache_bytes(kv_heads=64, dtype="int4", **one) == 8192


def test_seed_000_mla_0_27_matches_neither_unit():
    # DeepSeek-V2, 60 layers, 4096 tokens: 283,115,520 bytes = 0.2637 GiB = 0.2831 GB.
    b = mla_kv_bytes(layers=60, latent_dim=512, rope_dim=64, tokens=4096)
    assert f"{b / GiB:.2f}" == "0.26" and f"{b / GB:.2f}" == "0.28"


def test_seed_003_uses_d_model_so_llama2_70b_is_eight_times_too_big():
    # 2 * 80 * 8192 * 4096 * 2 bytes: d_model = 64 heads * 128 counts every query head.
    as_mha = kv_cache_bytes(layers=80, kv_heads=8192 // 128, head_dim=128, tokens=4096)
    assert f"{as_mha / GB:.1f}" == "10.7" and f"{16 * as_mha / GB:.0f}" == "172"
    assert as_mha == 8 * kv_cache_bytes_for("LLaMA-2 70B", 4096)


def test_seed_004_example_4_1_is_in_decimal_gb():
    b = kv_cache_bytes(layers=80, kv_heads=8, head_dim=128, tokens=32_768, batch=32, dtype="bf16")
    assert f"{b / GB:.0f}" == "344" and b == 320 * GiB


def test_max_concurrent_sequences():
    assert max_concurrent_sequences(gpu_bytes=100, weight_bytes=40, per_token_bytes=2,
                                    tokens_per_seq=5, overhead_bytes=9) == 5
    assert max_concurrent_sequences(gpu_bytes=10, weight_bytes=40, per_token_bytes=2, tokens_per_seq=5) == 0
    with pytest.raises(ValueError):
        max_concurrent_sequences(gpu_bytes=10, weight_bytes=1, per_token_bytes=0, tokens_per_seq=5)
    with pytest.raises(ValueError):
        max_concurrent_sequences(gpu_bytes=-10, weight_bytes=1, per_token_bytes=1, tokens_per_seq=5)


def test_gpu_table():
    assert set(GPUS) == {"A100 40GB", "A100 80GB", "H100 SXM", "H200", "B200"}
    for g in GPUS.values():
        assert g.hbm_bytes > 0 and g.hbm_bandwidth > 1e12 and g.fp16_flops > 1e14 and g.source
        assert g.fp8_flops is None or g.fp8_flops == pytest.approx(2 * g.fp16_flops, rel=0.01)
    with pytest.raises(Exception):
        GPUS["H100 SXM"].sms = 1   # frozen
    assert gpu("H200") is GPUS["H200"] and GPUS["B200"].sram_bytes == 148 * 256 * 1024
    with pytest.raises(ValueError, match="H100 SXM"):
        gpu("V100")


def test_tiny_cache_buffers_equal_the_formula():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        cache = KVCache(TINY.n_layers, 2, TINY.n_kv_heads, 37, TINY.head_dim, dtype=dtype)
        assert cache.nbytes() == cache.k.nbytes + cache.v.nbytes == kv_cache_bytes(
            layers=TINY.n_layers, kv_heads=TINY.n_kv_heads, head_dim=TINY.head_dim, tokens=37,
            batch=2, dtype=dtype)


@pytest.mark.slow
def test_real_model_cache_is_22_5_kib_per_token_in_fp16(real_model):
    real, _ = real_model
    cfg = real.config
    preset = MODELS["SmolLM2-135M"]
    assert (cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.n_heads, cfg.d_model) == (
        preset.layers, preset.kv_heads, preset.head_dim, preset.q_heads, preset.d_model)
    per_token = kv_cache_bytes(layers=cfg.n_layers, kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, tokens=1)
    assert per_token == preset.bytes_per_token() == 22.5 * KiB
    cache = real.new_cache(batch=1, max_len=100)          # float32, like the model
    assert cache.nbytes() == 100 * 2 * per_token
    assert real.weight_bytes() / 4 == pytest.approx(preset.params, rel=0.01)
