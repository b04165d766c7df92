"""Known-wrong and cheating submissions for chapter 07 (see tests/test_selfcheck.py).

Each section is the body of one solution cell, written in full or, for a slip, as
`# replace:` / `# with:` edits of the solution section (autograder/solutions/__init__.py);
none may earn the exercise's full points.
"""

# %% grade_id: pick_flash | wrong: the "anything older gets FA2" rule of thumb
# expect: no FlashAttention version supports it
# replace:
#     if generation in ("Pascal", "Volta"):
#         return 0, f"{generation}: no FlashAttention version runs on it"
#     if generation == "Turing":
#         if training and head_dim > 64:
#             return 0, "Turing: FA1's backward above head dim 64 needs an A100/H100, FA2 needs Ampere"
#         return 1, "Turing: only FlashAttention 1.x runs on it"
# with:
#     if generation in ("Pascal", "Volta", "Turing"):
#         return 2, f"{generation}: FlashAttention-2 is the safe default"


# %% grade_id: pick_flash | wrong: ignores training (FA1 cannot train head dim 128 on Turing)
# expect: backward above head dim 64
# replace:
#     if generation == "Turing":
#         if training and head_dim > 64:
#             return 0, "Turing: FA1's backward above head dim 64 needs an A100/H100, FA2 needs Ampere"
# with:
#     if generation == "Turing":


# %% grade_id: pick_flash | wrong: FA4 on Hopper, since FA4 also runs there
# expect: Hopper: FlashAttention-3
# replace:
#         return 3, "Hopper: FlashAttention-3 was written for it"
# with:
#         return 4, "Hopper: FlashAttention-4 runs on it too"


# %% grade_id: pick_flash | cheat: imports the reference rule
# expect: is not allowed
from reference.calculators.flash_versions import pick_flash  # noqa: F401


# %% grade_id: pick_flash | cheat: reads the reference table by path and runs it
# expect: your code raised
def pick_flash(gpu, training, head_dim=64):
    import sys
    from pathlib import Path
    roots = [Path.cwd(), *Path.cwd().parents] + [Path(p) for p in sys.path if p]
    for root in roots:
        table = root / "reference" / "kernels" / "versions.py"
        if table.is_file():
            namespace = {"__name__": "stolen"}
            exec(compile(table.read_text(), str(table), "exec"), namespace)
            return tuple(namespace["pick_flash"](gpu, training, head_dim))
    raise FileNotFoundError("reference/calculators/flash_versions.py is not readable from here")


# %% grade_id: split_decode_attention | wrong: adds the partial states without rescaling
# expect: without rescaling
# replace:
#         weight = torch.exp(m - m_all)
#         l_all = l_all + weight * l
#         o_all = o_all + weight[..., None] * o
# with:
#         l_all = l_all + l
#         o_all = o_all + o


# %% grade_id: split_decode_attention | wrong: averages the splits' outputs
# expect: normalised outputs were averaged
# replace:
#     m_all = torch.stack([m for m, _, _ in states]).amax(dim=0)
#     l_all, o_all = torch.zeros_like(m_all), torch.zeros_like(q)
#     for m, l, o in states:
#         weight = torch.exp(m - m_all)
#         l_all = l_all + weight * l
#         o_all = o_all + weight[..., None] * o
#     return o_all / l_all[..., None]
# with:
#     return sum(o / l[..., None] for _, l, o in states) / len(states)


# %% grade_id: split_decode_attention | wrong: repeat() instead of repeat_interleave (wrong K/V head)
# expect: h // (Hq // Hkv)
# replace:
#     k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
# with:
#     k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)


# %% grade_id: split_decode_attention | wrong: chunk = N // num_splits drops the tail
# expect: keys were dropped
# replace:
#     chunk = -(-n_keys // num_splits)
# with:
#     chunk = n_keys // num_splits


