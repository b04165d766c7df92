"""Grader for exercises/ch03_memory.ipynb.

Expected values come from ``reference.calculators.memory``, ``reference.attention``, ``reference.quant``,
``reference.mla`` and ``reference.eviction``, computed here on inputs drawn from ``torch.Generator().manual_seed(seed)``.
Wrong answers are compared with what the usual slips produce, to name the slip.
"""
from __future__ import annotations

import pytest
import torch

from autograder.boundary.causes import LearnerError
from autograder.rules.feedback import PrerequisiteFailed, assert_close, assert_equal
from autograder.rules.inputs import generator, randint
from autograder.rules.plugin import exercise
from reference.calculators import memory
from reference.calculators.hardware import GPUS
from reference.attention import grouped_query_attention
from reference.eviction import sink_window_keep
from reference.mla import MLA
from reference.quant import int8_quantize_kv

# The exercise is the grouping itself: the fused kernels would do it for the learner. So would
# the quantizable MultiheadAttention of torch.ao, whose attention is Python over operations this
# exercise allows (bmm, softmax) and copies nothing when driven one K/V head at a time with the
# group's queries as its rows (or swapped in by torch.ao.quantization.prepare without being
# named): its attention, _forward_impl, is guarded on the class, as in chapters 01, 02 and 08.
FORBIDDEN_ATTENTION = ["torch.nn.functional.scaled_dot_product_attention",
                       "torch.nn.functional.multi_head_attention_forward",
                       "torch.nn.attention.flex_attention.flex_attention",
                       "torch.ao.nn.quantizable.MultiheadAttention._forward_impl"]

GQA_MEMORY_MB = 2000   # gqa_attention's memory limit: below one 2 GiB copy of K or V per query head
DTYPES = ["fp32", "fp16", "bf16", "fp8", "int8", "int4"]
BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5}


def _whole(result, call: str) -> int:
    if isinstance(result, bool) or not isinstance(result, (int, float)) or result != int(result):
        raise AssertionError(f"{call} returned {result!r}; expected a whole number of bytes (an int)")
    return int(result)


def _expect_value_error(learner, name: str, args: dict, why: str) -> None:
    call = f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
    try:
        result = learner.call(name, **args)
    except LearnerError as exc:
        if "ValueError" not in str(exc):
            raise AssertionError(f"{call} should raise ValueError ({why}); instead {exc}") from None
        return
    raise AssertionError(f"{call} returned {result!r}; it should raise ValueError ({why})")


def _compare_bytes(learner, name: str, args: dict, expected: int, slips: list) -> None:
    """``slips``: (value a slip returns, advice) pairs; the first one equal to the answer names it."""
    call = f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
    got = _whole(learner.call(name, **args), call)
    if got != expected:
        hint = next((advice for value, advice in slips if value == got), None)
        assert_equal(got, expected, name=call, hint=hint)


# ------------------------------------------------------------------------ kv_cache_bytes

def _cache_cases(gen):
    for dtype in DTYPES:
        q_heads = 4 * randint(gen, 1, 8)
        kv_heads = [q_heads, randint(gen, 1, 4), 1][randint(gen, 0, 2)]   # MHA, GQA or MQA
        yield dict(layers=randint(gen, 1, 96), kv_heads=kv_heads, head_dim=[64, 96, 128][randint(gen, 0, 2)],
                   tokens=2 * randint(gen, 1, 40_000) + 1, batch=randint(gen, 1, 16), dtype=dtype)


@exercise("kv_cache_bytes", points=2)
def test_kv_cache_bytes_matches_the_formula(learner, seed):
    for args in _cache_cases(generator(seed)):
        expected = memory.kv_cache_bytes(**args)
        bytes_each = BYTES[args["dtype"]]
        elements = expected / bytes_each if bytes_each != 0.5 else 2 * args["layers"] * args["kv_heads"] \
            * args["head_dim"] * args["tokens"] * args["batch"]
        slips = [
            (round(expected / 2), "K and V are two tensors: count both (the factor 2)."),
            (round(elements * bytes_each * 8), "the result is in bits; divide by 8 for bytes."),
            (round(elements), f"{args['dtype']} takes {bytes_each} byte(s) per element, not 1."),
            (round(expected / args["batch"]), "every sequence of the batch has its own cache: multiply by batch."),
            (round(elements * 2), "the dtype argument was ignored (fp16 assumed)."),
        ]
        _compare_bytes(learner, "kv_cache_bytes", args, expected, slips)


