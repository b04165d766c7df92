"""Known-wrong and cheating submissions for chapter 07 (see tests/grading/test_selfcheck.py).

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
#         return 1, "Turing: FA2 needs Ampere; FA1 runs here (and trains up to head dim 64)"
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
#         return 3, "Hopper: FlashAttention-3 was written for its TMA and WGMMA"
# with:
#         return 4, "Hopper: FlashAttention-4 runs on it too"


# %% grade_id: pick_flash | cheat: the right versions, and one reason that lists every generation
# expect: names 7 architecture generations
# expect score: 0
# replace:
#     generation = generations[name]
# with:
#     generation = generations[name]
#     version = pick_flash_version(generation, training, head_dim)[0]
#     return version, "Pascal, Volta, Turing, Ampere, Ada, Hopper or Blackwell: it depends"
#
#
# def pick_flash_version(generation, training, head_dim):


# %% grade_id: pick_flash | cheat: the right versions, and one template reason: the GPU's own generation, then every generation's deciding feature (it scored 3/3 when only generation names were counted)
# expect: states what decides the version on every other generation too
# expect score: 0
# replace:
#     generation = generations[name]
# with:
#     generation = generations[name]
#     version = pick_flash_version(generation, training, head_dim)[0]
#     return version, (f"{generation}: FA1 trains up to head dim 64, FA2 needs sm_80 or newer, "
#                      "FA3 is sm_90-only (TMA, WGMMA), FA4 targets tensor memory")
#
#
# def pick_flash_version(generation, training, head_dim):


# %% grade_id: pick_flash | cheat: the right versions, with a reason about FlashAttention in general
# expect: architecture generations
# expect score: 0
# replace:
#     generation = generations[name]
# with:
#     generation = generations[name]
#     version = pick_flash_version(generation, training, head_dim)[0]
#     return version, ("FlashAttention covers Blackwell, Hopper, Ada, Ampere and Turing (FA1 only), "
#                      "never Volta or Pascal")
#
#
# def pick_flash_version(generation, training, head_dim):


# %% grade_id: pick_flash | cheat: the right versions, each with a reason written from the version alone
# expect: a reason written from the version alone
# replace:
#     generation = generations[name]
# with:
#     generation = generations[name]
#     version = pick_flash_version(generation, training, head_dim)[0]
#     return version, {0: "Pascal, Volta or Turing: no FlashAttention version runs this case",
#                      1: "Turing: FA2 needs Ampere, so FA1 (it trains up to head dim 64)",
#                      2: "Ampere or Ada: FA2 is the newest that runs; FA3 is Hopper-only",
#                      3: "Hopper: FA3 is the newest that runs, built on its TMA and WGMMA",
#                      4: "Blackwell: FA4 is the newest, built on its tensor memory"}[version]
#
#
# def pick_flash_version(generation, training, head_dim):


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


# %% grade_id: decode_split | wrong: divides o by l (the merge needs the unnormalised sum)
# expect: o was divided by l
# replace:
#     return m, p.sum(dim=-1), torch.einsum("bhn,bhnd->bhd", p, v)
# with:
#     return m, p.sum(dim=-1), torch.einsum("bhn,bhnd->bhd", p, v) / p.sum(dim=-1)[..., None]


# %% grade_id: decode_split | wrong: repeat() instead of repeat_interleave (wrong K/V head)
# expect: h // (Hq // Hkv)
# replace:
#     k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
# with:
#     k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)


# %% grade_id: decode_split | wrong: exp(x) without subtracting the split's max
# expect: not exp(x_j - m)
# replace:
#     p = torch.exp(scores - m[..., None])
# with:
#     p = torch.exp(scores)


# %% grade_id: decode_split | wrong: no special case for a split without keys (amax of nothing)
# expect: return the empty state
# replace:
#     if k.shape[2] == 0:                               # no keys: the empty state
#         m = q.new_full(q.shape[:2], float("-inf"))
#         return m, torch.zeros_like(m), torch.zeros_like(q)
# with:


# %% grade_id: decode_split | wrong: forgets the 1/sqrt(D) scale
# expect: were not scaled
# replace:
#     scores = torch.einsum("bhd,bhnd->bhn", q, k) / math.sqrt(q.shape[-1])
# with:
#     scores = torch.einsum("bhd,bhnd->bhn", q, k)


# %% grade_id: decode_split | cheat: SDPA on the split, scaled back by l
# expect: which this exercise forbids
def decode_split(q, k, v):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if k.shape[2] == 0:
        m = q.new_full(q.shape[:2], float("-inf"))
        return m, torch.zeros_like(m), torch.zeros_like(q)
    scores = torch.einsum("bhd,bhnd->bhn", q, k) / math.sqrt(q.shape[-1])
    m = scores.amax(-1)
    l = torch.exp(scores - m[..., None]).sum(-1)
    out = F.scaled_dot_product_attention(q[:, :, None], k, v)[:, :, 0]
    return m, l, out * l[..., None]


# %% grade_id: decode_split | cheat: torch.logsumexp gives l, exp(x - lse) the weights (no exponentials of its own)
# expect: logsumexp
# expect score: 0
def decode_split(q, k, v):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if k.shape[2] == 0:
        m = q.new_full(q.shape[:2], float("-inf"))
        return m, torch.zeros_like(m), torch.zeros_like(q)
    scores = torch.einsum("bhd,bhnd->bhn", q, k) / math.sqrt(q.shape[-1])
    m, lse = scores.amax(-1), torch.logsumexp(scores, -1)
    l = torch.exp(lse - m)
    return m, l, torch.einsum("bhn,bhnd->bhd", torch.exp(scores - lse[..., None]), v) * l[..., None]


# %% grade_id: decode_split | cheat: F.cross_entropy(x, 0) + x[0] is logsumexp(x), under another name
# expect: cross_entropy
# expect score: 0
def decode_split(q, k, v):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if k.shape[2] == 0:
        m = q.new_full(q.shape[:2], float("-inf"))
        return m, torch.zeros_like(m), torch.zeros_like(q)
    scores = torch.einsum("bhd,bhnd->bhn", q, k) / math.sqrt(q.shape[-1])
    flat = scores.reshape(-1, scores.shape[-1])
    zeros = torch.zeros(len(flat), dtype=torch.long)
    lse = (F.cross_entropy(flat, zeros, reduction="none") + flat[:, 0]).reshape(scores.shape[:-1])
    m = scores.amax(-1)
    l = torch.exp(lse - m)
    return m, l, torch.einsum("bhn,bhnd->bhd", torch.exp(scores - lse[..., None]), v) * l[..., None]


# %% grade_id: decode_split | cheat: probabilities from torch.special.log_softmax, rescaled by l
# expect: log_softmax
# expect score: 0
def decode_split(q, k, v):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if k.shape[2] == 0:
        m = q.new_full(q.shape[:2], float("-inf"))
        return m, torch.zeros_like(m), torch.zeros_like(q)
    scores = torch.einsum("bhd,bhnd->bhn", q, k) / math.sqrt(q.shape[-1])
    m = scores.amax(-1)
    l = 1 / torch.special.log_softmax(scores, -1).amax(-1).exp()
    return m, l, torch.einsum("bhn,bhnd->bhd", torch.special.log_softmax(scores, -1).exp(), v) * l[..., None]


# %% grade_id: decode_split | cheat: imports the reference implementation
# expect: is not allowed
from reference.kernels.torch_reference import merge_softmax_states as decode_split  # noqa: F401


# %% grade_id: merge_splits | wrong: adds the partial states without rescaling
# expect: without rescaling
# replace:
#     weight = torch.exp(m - m_all)                     # exp(m_s - M): 0 for an empty split
# with:
#     weight = torch.ones_like(m)                       # no exp(m_s - M)


# %% grade_id: merge_splits | wrong: averages the splits' outputs
# expect: normalised outputs were averaged
# replace:
#     l_all = (weight * l).sum(dim=-1)
#     o_all = (weight[..., None] * o).sum(dim=-2)
#     return o_all / l_all[..., None]
# with:
#     return (o / l[..., None]).mean(dim=-2)


# %% grade_id: merge_splits | wrong: exp(m_s) without subtracting M (overflows)
# expect: overflows
# replace:
#     weight = torch.exp(m - m_all)                     # exp(m_s - M): 0 for an empty split
# with:
#     weight = torch.exp(m)


# %% grade_id: merge_splits | wrong: weights each o_s / l_s by exp(m_s - M) alone
# expect: weighted by exp(m_s - M) alone
# replace:
#     l_all = (weight * l).sum(dim=-1)
#     o_all = (weight[..., None] * o).sum(dim=-2)
#     return o_all / l_all[..., None]
# with:
#     return (weight[..., None] * o / l[..., None]).sum(dim=-2) / weight.sum(dim=-1)[..., None]


# %% grade_id: merge_splits | wrong: log-sum-exp merge of normalised outputs; empty split gives 0/0
# expect: o_s / l_s is 0/0
def merge_splits(m, l, o):
    lse = m + torch.log(l)
    weight = torch.exp(lse - lse.amax(-1, keepdim=True))
    return (weight[..., None] * o / l[..., None]).sum(-2) / weight.sum(-1)[..., None]


# %% grade_id: merge_splits | cheat: weights from torch.logsumexp of m + log l (no rescale of its own)
# expect: logsumexp
# expect score: 0
def merge_splits(m, l, o):
    lse = m + torch.log(l)
    weight = torch.exp(lse - torch.logsumexp(lse, -1, keepdim=True))
    return (weight[..., None] * torch.nan_to_num(o / l[..., None])).sum(-2)


# %% grade_id: merge_splits | cheat: weights from F.softmin of -(m + log l)
# expect: softmin
# expect score: 0
def merge_splits(m, l, o):
    weight = F.softmin(-(m + torch.log(l)), dim=-1)
    return (weight[..., None] * torch.nan_to_num(o / l[..., None])).sum(-2)


# %% grade_id: merge_splits | cheat: the log-sum-exp of m + log l through F.cross_entropy
# expect: cross_entropy
# expect score: 0
def merge_splits(m, l, o):
    lse = m + torch.log(l)
    flat = lse.reshape(-1, lse.shape[-1])
    zeros = torch.zeros(len(flat), dtype=torch.long)
    total = (F.cross_entropy(flat, zeros, reduction="none") + flat[:, 0]).reshape(lse.shape[:-1])
    weight = torch.exp(lse - total[..., None])
    return (weight[..., None] * torch.nan_to_num(o / l[..., None])).sum(-2)


# %% grade_id: merge_splits | cheat: imports the reference merge
# expect: is not allowed
from reference.kernels.torch_reference import merge_softmax_states as merge_splits  # noqa: F401


# %% grade_id: decode_partial_kernel | wrong: no rescaling of l and o when the max grows
# expect: not rescaled
# replace:
#         l_i = l_i * rescale + tl.sum(p, axis=0)
#         o_i = o_i * rescale + tl.sum(p[:, None] * v, axis=0)
# with:
#         l_i = l_i + tl.sum(p, axis=0)                   # old sums not rescaled
#         o_i = o_i + tl.sum(p[:, None] * v, axis=0)


# %% grade_id: decode_partial_kernel | wrong: no running max: sums exp of the raw scores and scales them back by exp(-m) at the end (right until a score passes ~88)
# expect: exp of a raw score above ~88 overflows float32
# replace:
#         rescale = tl.exp(m_i - m_new)
#         p = tl.exp(scores - m_new)
#         l_i = l_i * rescale + tl.sum(p, axis=0)
#         o_i = o_i * rescale + tl.sum(p[:, None] * v, axis=0)
#         m_i = m_new
#     state = row * num_splits + split
# with:
#         p = tl.exp(scores)                              # raw exponentials, no max
#         l_i = l_i + tl.sum(p, axis=0)
#         o_i = o_i + tl.sum(p[:, None] * v, axis=0)
#         m_i = m_new
#     back = tl.where(m_i == float("-inf"), 0.0, tl.exp(-m_i))
#     l_i = l_i * back
#     o_i = o_i * back
#     state = row * num_splits + split


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


# %% grade_id: decode_partial_kernel | wrong: masked lanes scored 0 instead of -inf
# expect: scored 0, not -inf
# replace:
#         scores = tl.where(in_split, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
# with:
#         scores = tl.sum(q[None, :] * k, axis=1) * sm_scale    # masked keys were loaded as 0


# %% grade_id: decode_partial_kernel | wrong: masks with n_keys, so a split's last tile reads the next split
# expect: read on into the next split's keys
# replace:
#         in_split = keys < end
# with:
#         in_split = keys < n_keys


# %% grade_id: decode_partial_kernel | cheat: one fixed tile of 128 keys, no loop (covers every split a grader used to draw)
# expect: is a tile whose size the cell fixes
# expect score: 0
import triton
import triton.language as tl


@triton.jit
def decode_partial_kernel(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, o_ptr,
                          n_q_heads, n_kv_heads, n_keys, chunk, num_splits, sm_scale,
                          HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    batch = row // n_q_heads
    kv_head = (row % n_q_heads) // (n_q_heads // n_kv_heads)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + row * HEAD_DIM + dims)
    kv_base = (batch * n_kv_heads + kv_head).to(tl.int64) * n_keys * HEAD_DIM
    start = split * chunk
    end = tl.minimum(start + chunk, n_keys)
    keys = start + tl.arange(0, 128)
    in_split = keys < end
    offsets = kv_base + keys[:, None] * HEAD_DIM + dims[None, :]
    k = tl.load(k_ptr + offsets, mask=in_split[:, None], other=0.0)
    v = tl.load(v_ptr + offsets, mask=in_split[:, None], other=0.0)
    scores = tl.where(in_split, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
    m_i = tl.max(scores, axis=0)
    p = tl.where(in_split, tl.exp(scores - m_i), 0.0)
    state = row * num_splits + split
    tl.store(m_ptr + state, m_i)
    tl.store(l_ptr + state, tl.sum(p, axis=0))
    tl.store(o_ptr + state * HEAD_DIM + dims, tl.sum(p[:, None] * v, axis=0))


# %% grade_id: decode_partial_kernel | cheat: two passes over the tiles (the max, then the sums), no running rescale
# expect: your kernel read K 2.00 times per split
# expect score: 0
import triton
import triton.language as tl


@triton.jit
def decode_partial_kernel(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, o_ptr,
                          n_q_heads, n_kv_heads, n_keys, chunk, num_splits, sm_scale,
                          HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    batch = row // n_q_heads
    kv_head = (row % n_q_heads) // (n_q_heads // n_kv_heads)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + row * HEAD_DIM + dims)
    kv_base = (batch * n_kv_heads + kv_head).to(tl.int64) * n_keys * HEAD_DIM
    start = split * chunk
    end = tl.minimum(start + chunk, n_keys)
    m_i = float("-inf")
    for tile in range(start, end, BLOCK_N):
        keys = tile + tl.arange(0, BLOCK_N)
        in_split = keys < end
        k = tl.load(k_ptr + kv_base + keys[:, None] * HEAD_DIM + dims[None, :],
                    mask=in_split[:, None], other=0.0)
        scores = tl.where(in_split, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
        m_i = tl.maximum(m_i, tl.max(scores, axis=0))
    l_i = 0.0
    o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for tile in range(start, end, BLOCK_N):
        keys = tile + tl.arange(0, BLOCK_N)
        in_split = keys < end
        offsets = kv_base + keys[:, None] * HEAD_DIM + dims[None, :]
        k = tl.load(k_ptr + offsets, mask=in_split[:, None], other=0.0)
        v = tl.load(v_ptr + offsets, mask=in_split[:, None], other=0.0)
        scores = tl.where(in_split, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
        p = tl.exp(scores - m_i)
        l_i = l_i + tl.sum(p, axis=0)
        o_i = o_i + tl.sum(p[:, None] * v, axis=0)
    state = row * num_splits + split
    tl.store(m_ptr + state, m_i)
    tl.store(l_ptr + state, l_i)
    tl.store(o_ptr + state * HEAD_DIM + dims, o_i)


# %% grade_id: decode_partial_kernel | cheat: two passes in ONE loop over twice the split (max on the first lap, sums on the second)
# expect: your kernel read K 2.00 times per split
# expect score: 0
import triton
import triton.language as tl


@triton.jit
def decode_partial_kernel(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, o_ptr,
                          n_q_heads, n_kv_heads, n_keys, chunk, num_splits, sm_scale,
                          HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    batch = row // n_q_heads
    kv_head = (row % n_q_heads) // (n_q_heads // n_kv_heads)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + row * HEAD_DIM + dims)
    kv_base = (batch * n_kv_heads + kv_head).to(tl.int64) * n_keys * HEAD_DIM
    start = split * chunk
    end = tl.minimum(start + chunk, n_keys)
    laps = tl.cdiv(end - start, BLOCK_N) * BLOCK_N
    m_i = float("-inf")
    l_i = 0.0
    o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for step in range(start, start + 2 * laps, BLOCK_N):
        second = step >= start + laps
        tile = tl.where(second, step - laps, step)
        keys = tile + tl.arange(0, BLOCK_N)
        in_split = keys < end
        offsets = kv_base + keys[:, None] * HEAD_DIM + dims[None, :]
        k = tl.load(k_ptr + offsets, mask=in_split[:, None], other=0.0)
        v = tl.load(v_ptr + offsets, mask=in_split[:, None], other=0.0)
        scores = tl.where(in_split, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
        m_i = tl.where(second, m_i, tl.maximum(m_i, tl.max(scores, axis=0)))
        p = tl.where(second, tl.exp(scores - m_i), 0.0)
        l_i = l_i + tl.sum(p, axis=0)
        o_i = o_i + tl.sum(p[:, None] * v, axis=0)
    state = row * num_splits + split
    tl.store(m_ptr + state, m_i)
    tl.store(l_ptr + state, l_i)
    tl.store(o_ptr + state * HEAD_DIM + dims, o_i)


# %% grade_id: decode_partial_kernel | cheat: a tile of BLOCK_N * BLOCK_N keys built from two BLOCK_N aranges, in a loop of one lap
# expect: one load of K brought in
# expect score: 0
import triton
import triton.language as tl


@triton.jit
def decode_partial_kernel(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, o_ptr,
                          n_q_heads, n_kv_heads, n_keys, chunk, num_splits, sm_scale,
                          HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    batch = row // n_q_heads
    kv_head = (row % n_q_heads) // (n_q_heads // n_kv_heads)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + row * HEAD_DIM + dims)
    kv_base = (batch * n_kv_heads + kv_head).to(tl.int64) * n_keys * HEAD_DIM
    start = split * chunk
    end = tl.minimum(start + chunk, n_keys)
    lanes = tl.reshape(tl.arange(0, BLOCK_N)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :],
                       [BLOCK_N * BLOCK_N])
    m_i = float("-inf")
    l_i = 0.0
    o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for tile in range(start, start + 1, BLOCK_N):
        keys = tile + lanes
        in_split = keys < end
        offsets = kv_base + keys[:, None] * HEAD_DIM + dims[None, :]
        k = tl.load(k_ptr + offsets, mask=in_split[:, None], other=0.0)
        v = tl.load(v_ptr + offsets, mask=in_split[:, None], other=0.0)
        scores = tl.where(in_split, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
        m_i = tl.max(scores, axis=0)
        p = tl.exp(scores - m_i)
        l_i = tl.sum(p, axis=0)
        o_i = tl.sum(p[:, None] * v, axis=0)
    state = row * num_splits + split
    tl.store(m_ptr + state, m_i)
    tl.store(l_ptr + state, l_i)
    tl.store(o_ptr + state * HEAD_DIM + dims, o_i)


# %% grade_id: decode_partial_kernel | cheat: two passes in ONE loop, with a fake running rescale l * exp(m - m) that looks like the online softmax's
# expect: your kernel read K 2.00 times per split; one pass with a running max reads it once
# expect score: 0
import triton
import triton.language as tl


@triton.jit
def decode_partial_kernel(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, o_ptr,
                          n_q_heads, n_kv_heads, n_keys, chunk, num_splits, sm_scale,
                          HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    batch = row // n_q_heads
    kv_head = (row % n_q_heads) // (n_q_heads // n_kv_heads)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + row * HEAD_DIM + dims)
    kv_base = (batch * n_kv_heads + kv_head).to(tl.int64) * n_keys * HEAD_DIM
    start = split * chunk
    end = tl.minimum(start + chunk, n_keys)
    laps = tl.cdiv(end - start, BLOCK_N) * BLOCK_N
    m_i = float("-inf")
    l_i = 0.0
    o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for step in range(start, start + 2 * laps, BLOCK_N):
        second = step >= start + laps
        tile = tl.where(second, step - laps, step)
        keys = tile + tl.arange(0, BLOCK_N)
        in_split = keys < end
        offsets = kv_base + keys[:, None] * HEAD_DIM + dims[None, :]
        k = tl.load(k_ptr + offsets, mask=in_split[:, None], other=0.0)
        v = tl.load(v_ptr + offsets, mask=in_split[:, None], other=0.0)
        scores = tl.where(in_split, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
        m_new = tl.where(second, m_i, tl.maximum(m_i, tl.max(scores, axis=0)))
        rescale = tl.exp(m_new - m_new)                     # always 1: looks like exp(m_old - m_new)
        p = tl.where(second, tl.exp(scores - m_new), 0.0)
        l_i = l_i * rescale + tl.sum(p, axis=0)
        o_i = o_i * rescale + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    state = row * num_splits + split
    tl.store(m_ptr + state, m_i)
    tl.store(l_ptr + state, l_i)
    tl.store(o_ptr + state * HEAD_DIM + dims, o_i)


# %% grade_id: decode_partial_kernel | cheat: the first pass reads K through tl.atomic_add(ptr, 0.0), a load that is no tl.load
# expect: your kernel read K 2.00 times per split
# expect score: 0
# replace:
#     m_i = float("-inf")
#     l_i = 0.0
#     o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
#     for tile in range(start, end, BLOCK_N):
# with:
#     m_i = float("-inf")
#     for tile in range(start, end, BLOCK_N):
#         keys = tile + tl.arange(0, BLOCK_N)
#         in_split = keys < end
#         k = tl.atomic_add(k_ptr + kv_base + keys[:, None] * HEAD_DIM + dims[None, :], 0.0,
#                           mask=in_split[:, None])
#         scores = tl.where(in_split, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
#         m_i = tl.maximum(m_i, tl.max(scores, axis=0))
#     l_i = 0.0
#     o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
#     for tile in range(start, end, BLOCK_N):


# %% grade_id: decode_split | cheat: the log-sum-exp folded with torch.logaddexp (an operation this exercise refuses), inside a tensor subclass's __torch_dispatch__ where the recorder is set aside
# expect: a tensor subclass with its own __torch_dispatch__
# expect score: 0
import math

import torch

JOB = {}


class Quiet(torch.Tensor):
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        scores = JOB["scores"]
        lse = scores[..., 0]
        for j in range(1, scores.shape[-1]):
            lse = torch.logaddexp(lse, scores[..., j])
        JOB["lse"] = lse
        return torch.zeros(())


def decode_split(q, k, v):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if k.shape[2] == 0:
        m = q.new_full(q.shape[:2], float("-inf"))
        return m, torch.zeros_like(m), torch.zeros_like(q)
    scores = torch.einsum("bhd,bhnd->bhn", q, k) / math.sqrt(q.shape[-1])
    JOB["scores"] = scores
    torch.zeros(1).as_subclass(Quiet) + 0
    lse, m = JOB["lse"], scores.amax(-1)
    l = torch.exp(lse - m)
    return m, l, torch.einsum("bhn,bhnd->bhd", torch.exp(scores - lse[..., None]), v) * l[..., None]


# %% grade_id: decode_split | wrong: exp(x) without subtracting the split's max, in float64 (which overflows only above ~709), then measured from m
# expect: subtract the split's max m before exp
# replace:
#     p = torch.exp(scores - m[..., None])
#     return m, p.sum(dim=-1), torch.einsum("bhn,bhnd->bhd", p, v)
# with:
#     p = torch.exp(scores.double())                    # float64: room for exp(x)
#     back = torch.exp(-m.double())[..., None]
#     o = torch.einsum("bhn,bhnd->bhd", p, v.double())
#     return m, (p.sum(dim=-1) * back[..., 0]).to(q.dtype), (o * back).to(q.dtype)


# %% grade_id: merge_splits | wrong: exp(m_s) without subtracting M, in float64 (which overflows only above ~709)
# expect: overflows
# replace:
#     weight = torch.exp(m - m_all)                     # exp(m_s - M): 0 for an empty split
#     l_all = (weight * l).sum(dim=-1)
#     o_all = (weight[..., None] * o).sum(dim=-2)
#     return o_all / l_all[..., None]
# with:
#     weight = torch.exp(m.double())                    # float64: room for exp(m_s)
#     l_all = (weight * l.double()).sum(dim=-1)
#     o_all = (weight[..., None] * o.double()).sum(dim=-2)
#     return (o_all / l_all[..., None]).to(o.dtype)


# %% grade_id: merge_splits | wrong: weights by exp(m_s - m_1), the first split's max, not M = max_s m_s (float64)
# expect: weight by exp(m_s - M)
# replace:
#     weight = torch.exp(m - m_all)                     # exp(m_s - M): 0 for an empty split
#     l_all = (weight * l).sum(dim=-1)
#     o_all = (weight[..., None] * o).sum(dim=-2)
#     return o_all / l_all[..., None]
# with:
#     first = m[..., :1].double()
#     first = torch.where(torch.isinf(first), torch.zeros_like(first), first)
#     weight = torch.exp(m.double() - first)            # the first split's max: no pass for M
#     l_all = (weight * l.double()).sum(dim=-1)
#     o_all = (weight[..., None] * o.double()).sum(dim=-2)
#     return (o_all / l_all[..., None]).to(o.dtype)


# %% grade_id: decode_partial_kernel | wrong: no running max, exp of the raw scores in float64, scaled back by exp(-m) at the end (right while every score stays under ~709: it passed a large case whose scores reached the hundreds)
# expect: ~709 in float64
# replace:
#     l_i = 0.0
#     o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
# with:
#     l_i = tl.zeros([], dtype=tl.float64)
#     o_i = tl.zeros([HEAD_DIM], dtype=tl.float64)
# replace:
#         rescale = tl.exp(m_i - m_new)
#         p = tl.exp(scores - m_new)
#         l_i = l_i * rescale + tl.sum(p, axis=0)
#         o_i = o_i * rescale + tl.sum(p[:, None] * v, axis=0)
#         m_i = m_new
#     state = row * num_splits + split
#     tl.store(m_ptr + state, m_i)
#     tl.store(l_ptr + state, l_i)
#     tl.store(o_ptr + state * HEAD_DIM + dims, o_i)
# with:
#         p = tl.exp(scores.to(tl.float64))               # no max: float64 holds it
#         l_i = l_i + tl.sum(p, axis=0)
#         o_i = o_i + tl.sum(p[:, None] * v.to(tl.float64), axis=0)
#         m_i = m_new
#     back = tl.where(m_i == float("-inf"), 0.0, tl.exp(-m_i.to(tl.float64)))
#     state = row * num_splits + split
#     tl.store(m_ptr + state, m_i)
#     tl.store(l_ptr + state, (l_i * back).to(tl.float32))
#     tl.store(o_ptr + state * HEAD_DIM + dims, (o_i * back).to(tl.float32))
