"""Known-wrong and cheating submissions for chapter 03 (see tests/grading/test_selfcheck.py).

Each section is the body of one solution cell, written in full or, for a slip, as
`# replace:` / `# with:` edits of the solution section (autograder/solutions/__init__.py);
none may earn the exercise's full points.
"""

# %% grade_id: kv_cache_bytes | wrong: forgets that K and V are two tensors
# expect: the factor 2
# replace:
#     elements = 2 * layers * kv_heads * head_dim * tokens * batch
# with:
#     elements = layers * kv_heads * head_dim * tokens * batch


# %% grade_id: kv_cache_bytes | wrong: counts int4 as a whole byte and accepts anything
# expect: byte(s) per element
def kv_cache_bytes(layers, kv_heads, head_dim, tokens, batch=1, dtype="fp16"):
    size = {"fp32": 4, "fp16": 2, "bf16": 2}.get(dtype, 1)
    return 2 * layers * kv_heads * head_dim * tokens * batch * size


# %% grade_id: kv_cache_bytes | cheat: imports the reference implementation
# expect: is not allowed
from reference.calculators.memory import kv_cache_bytes  # noqa: F401


# %% grade_id: mla_kv_bytes | wrong: keeps the factor 2 of K and V
# expect: no factor 2
# replace:
#     elements = layers * (latent_dim + rope_dim) * tokens * batch
# with:
#     elements = 2 * layers * (latent_dim + rope_dim) * tokens * batch


# %% grade_id: mla_kv_bytes | wrong: forgets the decoupled RoPE key
# expect: decoupled RoPE key
# replace:
#     elements = layers * (latent_dim + rope_dim) * tokens * batch
# with:
#     elements = layers * latent_dim * tokens * batch


# %% grade_id: mla_kv_bytes | cheat: reads the reference source by path and runs it
# expect: mla_kv_bytes
import pathlib

# where the course lives: the grader says so in the environment and on sys.path
for _folder in (*map(pathlib.Path, filter(None, [__import__("os").environ.get("AUTOGRADER_ROOT")])),
                *map(pathlib.Path, __import__("sys").path), pathlib.Path.cwd(), *pathlib.Path.cwd().parents):
    _file = _folder / "reference" / "memory.py"
    if _file.exists():
        _namespace = {}
        _source = _file.read_text().replace("from reference.calculators.hardware import GPUS, GPU", "GPUS = GPU = None")
        exec(compile(_source, str(_file), "exec"), _namespace)
        mla_kv_bytes = _namespace["mla_kv_bytes"]
        break


# %% grade_id: max_concurrent_sequences | wrong: divides without rounding down
# expect: whole number
# replace:
#     return max(free, 0) // (per_token_bytes * tokens_per_seq)
# with:
#     return max(free, 0) / (per_token_bytes * tokens_per_seq)


# %% grade_id: max_concurrent_sequences | wrong: lets the count go negative when the weights do not fit
# expect: not a negative count
# replace:
#     return max(free, 0) // (per_token_bytes * tokens_per_seq)
# with:
#     return free // (per_token_bytes * tokens_per_seq)


# %% grade_id: max_concurrent_sequences | cheat: imports the autograder to find the expected values
# expect: is not allowed
import autograder  # noqa: F401
from reference.calculators.memory import max_concurrent_sequences  # noqa: F401


# %% grade_id: gqa_attention | wrong: interleaves query heads over K/V heads (h % Hkv), by indexing K and V per query head
# expect: without copying K or V
# expect score: 0
def gqa_attention(q, k, v, causal=False):
    Hq, Hkv = q.shape[1], k.shape[1]
    index = torch.arange(Hq) % Hkv
    scores = q @ k[:, index].transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        T, S = q.shape[2], k.shape[2]
        scores = scores.masked_fill(torch.arange(S)[None] > torch.arange(T)[:, None] + S - T, float("-inf"))
    return scores.softmax(-1) @ v[:, index]