@exercise("kv_cache_bytes", points=2)
def test_kv_cache_bytes_rejects_bad_input(learner, seed):
    base = dict(layers=2, kv_heads=2, head_dim=64, tokens=10)
    _expect_value_error(learner, "kv_cache_bytes", base | dict(tokens=-randint(generator(seed), 1, 99)),
                        "a negative token count")
    _expect_value_error(learner, "kv_cache_bytes", base | dict(dtype="fp12"), "an unknown dtype")


# -------------------------------------------------------------------------- mla_kv_bytes

@exercise("mla_kv_bytes", points=1)
def test_mla_kv_bytes_matches_the_formula(learner, seed):
    gen = generator(seed)
    for dtype in DTYPES:
        args = dict(layers=randint(gen, 1, 64), latent_dim=64 * randint(gen, 1, 8), rope_dim=32 * randint(gen, 1, 2),
                    tokens=2 * randint(gen, 1, 40_000) + 1, batch=randint(gen, 1, 8), dtype=dtype)
        expected = memory.mla_kv_bytes(**args)
        without_rope = memory.mla_kv_bytes(**(args | dict(rope_dim=0)))
        slips = [(2 * expected, "MLA stores ONE latent per token for keys and values together: no factor 2."),
                 (without_rope, "the decoupled RoPE key (rope_dim numbers per token and layer) is cached too."),
                 (expected // args["batch"], "multiply by batch: every sequence has its own latents.")]
        _compare_bytes(learner, "mla_kv_bytes", args, expected, slips)


# -------------------------------------------------------------- max_concurrent_sequences

@exercise("max_concurrent_sequences", points=2)
def test_max_concurrent_sequences(learner, seed):
    gen = generator(seed)
    gpu = GPUS["H100 SXM"].hbm_bytes
    cases = []
    for name in ("Llama 3.1 8B", "Qwen 3 32B", "SmolLM2-135M"):
        shape = memory.MODELS[name]
        cases.append(dict(gpu_bytes=gpu, weight_bytes=shape.weight_bytes("bf16"),
                          per_token_bytes=shape.bytes_per_token(), tokens_per_seq=randint(gen, 1000, 33_000),
                          overhead_bytes=randint(gen, 1, 4) * 10**9))
    cases.append(dict(gpu_bytes=gpu, weight_bytes=memory.MODELS["Llama 3.1 70B"].weight_bytes("bf16"),
                      per_token_bytes=327_680, tokens_per_seq=4096, overhead_bytes=0))   # weights do not fit
    for args in cases:
        expected = memory.max_concurrent_sequences(**args)
        per_seq = args["per_token_bytes"] * args["tokens_per_seq"]
        free = args["gpu_bytes"] - args["weight_bytes"] - args["overhead_bytes"]
        call = f"max_concurrent_sequences({', '.join(f'{k}={v}' for k, v in args.items())})"
        got = learner.call("max_concurrent_sequences", **args)
        if isinstance(got, float) and got != int(got):
            raise AssertionError(f"{call} returned {got}; a sequence either fits or not: return a whole number (floor)")
        got = _whole(got, call)
        slips = {-(-free // per_seq): "round down: a partly fitting sequence does not fit.",
                 (args["gpu_bytes"] - args["weight_bytes"]) // per_seq: "subtract overhead_bytes too.",
                 free // per_seq: "when the weights alone do not fit, the answer is 0 sequences, not a negative count.",
                 args["gpu_bytes"] // per_seq: "the weights take their share of the memory first."}
        if got != expected:
            assert_equal(got, expected, name=call, hint=slips.get(got) if slips.get(got) and got != expected else None)
    _expect_value_error(learner, "max_concurrent_sequences",
                        dict(gpu_bytes=gpu, weight_bytes=0, per_token_bytes=0, tokens_per_seq=10),
                        "per_token_bytes must be positive")


# --------------------------------------------------------------------------- gqa_attention

def _gqa_inputs(gen, B, Hq, Hkv, T, S, D):
    draw = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64).float()  # noqa: E731
    return draw(B, Hq, T, D), draw(B, Hkv, S, D), draw(B, Hkv, S, D)


def _gqa_hint(got, q, k, v, causal) -> str | None:
    """Name the slip whose output matches ``got``."""
    if not isinstance(got, torch.Tensor) or got.shape != q.shape:
        return None
    group = q.shape[1] // k.shape[1]
    interleaved = torch.arange(q.shape[1]) % k.shape[1]
    slips = {"query head h uses K/V head h // (Hq // Hkv): consecutive query heads share one K/V head "
             "(h % Hkv interleaves them)": lambda: grouped_query_attention(
                 q, k[:, interleaved], v[:, interleaved], causal=causal) if group > 1 and k.shape[1] > 1 else None,
             "divide the scores by sqrt(D)": lambda: grouped_query_attention(q, k, v, causal=causal, scale=1.0)}
    if causal and q.shape[2] < k.shape[2]:
        slips["the T queries are the LAST T positions: query i sees keys up to S - T + i, not up to i"] = \
            lambda: grouped_query_attention(q, k[:, :, :q.shape[2]], v[:, :, :q.shape[2]], causal=True)
    for advice, make in slips.items():
        other = make()
        if other is not None and torch.allclose(got.double(), other.double(), rtol=1e-3, atol=1e-4):
            return advice
    return None


def _check_gqa(learner, gen, B, Hq, Hkv, T, S, D, causal):
    q, k, v = _gqa_inputs(gen, B, Hq, Hkv, T, S, D)
    got = learner.call("gqa_attention", q, k, v, causal=causal)
    expected = grouped_query_attention(q, k, v, causal=causal)
    kind = "MHA" if Hq == Hkv else "MQA" if Hkv == 1 else f"GQA ({Hq // Hkv} query heads per K/V head)"
    call = f"gqa_attention for {kind}, q {list(q.shape)}, k/v {list(k.shape)}, causal={causal}"
    _require_no_copy_per_head(learner, q, k, call)
    assert_close(got, expected, name=call, rtol=1e-4, atol=1e-5, hint=_gqa_hint(got, q, k, v, causal))


SOFTMAX_TENSORS = 6   # tensors of the scores' size a softmax by hand may make (s, s - m, exp, p, ...)


def _require_no_copy_per_head(learner, q, k, call):
    """No copy of K or V per query head, on every size, not only on the large case a cell could
    recognise: the largest tensor the call allocated (``learner.largest_allocation``, a tensor
    made from Python values included) stays below K repeated for every query head, where that
    is larger than what grouping needs (the scores, the output)."""
    B, Hq, T, D = q.shape
    S = k.shape[2]
    copies = k.element_size() * B * Hq * S * D
    needed = q.element_size() * B * Hq * T * max(S, D)
    peak = getattr(learner, "largest_allocation", 0)
    if Hq > k.shape[1] and peak >= copies > needed:
        raise PrerequisiteFailed(
            f"{call} allocated a tensor of {peak} bytes, as large as K (or V) repeated for each "
            f"of the {Hq} query heads ({copies} bytes), where the scores and the output need "
            f"{needed}: share each K/V head with its group of query heads without copying it, "
            "on every input, small ones too (a copy built from Python values counts too)",
            rule="no copy of K or V per query head")
    # In total too: K copied for one query head at a time (k[:, h // group] * 1.0 in a loop over
    # the heads) never makes a large tensor, but makes as many bytes. What grouping makes in all:
    # the scores and their softmax (a few tensors of [B, Hq, T, S]) and the output.
    work = getattr(learner, "last_call_work", None)
    made = work.allocated_bytes if work is not None else 0
    grouped = q.element_size() * B * Hq * T * (SOFTMAX_TENSORS * S + 2 * D) + 4096
    if Hq > k.shape[1] and 2 * copies > grouped and made >= 2 * copies:
        raise PrerequisiteFailed(
            f"{call} made {made} bytes of tensors in all, as many as K and V copied for each of "
            f"the {Hq} query heads ({2 * copies} bytes), where grouping makes about {grouped}: "
            "a copy of a K/V head for every query head costs the same bytes whether it is made "
            "at once or one head at a time; let the group's query heads share it (reshape them "
            "into the rows of one matmul)", rule="no copy of K or V per query head")


@exercise("gqa_attention", points=3, forbid=FORBIDDEN_ATTENTION, memory_mb=GQA_MEMORY_MB)
def test_gqa_attention_mha_gqa_mqa(learner, seed):
    gen = generator(seed)
    for ratio_heads in ((4, 4), (6, 2), (9, 3), (5, 1)):
        Hq, Hkv = ratio_heads
        T = randint(gen, 2, 7)
        _check_gqa(learner, gen, randint(gen, 1, 2), Hq, Hkv, T, T, randint(gen, 2, 8) * 4, causal=False)


@exercise("gqa_attention", points=3, forbid=FORBIDDEN_ATTENTION, memory_mb=GQA_MEMORY_MB)
def test_gqa_attention_causal_prefill_and_decode(learner, seed):
    gen = generator(seed + 1)
    for Hq, Hkv, T, S in ((6, 2, 5, 5), (6, 3, 1, 9), (4, 1, 3, 8), (3, 3, 4, 4)):
        _check_gqa(learner, gen, randint(gen, 1, 2), Hq, Hkv, T, S, 16, causal=True)


@exercise("gqa_attention", points=3, forbid=FORBIDDEN_ATTENTION, memory_mb=GQA_MEMORY_MB)
def test_gqa_attention_does_not_copy_kv_per_query_head(learner, seed):
    # One decode step of MQA with 128 query heads over 32,768 cached positions: K and V are 16 MiB
    # each, a copy per query head would be 2 GiB each, beyond the memory limit of this exercise
    # (GQA_MEMORY_MB) even one at a time, whatever the worker already uses.
    gen = generator(seed + 2)
    try:
        _check_gqa(learner, gen, 1, 128, 1, 1, 32_768, 128, causal=False)
    except LearnerError as exc:
        if "memory" in str(exc) or "timed out" in str(exc):
            raise AssertionError(
                f"{exc}. Without copies this case needs about 50 MB and a fraction of a second; it "
                "fails like this when K and V are copied once per query head (repeat / "
                "repeat_interleave / expand(...).reshape). View q as [B, Hkv, group, T, D] (or stack "
                "the group's queries as rows, [B, Hkv, group * T, D]) so each K/V head is read once") from None
        raise


# ------------------------------------------------------------------------ int8_quantize_kv

def _kv(gen, shape):
    k = torch.randn(shape, generator=gen, dtype=torch.float64).float()
    k[..., randint(gen, 0, shape[-1] - 1)] *= 20            # an outlier channel, as real keys have
    return k, torch.randn(shape, generator=gen, dtype=torch.float64).float()


# KIVI's axes: keys share a scale along the tokens (one per channel), values along the channels
# (one per token). name -> (index in the result, the axis a scale is shared along, the other).
KIVI = {"keys": (0, 2, 3), "values": (2, 3, 2)}
AXIS = {2: "token", 3: "channel"}


@exercise("int8_quantize_kv", points=3)
@pytest.mark.parametrize("which", ["keys", "values"])
def test_int8_quantize_kv_layout_and_scales(learner, seed, which):
    gen = generator(seed)
    shape = (randint(gen, 1, 2), randint(gen, 1, 3), randint(gen, 5, 20), randint(gen, 2, 8) * 4)
    k, v = _kv(gen, shape)
    got = learner.call("int8_quantize_kv", k, v)
    if not isinstance(got, (tuple, list)) or len(got) != 4:
        raise AssertionError(f"int8_quantize_kv returned {type(got).__name__}; expected a tuple "
                             "(k_codes, k_scale, v_codes, v_scale)")
    expected = int8_quantize_kv(k, v)
    B, H, T, D = shape
    first = KIVI[which][0]
    names = ("k_codes", "k_scale", "v_codes", "v_scale")[first:first + 2]
    for name, g, e in zip(names, got[first:first + 2], expected[first:first + 2]):
        if name == "k_scale" and isinstance(g, torch.Tensor) and list(g.shape) == [B, H, T, 1]:
            raise AssertionError("k_scale has one scale per token: keys are quantized per CHANNEL "
                                 f"(max over the T tokens, keepdim): shape [B, H, 1, D] = {[B, H, 1, D]}")
        if name == "v_scale" and isinstance(g, torch.Tensor) and list(g.shape) == [B, H, 1, D]:
            raise AssertionError("v_scale has one scale per channel: values are quantized per TOKEN "
                                 f"(max over the D channels, keepdim): shape [B, H, T, 1] = {[B, H, T, 1]}")
        if name.endswith("codes"):
            if not isinstance(g, torch.Tensor) or g.dtype != torch.int8:
                raise AssertionError(f"{name} should be an int8 tensor, got "
                                     f"{g.dtype if isinstance(g, torch.Tensor) else type(g).__name__}")
            assert_equal(list(g.shape), list(e.shape), name=f"{name}.shape")
            continue
        hint = "scale = max|x| / 127 (symmetric int8 uses codes -127..127)"
        if isinstance(g, torch.Tensor) and g.shape == e.shape and torch.allclose(g.double(), e.double() * 127 / 128):
            hint = "divide by 127, not 128: +128 does not fit in an int8, and a symmetric code range is -127..127"
        assert_close(g, e, name=name, rtol=1e-5, atol=1e-8, hint=hint)


@exercise("int8_quantize_kv", points=3)
@pytest.mark.parametrize("which", ["keys", "values"])
def test_int8_quantize_kv_round_trip_within_half_a_step(learner, seed, which):
    """codes * scale within scale / 2 of the input, with KIVI's scales: one per channel for the
    keys, one per token for the values, each max|x| / 127 over its slice (so a scale per element,
    per tensor or along the other axis gets nothing here, however close its round trip)."""
    gen = generator(seed + 1)
    k, v = _kv(gen, (1, 2, randint(gen, 8, 24), 32))
    got = learner.call("int8_quantize_kv", k, v)
    if not isinstance(got, (tuple, list)) or len(got) != 4 or not all(isinstance(t, torch.Tensor) for t in got):
        raise AssertionError("int8_quantize_kv must return four tensors (k_codes, k_scale, v_codes, v_scale)")
    index, shared, other = KIVI[which]
    x, codes, scale = (k, v)[index // 2], got[index], got[index + 1]
    prefix = which[0]
    if codes.dtype != torch.int8 or (codes.int().abs() > 127).any():
        raise AssertionError(f"{which}: codes must be int8 in -127..127")
    try:
        full = scale.double().expand_as(x)
        back = codes.double() * full
    except RuntimeError as exc:
        raise AssertionError(f"{which}: {prefix}_scale of shape {list(scale.shape)} does not "
                             f"broadcast against the codes {list(x.shape)} ({exc})") from None
    unit = f"one scale per {AXIS[other]}, shared by all the {AXIS[shared]}s of that {AXIS[other]}"
    varies = (full.amax(dim=shared) != full.amin(dim=shared)).any()
    if varies:
        along_other = not (full.amax(dim=other) != full.amin(dim=other)).any()
        raise AssertionError(
            f"{which} are quantized per {AXIS[other].upper()} in KIVI ({unit}, shape "
            f"{list(x.shape[:shared]) + [1] + list(x.shape[shared + 1:])}), but {prefix}_scale "
            f"changes along the {AXIS[shared]} axis"
            + (f": that is one scale per {AXIS[shared]}, the layout of the "
               f"{'values' if which == 'keys' else 'keys'}" if along_other else
               ": a scale per element stores as many floats as the input, which is no "
               "compression at all"))
    right = x.double().abs().amax(dim=shared, keepdim=True).expand_as(x) / 127
    ratio = full / right
    if (ratio < 1 - 1e-5).any():
        raise AssertionError(
            f"{which}: {prefix}_scale is smaller than max|x| / 127 over each {AXIS[other]}'s "
            f"{AXIS[shared]}s (down to {float(ratio.min()):.4g}× that), so the largest element "
            "needs a code beyond ±127: divide max|x| by 127, not 128")
    if (ratio > 1 + 1e-5).any():
        per_tensor = not (full != full.reshape(-1)[0]).any()
        raise AssertionError(
            f"{which}: {prefix}_scale is larger than max|x| / 127 over each {AXIS[other]}'s own "
            f"{AXIS[shared]}s (up to {float(ratio.max()):.3g}× that), so those {AXIS[other]}s "
            "never use the codes up to ±127. "
            + (f"One scale for the whole tensor wastes the codes of every {AXIS[other]} but the "
               "one holding the largest value" if per_tensor else
               f"Take the max of |x| along the {AXIS[shared]} axis (dim={shared}, keepdim=True) "
               "and divide by 127"))
    error = (back - x.double()).abs()
    bound = full / 2 * (1 + 1e-5) + 1e-7
    if (error > bound).any():
        raise AssertionError(
            f"{which}: codes * scale is further than scale / 2 from the input (worst: "
            f"{float((error / bound).max()):.2f}× the bound). Round to the nearest code "
            "(torch.round), do not truncate with .to(torch.int8).")


# --------------------------------------------------------------------- absorb_mla_weights

def _mla_layer(gen) -> MLA:
    layer = MLA(d_model=4 * randint(gen, 4, 8), n_heads=randint(gen, 2, 4), latent_dim=4 * randint(gen, 2, 4),
                q_latent_dim=4 * randint(gen, 2, 5), nope_dim=4 * randint(gen, 1, 3), rope_dim=4,
                v_dim=4 * randint(gen, 1, 3)).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) / p.shape[1] ** 0.5)
    return layer


@exercise("absorb_mla_weights", points=2)
def test_absorbed_weights_match(learner, seed):
    layer = _mla_layer(generator(seed))
    args = [layer.w_uq.weight, layer.w_uk.weight, layer.w_uv.weight, layer.w_o.weight]
    got = learner.call("absorb_mla_weights", *[a.detach().clone() for a in args], layer.n_heads)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise AssertionError("absorb_mla_weights must return a pair (w_uqk, w_ouv)")
    w_uqk, w_ouv = layer.absorbed_weights()
    summed = (layer.w_uq.weight.T @ layer.w_uk.weight).detach()
    if isinstance(got[0], torch.Tensor) and got[0].shape == summed.shape and torch.allclose(got[0], summed):
        raise AssertionError("w_uqk mixes heads: W_UQᵀ W_UK over all heads sums the heads' products. "
                             "Split the rows per head and multiply head by head -> [H, d_cq, d_c].")
    assert_close(got[0], w_uqk, name="w_uqk", rtol=1e-6, atol=1e-9,
                 hint="w_uqk[h] = W_UQ,hᵀ @ W_UK,h with W_UQ,h = w_uq[h*d_nope:(h+1)*d_nope] (reshape to [H, d_nope, d_cq])")
    assert_close(got[1], w_ouv, name="w_ouv", rtol=1e-6, atol=1e-9,
                 hint="columns h*d_c:(h+1)*d_c of w_ouv are W_O,h @ W_UV,h, with W_O,h the columns "
                      "h*d_v:(h+1)*d_v of w_o")


@exercise("absorb_mla_weights", points=2)
def test_absorbed_attention_equals_naive_attention(learner, seed):
    gen = generator(seed + 1)
    layer = _mla_layer(gen)
    weights = [p.detach().clone() for p in (layer.w_uq.weight, layer.w_uk.weight, layer.w_uv.weight, layer.w_o.weight)]
    got = learner.call("absorb_mla_weights", *weights, layer.n_heads)
    if not isinstance(got, (tuple, list)) or len(got) != 2 or not all(isinstance(t, torch.Tensor) for t in got):
        raise AssertionError("absorb_mla_weights must return a pair of tensors (w_uqk, w_ouv)")
    h = torch.randn(1, randint(gen, 3, 9), layer.w_dq.in_features, generator=gen, dtype=torch.float64)
    naive = layer(h, mode="naive")
    try:
        layer.absorb(weights=(got[0].double(), got[1].double()))
        absorbed = layer(h, mode="absorbed")
    except RuntimeError as exc:
        raise AssertionError(f"your matrices do not have the shapes absorbed attention needs: {exc}") from None
    assert_close(absorbed, naive, name="MLA output computed with your absorbed matrices", rtol=1e-6, atol=1e-9,
                 hint="absorbed attention must give the naive attention's output exactly (up to rounding)")


# ------------------------------------------------------------------------ sink_window_step

def _sink_window_slips(kept: list[int], position: int, n_sink: int, window: int) -> dict:
    """What the usual slips return for one step, each with the advice that names it."""
    held = kept + [position]
    budget = n_sink + window
    if len(held) <= budget:
        return {}
    slots = list(range(n_sink)) + list(range(len(held) - window, len(held)))
    return {
        tuple(held[-budget:]): "keep the first n_sink positions (the attention sinks) as well as "
                               "the window: a plain window of n_sink + window tokens evicts them.",
        tuple(held[:n_sink] + held[len(held) - window + 1:]): "keep the last `window` positions, "
                                                              "the one just written included.",
        tuple(held[:n_sink] + kept[-window:]): "the position just written is the newest: it is "
                                               "always kept.",
        tuple(slots): "return positions, not slot indices: after the first eviction the kept "
                      "positions are no longer 0, 1, 2, ...",
        tuple(held[len(held) - window:] + held[:n_sink]): "return the positions in ascending "
                                                          "order: the sinks come first.",
    }


def _drive_sink_window(learner, n_sink: int, window: int, kept: list[int], steps: int) -> None:
    """Feed `steps` positions one by one, each time from the reference's kept set, and check the
    learner's kept set after every step."""
    for _ in range(steps):
        position = kept[-1] + 1 if kept else 0
        call = f"sink_window_step({kept}, {position}, n_sink={n_sink}, window={window})"
        got = learner.call("sink_window_step", list(kept), position, n_sink, window)
        held = kept + [position]
        expected = [held[slot] for slot in sink_window_keep(len(held), n_sink, window)]
        if isinstance(got, tuple):
            got = list(got)
        if not isinstance(got, list) or not all(isinstance(p, int) and not isinstance(p, bool)
                                                for p in got):
            raise AssertionError(f"{call} returned {got!r}; expected a list of int positions")
        if got != expected:
            hint = _sink_window_slips(kept, position, n_sink, window).get(tuple(got))
            assert_equal(got, expected, name=call, hint=hint)
        kept = expected


@exercise("sink_window_step", points=2)
def test_sink_window_step_from_an_empty_cache(learner, seed):
    gen = generator(seed)
    for n_sink in (0, randint(gen, 1, 4)):
        window = randint(gen, 1, 9)
        _drive_sink_window(learner, n_sink, window, [], n_sink + window + randint(gen, 8, 20))


@exercise("sink_window_step", points=2)
def test_sink_window_step_after_a_long_prefill(learner, seed):
    gen = generator(seed)
    n_sink, window = randint(gen, 1, 4), randint(gen, 2, 9)
    prefill = randint(gen, n_sink + window + 1, 3 * (n_sink + window))
    _drive_sink_window(learner, n_sink, window, list(range(prefill)), randint(gen, 5, 15))