# %% grade_id: split_decode_attention | wrong: log-sum-exp merge of normalised outputs; empty split gives 0/0
# expect: some splits hold no keys
def split_decode_attention(q, k, v, num_splits):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    chunk = -(-k.shape[2] // num_splits)
    lses, outs = [], []
    for split in range(num_splits):
        keys = slice(split * chunk, (split + 1) * chunk)
        s = torch.einsum("bhd,bhnd->bhn", q, k[:, :, keys]) / math.sqrt(q.shape[-1])
        m = s.amax(-1) if s.shape[-1] else s.new_full(s.shape[:2], float("-inf"))
        p = torch.exp(s - m[..., None])
        l = p.sum(-1)
        lses.append(m + torch.log(l))
        outs.append(torch.einsum("bhn,bhnd->bhd", p, v[:, :, keys]) / l[..., None])
    lse = torch.stack(lses)
    weights = torch.exp(lse - lse.amax(0))
    return sum(w[..., None] * o for w, o in zip(weights, outs)) / weights.sum(0)[..., None]


# %% grade_id: split_decode_attention | wrong: no max subtraction (overflows on large scores)
# expect: subtract each split's max
# replace:
#         m = scores.amax(dim=-1)
#         p = torch.exp(scores - m[..., None])
# with:
#         m = torch.zeros_like(scores[..., 0])          # no max subtracted
#         p = torch.exp(scores)


# %% grade_id: split_decode_attention | cheat: SDPA through an alias (no split at all)
# expect: is forbidden
def split_decode_attention(q, k, v, num_splits):
    attend = getattr(F, "scaled_dot_product" + "_attention")
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return attend(q[:, :, None], k, v)[:, :, 0]


# %% grade_id: split_decode_attention | cheat: flex_attention, torch's public attention that runs eagerly on CPU (no split at all)
# expect: which this exercise forbids
from torch.nn.attention.flex_attention import flex_attention


def split_decode_attention(q, k, v, num_splits):
    return flex_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0]


# %% grade_id: split_decode_attention | cheat: torch's private CPU flash kernel, by its top-level name (no split at all)
# expect: may not reach torch's internals
def split_decode_attention(q, k, v, num_splits):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return torch._scaled_dot_product_flash_attention_for_cpu(q[:, :, None], k, v)[0][:, :, 0]


# %% grade_id: split_decode_attention | cheat: imports the reference implementation
# expect: is not allowed
from reference.kernels.torch_reference import split_decode_attention  # noqa: F401


# %% grade_id: decode_partial_kernel | wrong: no rescaling of l and o when the max grows
# expect: not rescaled
# replace:
#         l_i = l_i * rescale + tl.sum(p, axis=0)
#         o_i = o_i * rescale + tl.sum(p[:, None] * v, axis=0)
# with:
#         l_i = l_i + tl.sum(p, axis=0)                   # old sums not rescaled
#         o_i = o_i + tl.sum(p[:, None] * v, axis=0)


# %% grade_id: decode_partial_kernel | wrong: K/V head h % Hkv (ignores GQA grouping)
# expect: h % Hkv
# replace:
#     kv_head = (row % n_q_heads) // (n_q_heads // n_kv_heads)
# with:
#     kv_head = (row % n_q_heads) % n_kv_heads


# %% grade_id: decode_partial_kernel | wrong: only full tiles (drops the split's tail)
# expect: last, partial tile was skipped
# replace:
#     for tile in range(start, end, BLOCK_N):
# with:
#     for tile in range(start, end - BLOCK_N + 1, BLOCK_N):


# %% grade_id: decode_partial_kernel | wrong: divides o by l in the kernel (NaN on empty splits)
# expect: o was divided by l
# replace:
#     tl.store(o_ptr + state * HEAD_DIM + dims, o_i)
# with:
#     tl.store(o_ptr + state * HEAD_DIM + dims, o_i / l_i)


