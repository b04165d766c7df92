"""Attention traffic, arithmetic intensity, the roofline and the decode floor (chapter 04).

The seed figures are recomputed here from the functions, never typed as results: 132 MiB of
traffic for unfused attention at N=4096, d=128, fp16 (128 MiB of it the N x N intermediates),
the A100 ridge 312 TFLOP/s / 2 TB/s = 156 FLOPs/byte, and the 70 ms floor of a 70B fp16 model
at 2 TB/s.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.bench.machine import measure_machine, measure_model_points
from reference.calculators import roofline as rf
from reference.calculators.hardware import GPUS
from reference.model import TINY, ModelConfig, build_tiny

MiB = 2**20
ints = st.integers(1, 8192)
dims = st.sampled_from([32, 64, 80, 96, 128, 256])
dtypes = st.sampled_from(["fp32", "fp16", "bf16", "fp8"])


# ------------------------------------------------------------------------- seed numbers

def test_standard_attention_at_4096_moves_132_mib_of_which_128_are_n_by_n():
    traffic = rf.standard_attention_traffic(4096, 128, "fp16")
    assert [s for s, _ in traffic] == ["load Q", "load K", "write S", "read S", "write P",
                                       "read P", "load V", "write O"]
    assert rf.total_bytes(traffic) == 132 * MiB
    square = [b for s, b in traffic if s[-1] in "SP"]
    assert len(square) == 4 and all(b == 2 * 4096 * 4096 == 32 * MiB for b in square)
    assert sum(square) == 128 * MiB
    assert dict(traffic)["write O"] == 4096 * 128 * 2 == 1 * MiB  # the answer itself


def test_a100_ridge_is_156_flops_per_byte():
    assert rf.ridge_point(312e12, 2e12) == pytest.approx(156)
    # the datasheet's 2.039 TB/s (A100 80GB SXM) puts the ridge a little lower
    a100 = GPUS["A100 80GB"]
    assert rf.ridge_point(a100.fp16_flops, a100.hbm_bandwidth) == pytest.approx(153, abs=0.5)


def test_70b_fp16_at_2_tb_per_s_needs_at_least_70_ms_per_token():
    weights = rf.nbytes(70 * 10**9, "fp16")
    assert weights == 140 * 10**9
    assert rf.decode_floor_seconds(weights, 2e12) == pytest.approx(0.070)
    assert weights / 2**30 == pytest.approx(130.4, abs=0.05)  # the same bytes in GiB


# ---------------------------------------------------------------------------- properties

@given(ints, dims, dtypes)
@settings(max_examples=200, deadline=None)
def test_standard_traffic_formula_and_monotone_in_n(n, d, dtype):
    size = rf.dtype_bits(dtype) // 8
    total = rf.total_bytes(rf.standard_attention_traffic(n, d, dtype))
    assert total == size * (4 * n * d + 4 * n * n)
    assert rf.total_bytes(rf.standard_attention_traffic(n + 1, d, dtype)) > total


@given(ints, dims, st.sampled_from([16, 32, 64, 128, 256]), st.sampled_from([16, 64, 128]), dtypes)
@settings(max_examples=200, deadline=None)
def test_flash_traffic_reads_k_and_v_once_per_q_block(n, d, block_q, block_k, dtype):
    flash = rf.flash_attention_traffic(n, d, dtype, block_q, block_k)
    row = rf.nbytes(n * d, dtype)
    q_blocks = math.ceil(n / block_q)
    assert [b for _, b in flash] == [row, q_blocks * row, q_blocks * row, row]
    if n <= block_q:   # one Q block: every tensor crosses HBM exactly once
        assert rf.total_bytes(flash) == 4 * row


@given(st.integers(1, 8192), dims, st.sampled_from([64, 128, 256]), dtypes)
@settings(max_examples=200, deadline=None)
def test_flash_moves_less_than_standard_when_q_blocks_are_at_least_half_the_head_dim(n, d, block_q, dtype):
    # flash - standard = 2 n d (ceil(n/Bq) - 1) - 4 n^2 (bytes/elem omitted) < 0
    # whenever d * (ceil(n/Bq) - 1) < 2 n, which holds for every n when Bq >= d / 2.
    if 2 * block_q < d:
        block_q = d
    flash = rf.total_bytes(rf.flash_attention_traffic(n, d, dtype, block_q, 64))
    assert flash < rf.total_bytes(rf.standard_attention_traffic(n, d, dtype))


def test_flash_can_move_more_than_standard_with_tiny_q_blocks():
    # The property above needs its condition: with 16-row Q blocks and d = 256, K and V are
    # re-read 256 times, more than the four N x N legs of the unfused kernel.
    flash = rf.total_bytes(rf.flash_attention_traffic(4096, 256, "fp16", 16, 16))
    assert flash > rf.total_bytes(rf.standard_attention_traffic(4096, 256, "fp16"))


@given(st.floats(0, 1e6), st.floats(1e6, 1e16), st.floats(1e6, 1e13))
@settings(max_examples=300, deadline=None)
def test_attainable_is_min_of_peak_and_intensity_times_bandwidth(intensity, peak, bandwidth):
    got = rf.attainable_flops(intensity, peak, bandwidth)
    assert got == min(peak, intensity * bandwidth)
    ridge = rf.ridge_point(peak, bandwidth)
    assert (got == peak) == (intensity * bandwidth >= peak)
    assert (intensity >= ridge) == (intensity * bandwidth >= peak) or math.isclose(intensity, ridge)


def test_attainable_flops_works_elementwise_on_tensors():
    intensity = torch.tensor([0.0, 1.0, 156.0, 1000.0], dtype=torch.float64)
    got = rf.attainable_flops(intensity, 312e12, 2e12)
    assert torch.equal(got, torch.tensor([0.0, 2e12, 312e12, 312e12], dtype=torch.float64))


@given(st.integers(1, 4096), st.integers(1, 4096), st.integers(1, 4096), dtypes)
@settings(max_examples=200, deadline=None)
def test_matmul_intensity(m, k, n, dtype):
    flops, moved = rf.matmul_cost(m, k, n, dtype)
    size = rf.dtype_bits(dtype) // 8
    assert flops == 2 * m * k * n and moved == size * (m * k + k * n + m * n)
    # a matrix-vector product (m = 1) never exceeds 2 / size FLOPs per byte
    assert rf.arithmetic_intensity(*rf.matmul_cost(1, k, n, dtype)) < 2 / size


def test_int4_counts_half_a_byte_and_rounds_up():
    assert rf.nbytes(10, "int4") == 5 and rf.nbytes(11, "int4") == 6
    assert rf.nbytes(3, torch.bfloat16) == 6 and rf.dtype_bits(torch.float32) == 32


# --------------------------------------------------------------- one forward of the model

def test_parameter_count_matches_the_model():
    model = build_tiny(0)
    assert rf.llama_params(TINY) == sum(p.numel() for p in model.parameters())
    assert rf.nbytes(rf.llama_params(TINY), torch.float32) == model.weight_bytes()


@given(st.sampled_from([1, 2, 4, 16, 64, 256]), st.integers(1, 4096))
@settings(max_examples=100, deadline=None)
def test_decode_intensity_grows_with_batch_and_stays_below_prefill(batch, context):
    cfg = ModelConfig()
    step = rf.forward_cost(cfg, batch=batch, new_tokens=1, context=context)
    bigger = rf.forward_cost(cfg, batch=2 * batch, new_tokens=1, context=context)
    assert bigger.intensity > step.intensity
    # fp16: weights give 2 FLOPs per 2-byte weight per sequence (intensity batch), attention
    # 4 * n_heads FLOPs per 4 * n_kv_heads K/V bytes (intensity below the GQA group size)
    assert step.intensity < max(batch, cfg.group_size)
    prefill = rf.forward_cost(cfg, batch=1, new_tokens=4 * batch + 64)
    assert prefill.intensity > rf.forward_cost(cfg, batch=1, new_tokens=1, context=4 * batch + 63).intensity


def test_forward_cost_counts_weights_once_and_kv_per_sequence():
    cfg = ModelConfig()
    one = rf.forward_cost(cfg, batch=1, new_tokens=1, context=100, weight_dtype="fp32")
    eight = rf.forward_cost(cfg, batch=8, new_tokens=1, context=100, weight_dtype="fp32")
    assert eight.weight_bytes == one.weight_bytes == rf.nbytes(rf.llama_params(cfg), "fp32")
    assert eight.kv_bytes == 8 * one.kv_bytes == 8 * 4 * 2 * 30 * 3 * 64 * (100 + 2)
    assert eight.flops == 8 * one.flops


def test_counts_written_as_whole_floats_are_accepted():
    assert rf.nbytes(70e9, "fp16") == 140 * 10**9
    assert rf.standard_attention_traffic(4096.0, 128.0) == rf.standard_attention_traffic(4096, 128)
    assert rf.matmul_cost(16.0, 8192, 8192) == rf.matmul_cost(16, 8192, 8192)
    cfg = ModelConfig()
    assert (rf.forward_cost(cfg, batch=8.0, new_tokens=1, context=4e3)
            == rf.forward_cost(cfg, batch=8, new_tokens=1, context=4000))
    with pytest.raises(TypeError, match="^batch must be a whole number, got 8.5"):
        rf.forward_cost(cfg, batch=8.5, new_tokens=1)


def test_the_other_calculators_accept_whole_floats_and_refuse_fractions():
    from reference.calculators.batching_sim import pareto_workload, simulate_continuous
    from reference.calculators.contiguous import ContiguousAllocator
    from reference.calculators.flash_versions import pick_flash
    from reference.calculators.fragmentation import PagedPool

    assert ContiguousAllocator(64.0).num_slots == 64
    assert PagedPool(64.0, 16.0).manager.num_blocks == 4
    assert pick_flash("H100", False, 64.0) == pick_flash("H100", False, 64)
    work = pareto_workload(5, seed=0)
    assert (simulate_continuous(work, 4.0, 512.0).stats
            == simulate_continuous(work, 4, 512).stats)
    for call in (lambda: ContiguousAllocator(64.5), lambda: PagedPool(64, 16.5),
                 lambda: simulate_continuous(work, 4.5), lambda: pick_flash("H100", False, 64.5)):
        with pytest.raises(ValueError, match="whole number|head_dim"):
            call()


@pytest.mark.parametrize("call, error", [
    (lambda: rf.standard_attention_traffic(0, 64), ValueError),
    (lambda: rf.standard_attention_traffic(64, 64, "fp12"), ValueError),
    (lambda: rf.standard_attention_traffic(64.5, 64), TypeError),
    (lambda: rf.flash_attention_traffic(64, 64, "fp16", 0, 64), ValueError),
    (lambda: rf.attainable_flops(-1.0, 1e12, 1e9), ValueError),
    (lambda: rf.attainable_flops(1.0, 0.0, 1e9), ValueError),
    (lambda: rf.attainable_flops(torch.tensor([1.0, float("nan")]), 1e12, 1e9), ValueError),
    (lambda: rf.arithmetic_intensity(1.0, 0), ValueError),
    (lambda: rf.decode_floor_seconds(1e9, float("inf")), ValueError),
    (lambda: rf.forward_cost(ModelConfig(), batch=0, new_tokens=1), ValueError),
    (lambda: rf.decode_step_kernels(ModelConfig(), batch=0, context=8), ValueError),
    (lambda: rf.decode_step_kernels(ModelConfig(), batch=2, context=-1), ValueError),
    (lambda: rf.forward_kernels(ModelConfig(), batch=2, new_tokens=0, context=8), ValueError),
    (lambda: rf.step_seconds(rf.decode_step_kernels(ModelConfig(), batch=1, context=1), 0, 1),
     ValueError),
    (lambda: measure_machine(seconds=0), ValueError),
])
def test_bad_input_gets_a_one_line_error(call, error):
    with pytest.raises(error) as info:
        call()
    assert "\n" not in str(info.value) and str(info.value)


# ------------------------------------------------------------------------- measurements

def test_measure_machine_returns_positive_finite_ceilings():
    machine = measure_machine(seconds=0.2)
    for value in (machine.copy_bandwidth, machine.matmul_flops, machine.ridge):
        assert math.isfinite(value) and value > 0
    assert machine.threads == torch.get_num_threads()


def test_model_points_pair_a_measured_time_with_the_analytic_cost():
    model = build_tiny(0)
    points = measure_model_points(model, prompt_len=16, batches=(1, 3), context=8, seconds=0.1)
    assert [p.label for p in points] == ["prefill 16 tok", "decode batch 1", "decode batch 3"]
    for p in points:
        assert math.isfinite(p.seconds) and p.seconds > 0 and p.achieved_flops > 0
        assert p.cost == rf.forward_cost(model.config, batch=p.batch, new_tokens=p.new_tokens,
                                         context=p.context, weight_dtype=torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_measure_machine_on_a_gpu_returns_positive_finite_ceilings():
    machine = measure_machine(seconds=0.5, device="cuda", dtype=torch.bfloat16)
    assert machine.device == "cuda" and machine.matmul_dtype == "bfloat16"
    for value in (machine.copy_bandwidth, machine.matmul_flops, machine.ridge):
        assert math.isfinite(value) and value > 0


# ------------------------------------------------------ a decode step, kernel by kernel

SMALL = ModelConfig(vocab_size=4, d_model=2, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=1,
                    d_ff=3, max_seq_len=16)
LLAMA_70B = ModelConfig(vocab_size=128256, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8,
                        head_dim=128, d_ff=28672, rope_base=500000.0, max_seq_len=131072)


def test_decode_step_kernels_by_hand():
    # d=2, 2 query heads and 1 K/V head of 1, d_ff=3, vocab 4, one layer; batch 2, context 3, fp16.
    mm, att, ew = rf.decode_step_kernels(SMALL, batch=2, context=3, weight_dtype="fp16")
    assert [k.name for k in (mm, att, ew)] == ["weight matmuls", "attention", "element-wise"]
    # matrices (k x n): W_q 2x2, W_k 2x1, W_v 2x1, W_o 2x2, gate 2x3, up 2x3, down 3x2, head 2x4
    # FLOPs 2 * batch * sum(k n) = 4 * (4 + 2 + 2 + 4 + 6 + 6 + 6 + 8) = 152
    # bytes 2 * sum(B k + k n + B n) = 24 + 16 + 16 + 24 + 32 + 32 + 32 + 40 = 216
    assert (mm.flops, mm.bytes) == (152, 216)
    # 4 visible keys: 4 * head_dim * n_heads * 4 keys * batch 2 = 64 FLOPs; per sequence
    # K and V of 4 read + 1 written (10 elements) and q read + o written (4): 28 bytes, x 2
    assert (att.flops, att.bytes) == (64, 56)
    # per token: norms 2*4*2, RoPE 3*(2+1), SwiGLU 5*3, residuals 2*1*2, final norm 4*2 = 52;
    # elements moved: norms 2*2*2, RoPE 2*3, SwiGLU 3*3, residuals 2*3*2, final norm 2*2 = 39
    # per token, x 2 tokens x 2 bytes = 156, + the three norm weights (6 elements) = 168
    assert (ew.flops, ew.bytes) == (104, 168)
    # the roofline at 100 FLOP/s and 10 B/s: every class memory-bound, sum = blended
    assert [k.bound(100, 10) for k in (mm, att, ew)] == ["memory"] * 3
    assert rf.step_seconds([mm, att, ew], 100, 10) == pytest.approx(21.6 + 5.6 + 16.8)
    assert rf.blended_step_seconds([mm, att, ew], 100, 10) == pytest.approx(44.0)


def test_forward_kernels_by_hand():
    # SMALL again, batch 2, each sequence feeding 3 positions after 3 cached ones (a
    # verification pass over the last token and 2 drafts): 6 tokens through every kernel.
    mm, att, ew = rf.forward_kernels(SMALL, batch=2, new_tokens=3, context=3, weight_dtype="fp16")
    # FLOPs 2 * 6 tokens * sum(k n) = 12 * 38; elements B k + k n + B n per matrix with B = 6:
    # W_q 28, W_k 20, W_v 20, W_o 28, gate 36, up 36, down 36, head 44 = 248, 2 bytes each
    assert (mm.flops, mm.bytes) == (456, 496)
    # visible keys per sequence: 3 positions x 3 cached + 1 + 2 + 3 among themselves = 15;
    # 4 * head_dim * n_heads * 15 * batch 2 = 240 FLOPs. Per sequence K and V read over 3 + 3
    # positions and written for 3 (18 elements), q read and o written for 3 (12): 60 bytes, x 2
    assert (att.flops, att.bytes) == (240, 120)
    # 52 FLOPs and 39 elements per token (see above) x 6 tokens, + the norm weights once
    assert (ew.flops, ew.bytes) == (6 * 52, 2 * 6 * 39 + 12)
    one = rf.forward_kernels(SMALL, batch=2, new_tokens=1, context=3, weight_dtype="fp16")
    assert one == rf.decode_step_kernels(SMALL, batch=2, context=3, weight_dtype="fp16"), \
        "a decode step is a forward of one new token per sequence"


def test_extra_positions_ride_on_attention_but_not_on_the_matmuls():
    """A pass over 5 positions per sequence against a decode step, 70B on an H100 at 32K: the
    cache read (attention, memory-bound) hardly grows, so one blended point over the whole pass
    calls the extra positions nearly free; the weight matmuls of 256 x 5 tokens are past the
    ridge, and kernel by kernel the pass costs noticeably more."""
    h100 = GPUS["H100 SXM"]
    peak, bw = h100.fp16_flops, h100.hbm_bandwidth
    step = rf.decode_step_kernels(LLAMA_70B, batch=256, context=32768)
    verify = rf.forward_kernels(LLAMA_70B, batch=256, new_tokens=5, context=32768)
    assert verify[1].bytes < 1.01 * step[1].bytes and verify[1].bound(peak, bw) == "memory"
    assert step[0].bound(peak, bw) == "memory" and verify[0].bound(peak, bw) == "compute"
    summed = rf.step_seconds(verify, peak, bw) / rf.step_seconds(step, peak, bw)
    blended = rf.blended_step_seconds(verify, peak, bw) / rf.blended_step_seconds(step, peak, bw)
    assert blended < 1.05 < 1.1 < summed, (
        f"kernel by kernel the 5-position pass costs {summed:.2f}x a step, blended {blended:.2f}x: "
        "the blend lets the matmuls' arithmetic hide behind attention's bytes")


def test_the_blended_point_hides_one_kernels_bytes_behind_anothers_flops():
    compute_heavy, memory_heavy = rf.KernelCost("a", 100, 1), rf.KernelCost("b", 1, 100)
    assert rf.step_seconds([compute_heavy, memory_heavy], 1, 1) == 200
    assert rf.blended_step_seconds([compute_heavy, memory_heavy], 1, 1) == 101


def test_kernels_add_up_to_the_forward_cost():
    for cfg, batch, new_tokens, context in ((ModelConfig(), 16, 1, 500), (LLAMA_70B, 3, 1, 4096),
                                            (SMALL, 1, 1, 0), (LLAMA_70B, 8, 17, 1024),
                                            (SMALL, 2, 5, 0)):
        kernels = rf.forward_kernels(cfg, batch=batch, new_tokens=new_tokens, context=context)
        whole = rf.forward_cost(cfg, batch=batch, new_tokens=new_tokens, context=context)
        assert kernels[0].flops + kernels[1].flops == whole.flops
        # the kernels also move the activations that forward_cost assumes stay on chip
        assert sum(k.bytes for k in kernels) > whole.bytes


@given(st.sampled_from([ModelConfig(), LLAMA_70B, SMALL]), st.integers(1, 4096),
       st.integers(0, 65536), st.sampled_from(list(GPUS.values())))
@settings(max_examples=200, deadline=None)
def test_blended_never_exceeds_the_sum_of_kernels(cfg, batch, context, gpu):
    kernels = rf.decode_step_kernels(cfg, batch=batch, context=context)
    step = rf.step_seconds(kernels, gpu.fp16_flops, gpu.hbm_bandwidth)
    assert rf.blended_step_seconds(kernels, gpu.fp16_flops, gpu.hbm_bandwidth) <= step * (1 + 1e-12)


def test_attention_stays_put_while_the_weight_matmuls_move_right():
    h100 = GPUS["H100 SXM"]
    peak, bw = h100.fp16_flops, h100.hbm_bandwidth
    steps = {b: rf.decode_step_kernels(LLAMA_70B, batch=b, context=4096) for b in (1, 64, 1024)}
    attention = [steps[b][1].intensity for b in steps]
    assert max(attention) == pytest.approx(min(attention))          # batch does not move it
    assert 0.9 * LLAMA_70B.group_size < attention[0] < LLAMA_70B.group_size
    matmul = [steps[b][0].intensity for b in steps]
    assert matmul == sorted(matmul) and matmul[0] < 1.01 and matmul[-1] > rf.ridge_point(peak, bw)
    big = steps[1024]
    assert [k.bound(peak, bw) for k in big] == ["compute", "memory", "memory"]
    # one blended point calls the whole step memory-bound and underestimates its time
    blended_intensity = sum(k.flops for k in big) / sum(k.bytes for k in big)
    assert blended_intensity < rf.ridge_point(peak, bw)
    assert rf.blended_step_seconds(big, peak, bw) < 0.9 * rf.step_seconds(big, peak, bw)
    # at batch 1 everything is memory-bound and the two models agree
    one = steps[1]
    assert rf.blended_step_seconds(one, peak, bw) == pytest.approx(rf.step_seconds(one, peak, bw))


def test_a_quantized_cache_moves_the_attention_point_right():
    fp16 = rf.decode_step_kernels(LLAMA_70B, batch=8, context=4096)[1]
    fp8 = rf.decode_step_kernels(LLAMA_70B, batch=8, context=4096, kv_dtype="fp8")[1]
    assert fp8.flops == fp16.flops and fp8.intensity > 1.9 * fp16.intensity


# ------------------------------------------- attention's intensity: GQA, MLA, verification

def _counted_attention_flops(q_heads, kv_heads, score_dim, value_dim, positions, keys):
    """FLOPs of `grouped_query_attention` on those shapes, as torch's flop counter sees them
    (its two matrix products; the softmax is not a matmul and is not counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    from reference.attention import grouped_query_attention
    q = torch.zeros(1, q_heads, positions, score_dim)
    k = torch.zeros(1, kv_heads, keys, score_dim)
    v = torch.zeros(1, kv_heads, keys, value_dim)
    with FlopCounterMode(display=False) as counter:
        grouped_query_attention(q, k, v, causal=True)
    return counter.get_total_flops()


@pytest.mark.parametrize("positions", [1, 5])
def test_gqa_attention_intensity_is_twice_the_group_times_positions_over_bytes(positions):
    from reference.calculators.memory import MODELS
    llama = MODELS["Llama 3.1 70B"]
    keys = 4096
    flops = _counted_attention_flops(llama.q_heads, llama.kv_heads, llama.head_dim,
                                     llama.head_dim, positions, keys)
    cache_bytes = llama.kv_heads * keys * 2 * llama.head_dim * 2     # K and V, fp16
    got = rf.decode_attention_intensity(llama, query_positions=positions, kv_dtype="fp16")
    assert got == pytest.approx(flops / cache_bytes), \
        "FLOPs of the two products over the bytes of K and V read once"
    assert got == 2 * llama.q_heads // llama.kv_heads * positions / 2, "I = 2 G T / s"
    # the per-kernel model of a decode step (which also counts q, the output and the new
    # K/V) approaches the same figure at a long context
    att = rf.decode_step_kernels(LLAMA_70B, batch=1, context=keys)[1]
    assert att.intensity == pytest.approx(rf.decode_attention_intensity(llama), rel=0.01)


@pytest.mark.parametrize("positions", [1, 2])
def test_absorbed_mla_attention_intensity_counts_every_head_against_one_latent(positions):
    # absorbed MLA (reference.mla) is MQA whose one K/V head is the cache: queries of
    # latent + RoPE width against [latent, RoPE key], values = the latent
    from reference.calculators.memory import MODELS
    ds = MODELS["DeepSeek V3"]
    width, keys = ds.latent_dim + ds.rope_dim, 1024
    flops = _counted_attention_flops(ds.q_heads, 1, width, ds.latent_dim, positions, keys)
    for dtype, size in (("bf16", 2), ("fp8", 1)):
        got = rf.decode_attention_intensity(ds, query_positions=positions, kv_dtype=dtype)
        assert got == pytest.approx(flops / (keys * width * size)), \
            f"{dtype}: every head's FLOPs over the one latent's bytes"
    h100 = GPUS["H100 SXM"]
    ridge = rf.ridge_point(h100.fp16_flops, h100.hbm_bandwidth)
    one = rf.decode_attention_intensity(ds, kv_dtype="bf16")
    assert 0.5 * ridge < one < ridge < 2 * one, \
        "DeepSeek V3's bf16 decode attention sits just under an H100's ridge, fp8 past it"


def test_attention_intensity_refuses_a_zero_count():
    with pytest.raises(ValueError, match="query_positions"):
        rf.attention_intensity(query_heads=8, score_dim=128, value_dim=128,
                               cached_elements=256, query_positions=0)