# %% grade_id: gqa_attention | wrong: right numbers, but copies K and V for every query head
# expect: not among the operations this exercise allows
# expect: without copying K or V
# expect score: 0
def gqa_attention(q, k, v, causal=False):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        T, S = q.shape[2], k.shape[2]
        scores = scores.masked_fill(torch.arange(S)[None] > torch.arange(T)[:, None] + S - T, float("-inf"))
    return scores.softmax(-1) @ v


# %% grade_id: gqa_attention | wrong: copies K, then V, per query head, one at a time (each copy freed before the next)
# expect: without copying K or V
# expect score: 0
def gqa_attention(q, k, v, causal=False):
    group = q.shape[1] // k.shape[1]
    scores = q @ k.repeat_interleave(group, dim=1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        T, S = q.shape[2], k.shape[2]
        scores = scores.masked_fill(torch.arange(S)[None] > torch.arange(T)[:, None] + S - T, float("-inf"))
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    return (weights / weights.sum(-1, keepdim=True)) @ v.repeat_interleave(group, dim=1)


# %% grade_id: gqa_attention | cheat: copies K and V per query head only on inputs small enough to pass unseen
# expect: without copying K or V
# expect score: 0
def gqa_attention(q, k, v, causal=False):
    B, Hq, T, D = q.shape
    group, S = Hq // k.shape[1], k.shape[2]
    if k.numel() * group > 2**24:      # large: the honest way, so the memory limit sees nothing
        rows = q.reshape(B, k.shape[1], group * T, D)
        scores = rows @ k.transpose(-1, -2) / math.sqrt(D)
        if causal:
            mask = torch.arange(S)[None] > torch.arange(T)[:, None] + S - T
            scores = scores.view(B, -1, group, T, S).masked_fill(mask, float("-inf")).view_as(scores)
        return (scores.softmax(-1) @ v).reshape(B, Hq, T, D)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    if causal:
        scores = scores.masked_fill(torch.arange(S)[None] > torch.arange(T)[:, None] + S - T, float("-inf"))
    return scores.softmax(-1) @ v


# %% grade_id: gqa_attention | cheat: a broadcasting matmul over a size-1 head axis (torch copies K per query head inside)
# expect: without copying K or V
# expect score: 0
def gqa_attention(q, k, v, causal=False):
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    grouped = q.view(B, Hkv, Hq // Hkv, T, D)
    scores = grouped @ k[:, :, None].transpose(-1, -2) / math.sqrt(D)
    if causal:
        scores = scores.masked_fill(torch.arange(S)[None] > torch.arange(T)[:, None] + S - T, float("-inf"))
    return (scores.softmax(-1) @ v[:, :, None]).reshape(B, Hq, T, D)


# %% grade_id: gqa_attention | cheat: the quantizable MultiheadAttention of torch.ao (its Python attention: bmm and softmax, allowed operations), one K/V head at a time with its group's queries as rows, nothing copied
# expect: `torch.ao.nn.quantizable.MultiheadAttention._forward_impl` is forbidden
# expect score: 0
def gqa_attention(q, k, v, causal=False):
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    group = Hq // Hkv
    mha = torch.ao.nn.quantizable.MultiheadAttention(D, 1, bias=False).to(q.dtype).train(False)
    for projection in (mha.linear_Q, mha.linear_K, mha.linear_V, mha.out_proj):
        torch.nn.init.eye_(projection.weight)            # identity projections, set in place
    mask = None
    if causal:                                           # row r of a group is query r % T
        mask = torch.arange(S)[None, :] > torch.arange(group * T).remainder(T)[:, None] + (S - T)
    out = q.new_zeros(B, Hq, T, D)
    with torch.no_grad():
        for b in range(B):
            for h in range(Hkv):                         # batch of one: no transposed copies
                rows = q[b, h * group:(h + 1) * group].reshape(group * T, 1, D)
                o, _ = mha(rows, k[b, h].unsqueeze(1), v[b, h].unsqueeze(1), attn_mask=mask,
                           need_weights=False)
                head = out[b:b + 1].slice_scatter(o.reshape(1, group, T, D), 1, h * group, (h + 1) * group)
                out = out.slice_scatter(head, 0, b, b + 1)
    return out


# %% grade_id: gqa_attention | cheat: K and V copied for each query head by arithmetic (k[:, h // group] * 1.0, no copying operation), one head at a time, each copy small
# expect: as many as K and V copied for each of the
# expect score: 0
def gqa_attention(q, k, v, causal=False):
    B, Hq, T, D = q.shape
    S, group = k.shape[2], Hq // k.shape[1]
    allowed = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + (S - T)
    out = []
    for h in range(Hq):
        kh, vh = k[:, h // group] * 1.0, v[:, h // group] * 1.0          # this head's copies
        scores = q[:, h] @ kh.transpose(-1, -2) / math.sqrt(D)
        if causal:
            scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.exp(scores - scores.amax(-1, keepdim=True))
        out.append((weights / weights.sum(-1, keepdim=True)) @ vh)
    result = q.new_zeros(B, Hq, T, D)                                       # heads put in place
    for h, o in enumerate(out):                                             # by arithmetic too
        result = result + o[:, None] * (torch.arange(Hq) == h).view(1, Hq, 1, 1)
    return result


# %% grade_id: gqa_attention | wrong: causal mask anchored at the first key (query i sees keys 0..i)
# expect: the LAST T positions
# replace:
#         allowed = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + (S - T)
# with:
#         allowed = torch.arange(S)[None, :] <= torch.arange(T)[:, None]


# %% grade_id: gqa_attention | cheat: the fused kernel the exercise forbids, reached by a built name
# expect: is forbidden in this exercise
def gqa_attention(q, k, v, causal=False):
    fused = getattr(F, "scaled_dot_" + "product_attention")
    T, S = q.shape[2], k.shape[2]
    mask = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + (S - T) if causal else None
    return fused(q, k, v, attn_mask=mask, enable_gqa=True)


# %% grade_id: gqa_attention | cheat: the fused math kernel with GQA, imported from torch's internals
# expect: may not reach torch's internals
_fused = torch._C._VariableFunctions._scaled_dot_product_attention_math


def gqa_attention(q, k, v, causal=False):
    T, S = q.shape[2], k.shape[2]
    mask = None
    if causal:
        hidden = torch.arange(S)[None, :] > torch.arange(T)[:, None] + (S - T)
        mask = torch.zeros(T, S, dtype=q.dtype).masked_fill(hidden, float("-inf"))
    return _fused(q, k, v, attn_mask=mask, enable_gqa=True)[0]


# %% grade_id: gqa_attention | cheat: imports the reference attention
# expect: is not allowed
from reference.attention import grouped_query_attention as gqa_attention  # noqa: F401


# %% grade_id: int8_quantize_kv | wrong: quantizes keys per token like values
# expect: quantized per CHANNEL
# replace:
#     k_scale = k.abs().amax(dim=2, keepdim=True) / 127
# with:
#     k_scale = k.abs().amax(dim=3, keepdim=True) / 127


# %% grade_id: int8_quantize_kv | wrong: truncates instead of rounding
# expect: Round to the nearest code
# replace:
#     k_codes = torch.round(k / k_scale).clamp(-127, 127).to(torch.int8)
#     v_codes = torch.round(v / v_scale).clamp(-127, 127).to(torch.int8)
# with:
#     k_codes = (k / k_scale).clamp(-127, 127).to(torch.int8)
#     v_codes = (v / v_scale).clamp(-127, 127).to(torch.int8)


# %% grade_id: int8_quantize_kv | wrong: divides by 128
# expect: divide by 127, not 128
# replace:
#     k_scale = k.abs().amax(dim=2, keepdim=True) / 127
#     v_scale = v.abs().amax(dim=3, keepdim=True) / 127
#     k_codes = torch.round(k / k_scale).clamp(-127, 127).to(torch.int8)
#     v_codes = torch.round(v / v_scale).clamp(-127, 127).to(torch.int8)
# with:
#     k_scale = k.abs().amax(dim=2, keepdim=True) / 128
#     v_scale = v.abs().amax(dim=3, keepdim=True) / 128
#     k_codes = torch.round(k / k_scale).clamp(-128, 127).to(torch.int8)
#     v_codes = torch.round(v / v_scale).clamp(-128, 127).to(torch.int8)


# %% grade_id: int8_quantize_kv | wrong: KIVI's axes swapped (keys per token, values per channel)
# expect: keys are quantized per CHANNEL in KIVI
# expect: that is one scale per channel, the layout of the keys
# expect score: 0
# replace:
#     k_scale = k.abs().amax(dim=2, keepdim=True) / 127
#     v_scale = v.abs().amax(dim=3, keepdim=True) / 127
# with:
#     k_scale = k.abs().amax(dim=3, keepdim=True) / 127
#     v_scale = v.abs().amax(dim=2, keepdim=True) / 127


# %% grade_id: int8_quantize_kv | cheat: a scale per element (every code is ±127: nothing is compressed)
# expect: no compression at all
# expect score: 0
def int8_quantize_kv(k, v):
    k_scale, v_scale = k.abs() / 127, v.abs() / 127
    return (torch.round(k / k_scale).to(torch.int8), k_scale,
            torch.round(v / v_scale).to(torch.int8), v_scale)


# %% grade_id: int8_quantize_kv | cheat: one scale for the whole tensor, shaped like KIVI's
# expect: One scale for the whole tensor wastes the codes
# expect score: 0
def int8_quantize_kv(k, v):
    B, H, T, D = k.shape
    k_scale = (k.abs().max() / 127).expand(B, H, 1, D).clone()
    v_scale = (v.abs().max() / 127).expand(B, H, T, 1).clone()
    return (torch.round(k / k_scale).to(torch.int8), k_scale,
            torch.round(v / v_scale).to(torch.int8), v_scale)


# %% grade_id: int8_quantize_kv | cheat: imports the reference quantizer
# expect: is not allowed
from reference.quant import int8_quantize_kv  # noqa: F401


# %% grade_id: absorb_mla_weights | wrong: multiplies the full matrices, summing over heads
# expect: mixes heads
def absorb_mla_weights(w_uq, w_uk, w_uv, w_o, n_heads):
    return w_uq.T @ w_uk, w_o @ torch.block_diag(*w_uv.reshape(n_heads, -1, w_uv.shape[1]))


# %% grade_id: absorb_mla_weights | cheat: loads the weights into the reference MLA layer and asks it
# expect: is not allowed
def absorb_mla_weights(w_uq, w_uk, w_uv, w_o, n_heads):
    from reference.mla import MLA
    layer = MLA(d_model=w_o.shape[0], n_heads=n_heads, latent_dim=w_uk.shape[1],
                q_latent_dim=w_uq.shape[1], nope_dim=w_uk.shape[0] // n_heads, rope_dim=2,
                v_dim=w_uv.shape[0] // n_heads).to(w_uq.dtype)
    with torch.no_grad():
        for name, w in (("w_uq", w_uq), ("w_uk", w_uk), ("w_uv", w_uv), ("w_o", w_o)):
            getattr(layer, name).weight.copy_(w)
    return layer.absorbed_weights()


# %% grade_id: sink_window_step | wrong: a plain window of n_sink + window tokens (evicts the sinks)
# expect: attention sinks
# replace:
#     return held[:n_sink] + held[len(held) - window:]
# with:
#     return held[len(held) - n_sink - window:]


# %% grade_id: sink_window_step | wrong: keeps one position too few in the window
# expect: the one just written included
# replace:
#     return held[:n_sink] + held[len(held) - window:]
# with:
#     return held[:n_sink] + held[len(held) - window + 1:]


# %% grade_id: sink_window_step | wrong: returns slot indices instead of positions
# expect: return positions, not slot indices
def sink_window_step(kept, position, n_sink, window):
    held = list(kept) + [position]
    if len(held) <= n_sink + window:
        return list(range(len(held)))
    return list(range(n_sink)) + list(range(len(held) - window, len(held)))


# %% grade_id: sink_window_step | cheat: asks the reference for the kept positions
# expect: is not allowed
from reference.eviction import sink_window_keep


def sink_window_step(kept, position, n_sink, window):
    held = list(kept) + [position]
    return [held[slot] for slot in sink_window_keep(len(held), n_sink, window)]


# %% grade_id: gqa_attention | cheat: copies K and V per query head in numpy (np.repeat) on inputs small enough to pass unseen, brought back by torch.from_numpy (no operation allocates them)
# expect: a way of taking tensor data out of torch
# expect score: 0
import numpy as np


def gqa_attention(q, k, v, causal=False):
    B, Hq, T, D = q.shape
    group, S = Hq // k.shape[1], k.shape[2]
    if k.numel() * group > 2**24:      # large: the honest way, so the memory limit sees nothing
        rows = q.reshape(B, k.shape[1], group * T, D)
        return ((rows @ k.transpose(-1, -2) / math.sqrt(D)).softmax(-1) @ v).reshape(B, Hq, T, D)
    k, v = (torch.from_numpy(np.repeat(t.numpy(), group, axis=1)) for t in (k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    if causal:
        scores = scores.masked_fill(torch.arange(S)[None] > torch.arange(T)[:, None] + S - T, float("-inf"))
    return scores.softmax(-1) @ v


# %% grade_id: gqa_attention | cheat: copies K and V per query head through Python numbers (float(x) in nested lists, then torch.tensor) on inputs small enough to pass unseen: nothing named that the static look refuses
# expect: as large as K (or V) repeated for each
# expect score: 0
def gqa_attention(q, k, v, causal=False):
    B, Hq, T, D = q.shape
    group, S = Hq // k.shape[1], k.shape[2]
    if k.numel() * group > 2**24:      # large: the honest way, so the memory limit sees nothing
        rows = q.reshape(B, k.shape[1], group * T, D)
        return ((rows @ k.transpose(-1, -2) / math.sqrt(D)).softmax(-1) @ v).reshape(B, Hq, T, D)

    def per_query_head(t):
        return torch.tensor([[[[float(x) for x in row] for row in t[b, h // group]]
                              for h in range(Hq)] for b in range(B)], dtype=t.dtype)

    k, v = per_query_head(k), per_query_head(v)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    if causal:
        scores = scores.masked_fill(torch.arange(S)[None] > torch.arange(T)[:, None] + S - T, float("-inf"))
    return scores.softmax(-1) @ v


# %% grade_id: gqa_attention | cheat: K and V copied per query head (repeat_interleave, a refused operation) on inputs small enough to pass unseen, by a torch function mode the cell leaves on the stack: the call returns an empty output, and the mode fills it at the first torch function the worker runs after the call (its copy of the result), where nothing is recorded or refused (a class made with type(), so no dunder is named)
# expect: a torch function mode left on
# expect score: 0
import contextlib
from torch.overrides import TorchFunctionMode

PENDING = []


def _late_attention(mode, func, types, args=(), kwargs=None):
    if PENDING and args and args[0] is PENDING[0][0]:
        out, q, k, v, causal = PENDING.pop()
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if causal:
            T, S = q.shape[2], k.shape[2]
            scores = scores.masked_fill(torch.arange(S)[None] > torch.arange(T)[:, None] + S - T,
                                        float("-inf"))
        p = torch.exp(scores - scores.amax(-1, keepdim=True))
        out.copy_((p / p.sum(-1, keepdim=True)) @ v)
    return func(*args, **(kwargs or {}))


LateMode = type("LateMode", (TorchFunctionMode,), {"__torch_function__": _late_attention})
contextlib.ExitStack().enter_context(LateMode())


def gqa_attention(q, k, v, causal=False):
    B, Hq, T, D = q.shape
    group = Hq // k.shape[1]
    if k.numel() * group > 2**24:      # large: the honest way, so the memory limit sees nothing
        rows = q.reshape(B, k.shape[1], group * T, D)
        return ((rows @ k.transpose(-1, -2) / math.sqrt(D)).softmax(-1) @ v).reshape(B, Hq, T, D)
    out = torch.empty_like(q)
    PENDING[:] = [(out, q, k, v, causal)]
    return out