# %% grade_id: decode_partial_kernel | cheat: not a kernel, a launcher that computes with torch
# expect: must be a @triton.jit kernel
class _Launcher:
    def __getitem__(self, grid):
        def run(q, k, v, m, l, o, n_q_heads, n_kv_heads, n_keys, chunk, num_splits, sm_scale, **meta):
            wide_k = k.repeat_interleave(n_q_heads // n_kv_heads, 1)
            wide_v = v.repeat_interleave(n_q_heads // n_kv_heads, 1)
            scores = torch.einsum("bhd,bhnd->bhn", q, wide_k) * sm_scale
            for s in range(num_splits):
                part = scores[..., s * chunk:(s + 1) * chunk]
                if part.shape[-1] == 0:
                    m[..., s], l[..., s], o[..., s, :] = float("-inf"), 0.0, 0.0
                    continue
                m[..., s] = part.amax(-1)
                p = torch.exp(part - m[..., s, None])
                l[..., s] = p.sum(-1)
                o[..., s, :] = torch.einsum("bhn,bhnd->bhd", p, wide_v[:, :, s * chunk:(s + 1) * chunk])
        return run


decode_partial_kernel = _Launcher()


# %% grade_id: decode_partial_kernel | cheat: imports the reference kernels
# expect: is not allowed
from reference.kernels.decode_attention import _split_kernel as decode_partial_kernel  # noqa: F401


# %% grade_id: decode_partial_kernel | wrong: a Python loop over single keys (correct but serial)
# expect: does not step one tile of BLOCK_N keys
# replace:
#     for tile in range(start, end, BLOCK_N):
#         keys = tile + tl.arange(0, BLOCK_N)
#         in_split = keys < end
#         offsets = kv_base + keys[:, None] * HEAD_DIM + dims[None, :]
#         k = tl.load(k_ptr + offsets, mask=in_split[:, None], other=0.0)
#         v = tl.load(v_ptr + offsets, mask=in_split[:, None], other=0.0)
#         scores = tl.where(in_split, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
#         m_new = tl.maximum(m_i, tl.max(scores, axis=0))
#         rescale = tl.exp(m_i - m_new)
#         p = tl.exp(scores - m_new)
#         l_i = l_i * rescale + tl.sum(p, axis=0)
#         o_i = o_i * rescale + tl.sum(p[:, None] * v, axis=0)
# with:
#     for key in range(start, end):
#         k = tl.load(k_ptr + kv_base + key * HEAD_DIM + dims)
#         v = tl.load(v_ptr + kv_base + key * HEAD_DIM + dims)
#         score = tl.sum(q * k, axis=0) * sm_scale
#         m_new = tl.maximum(m_i, score)
#         rescale = tl.exp(m_i - m_new)
#         p = tl.exp(score - m_new)
#         l_i = l_i * rescale + p
#         o_i = o_i * rescale + p * v


# %% grade_id: decode_partial_kernel | cheat: a loop over single keys whose step only mentions BLOCK_N (1 + 0 * BLOCK_N)
# expect: does not step one tile of BLOCK_N keys
# replace:
#     for tile in range(start, end, BLOCK_N):
#         keys = tile + tl.arange(0, BLOCK_N)
#         in_split = keys < end
#         offsets = kv_base + keys[:, None] * HEAD_DIM + dims[None, :]
#         k = tl.load(k_ptr + offsets, mask=in_split[:, None], other=0.0)
#         v = tl.load(v_ptr + offsets, mask=in_split[:, None], other=0.0)
#         scores = tl.where(in_split, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
#         m_new = tl.maximum(m_i, tl.max(scores, axis=0))
#         rescale = tl.exp(m_i - m_new)
#         p = tl.exp(scores - m_new)
#         l_i = l_i * rescale + tl.sum(p, axis=0)
#         o_i = o_i * rescale + tl.sum(p[:, None] * v, axis=0)
# with:
#     for key in range(start, end, 1 + 0 * BLOCK_N):
#         k = tl.load(k_ptr + kv_base + key * HEAD_DIM + dims)
#         v = tl.load(v_ptr + kv_base + key * HEAD_DIM + dims)
#         score = tl.sum(q * k, axis=0) * sm_scale
#         m_new = tl.maximum(m_i, score)
#         rescale = tl.exp(m_i - m_new)
#         p = tl.exp(score - m_new)
#         l_i = l_i * rescale + p
#         o_i = o_i * rescale + p * v
