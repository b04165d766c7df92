"""Known-wrong and cheating submissions for chapter 07 (see tests/test_selfcheck.py).

Each section is the body of one solution cell; none may earn the exercise's full points.
"""

# %% grade_id: pick_flash | wrong: the "anything older gets FA2" rule of thumb
# expect: no FlashAttention version supports it
def pick_flash(gpu, training, head_dim=64):
    name = gpu.strip().upper()
    if name in ("B200", "GB200"):
        return 4, "Blackwell"
    if name in ("H100", "H200", "H800"):
        return 3, "Hopper"
    if name in ("A100", "A10", "A6000", "RTX 3090", "L4", "L40S", "RTX 4090"):
        return 2, "Ampere or Ada"
    if name in ("T4", "RTX 2080", "V100", "P100"):
        return 2, "Turing, Volta, Pascal: safe default"
    raise ValueError(f"unknown GPU {gpu!r}")


# %% grade_id: pick_flash | wrong: ignores training (FA1 cannot train head dim 128 on Turing)
# expect: backward above head dim 64
def pick_flash(gpu, training, head_dim=64):
    generations = {"P100": "Pascal", "V100": "Volta", "T4": "Turing", "RTX 2080": "Turing",
                   "A100": "Ampere", "A10": "Ampere", "A6000": "Ampere", "RTX 3090": "Ampere",
                   "L4": "Ada", "L40S": "Ada", "RTX 4090": "Ada",
                   "H100": "Hopper", "H200": "Hopper", "H800": "Hopper",
                   "B200": "Blackwell", "GB200": "Blackwell"}
    if not isinstance(gpu, str) or gpu.strip().upper() not in generations:
        raise ValueError(f"unknown GPU {gpu!r}")
    if not isinstance(training, bool):
        raise TypeError("training must be a bool")
    if not (isinstance(head_dim, int) and 8 <= head_dim <= 128 and head_dim % 8 == 0):
        raise ValueError("bad head_dim")
    generation = generations[gpu.strip().upper()]
    version = {"Pascal": 0, "Volta": 0, "Turing": 1, "Ampere": 2, "Ada": 2, "Hopper": 3,
               "Blackwell": 4}[generation]
    return version, f"{generation} GPU"


# %% grade_id: pick_flash | wrong: FA4 on Hopper, since FA4 also runs there
# expect: Hopper: FlashAttention-3
def pick_flash(gpu, training, head_dim=64):
    name = gpu.strip().upper()
    if name in ("B200", "GB200", "H100", "H200", "H800"):
        return 4, "Hopper or Blackwell: FA4 runs on both"
    if name in ("A100", "A10", "A6000", "RTX 3090"):
        return 2, "Ampere"
    if name in ("L4", "L40S", "RTX 4090"):
        return 2, "Ada"
    if name in ("T4", "RTX 2080"):
        return (0 if training and head_dim > 64 else 1), "Turing"
    if name in ("V100", "P100"):
        return 0, "Volta or Pascal"
    raise ValueError(f"unknown GPU {gpu!r}")


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
def split_decode_attention(q, k, v, num_splits):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    chunk = -(-k.shape[2] // num_splits)
    l_all, o_all = q.new_zeros(q.shape[:2]), torch.zeros_like(q)
    for start in range(0, k.shape[2], chunk):
        s = torch.einsum("bhd,bhnd->bhn", q, k[:, :, start:start + chunk]) / math.sqrt(q.shape[-1])
        p = torch.exp(s - s.amax(-1, keepdim=True))
        l_all = l_all + p.sum(-1)
        o_all = o_all + torch.einsum("bhn,bhnd->bhd", p, v[:, :, start:start + chunk])
    return o_all / l_all[..., None]


# %% grade_id: split_decode_attention | wrong: averages the splits' outputs
# expect: normalised outputs were averaged
def split_decode_attention(q, k, v, num_splits):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    chunk = -(-k.shape[2] // num_splits)
    outs = []
    for start in range(0, k.shape[2], chunk):
        s = torch.einsum("bhd,bhnd->bhn", q, k[:, :, start:start + chunk]) / math.sqrt(q.shape[-1])
        p = torch.exp(s - s.amax(-1, keepdim=True))
        outs.append(torch.einsum("bhn,bhnd->bhd", p / p.sum(-1, keepdim=True), v[:, :, start:start + chunk]))
    return sum(outs) / len(outs)


# %% grade_id: split_decode_attention | wrong: repeat() instead of repeat_interleave (wrong K/V head)
# expect: h // (Hq // Hkv)
def split_decode_attention(q, k, v, num_splits):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    chunk = -(-k.shape[2] // num_splits)
    m_all = q.new_full(q.shape[:2], float("-inf"))
    l_all, o_all = q.new_zeros(q.shape[:2]), torch.zeros_like(q)
    for start in range(0, k.shape[2], chunk):
        s = torch.einsum("bhd,bhnd->bhn", q, k[:, :, start:start + chunk]) / math.sqrt(q.shape[-1])
        m = torch.maximum(m_all, s.amax(-1))
        p = torch.exp(s - m[..., None])
        scale = torch.exp(m_all - m)
        l_all = l_all * scale + p.sum(-1)
        o_all = o_all * scale[..., None] + torch.einsum("bhn,bhnd->bhd", p, v[:, :, start:start + chunk])
        m_all = m
    return o_all / l_all[..., None]


# %% grade_id: split_decode_attention | wrong: chunk = N // num_splits drops the tail
# expect: keys were dropped
def split_decode_attention(q, k, v, num_splits):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    chunk = k.shape[2] // num_splits
    m_all = q.new_full(q.shape[:2], float("-inf"))
    l_all, o_all = q.new_zeros(q.shape[:2]), torch.zeros_like(q)
    for split in range(num_splits):
        keys = slice(split * chunk, (split + 1) * chunk)
        s = torch.einsum("bhd,bhnd->bhn", q, k[:, :, keys]) / math.sqrt(q.shape[-1])
        if s.shape[-1] == 0:
            continue
        m = torch.maximum(m_all, s.amax(-1))
        p = torch.exp(s - m[..., None])
        scale = torch.exp(m_all - m)
        l_all = l_all * scale + p.sum(-1)
        o_all = o_all * scale[..., None] + torch.einsum("bhn,bhnd->bhd", p, v[:, :, keys])
        m_all = m
    return o_all / l_all[..., None]


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
def split_decode_attention(q, k, v, num_splits):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    chunk = -(-k.shape[2] // num_splits)
    l_all, o_all = q.new_zeros(q.shape[:2]), torch.zeros_like(q)
    for start in range(0, k.shape[2], chunk):
        p = torch.exp(torch.einsum("bhd,bhnd->bhn", q, k[:, :, start:start + chunk]) / math.sqrt(q.shape[-1]))
        l_all = l_all + p.sum(-1)
        o_all = o_all + torch.einsum("bhn,bhnd->bhd", p, v[:, :, start:start + chunk])
    return o_all / l_all[..., None]


# %% grade_id: split_decode_attention | cheat: SDPA through an alias (no split at all)
# expect: is forbidden
def split_decode_attention(q, k, v, num_splits):
    attend = getattr(F, "scaled_dot_product" + "_attention")
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return attend(q[:, :, None], k, v)[:, :, 0]


# %% grade_id: split_decode_attention | cheat: imports the reference implementation
# expect: is not allowed
from reference.kernels.torch_reference import split_decode_attention  # noqa: F401


# %% grade_id: decode_partial_kernel | wrong: no rescaling of l and o when the max grows
# expect: not rescaled
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
    kv_base = (batch * n_kv_heads + kv_head) * n_keys * HEAD_DIM
    start = split * chunk
    end = tl.minimum(start + chunk, n_keys)
    m_i = float("-inf")
    l_i = 0.0
    o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for tile in range(start, end, BLOCK_N):
        keys = tile + tl.arange(0, BLOCK_N)
        ok = keys < end
        offsets = kv_base + keys[:, None] * HEAD_DIM + dims[None, :]
        k = tl.load(k_ptr + offsets, mask=ok[:, None], other=0.0)
        v = tl.load(v_ptr + offsets, mask=ok[:, None], other=0.0)
        scores = tl.where(ok, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
        m_i = tl.maximum(m_i, tl.max(scores, axis=0))
        p = tl.exp(scores - m_i)
        l_i = l_i + tl.sum(p, axis=0)
        o_i = o_i + tl.sum(p[:, None] * v, axis=0)
    tl.store(m_ptr + row * num_splits + split, m_i)
    tl.store(l_ptr + row * num_splits + split, l_i)
    tl.store(o_ptr + (row * num_splits + split) * HEAD_DIM + dims, o_i)


# %% grade_id: decode_partial_kernel | wrong: K/V head h % Hkv (ignores GQA grouping)
# expect: h % Hkv
import triton
import triton.language as tl


@triton.jit
def decode_partial_kernel(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, o_ptr,
                          n_q_heads, n_kv_heads, n_keys, chunk, num_splits, sm_scale,
                          HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    batch = row // n_q_heads
    kv_head = (row % n_q_heads) % n_kv_heads
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + row * HEAD_DIM + dims)
    kv_base = (batch * n_kv_heads + kv_head) * n_keys * HEAD_DIM
    start = split * chunk
    end = tl.minimum(start + chunk, n_keys)
    m_i = float("-inf")
    l_i = 0.0
    o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for tile in range(start, end, BLOCK_N):
        keys = tile + tl.arange(0, BLOCK_N)
        ok = keys < end
        offsets = kv_base + keys[:, None] * HEAD_DIM + dims[None, :]
        k = tl.load(k_ptr + offsets, mask=ok[:, None], other=0.0)
        v = tl.load(v_ptr + offsets, mask=ok[:, None], other=0.0)
        scores = tl.where(ok, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        o_i = o_i * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    tl.store(m_ptr + row * num_splits + split, m_i)
    tl.store(l_ptr + row * num_splits + split, l_i)
    tl.store(o_ptr + (row * num_splits + split) * HEAD_DIM + dims, o_i)


# %% grade_id: decode_partial_kernel | wrong: only full tiles (drops the split's tail)
# expect: last, partial tile was skipped
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
    kv_base = (batch * n_kv_heads + kv_head) * n_keys * HEAD_DIM
    start = split * chunk
    end = tl.minimum(start + chunk, n_keys)
    m_i = float("-inf")
    l_i = 0.0
    o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for tile in range(start, end - BLOCK_N + 1, BLOCK_N):
        offsets = kv_base + (tile + tl.arange(0, BLOCK_N))[:, None] * HEAD_DIM + dims[None, :]
        k = tl.load(k_ptr + offsets)
        v = tl.load(v_ptr + offsets)
        scores = tl.sum(q[None, :] * k, axis=1) * sm_scale
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        o_i = o_i * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    tl.store(m_ptr + row * num_splits + split, m_i)
    tl.store(l_ptr + row * num_splits + split, l_i)
    tl.store(o_ptr + (row * num_splits + split) * HEAD_DIM + dims, o_i)


# %% grade_id: decode_partial_kernel | wrong: divides o by l in the kernel (NaN on empty splits)
# expect: o was divided by l
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
    kv_base = (batch * n_kv_heads + kv_head) * n_keys * HEAD_DIM
    start = split * chunk
    end = tl.minimum(start + chunk, n_keys)
    m_i = float("-inf")
    l_i = 0.0
    o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for tile in range(start, end, BLOCK_N):
        keys = tile + tl.arange(0, BLOCK_N)
        ok = keys < end
        offsets = kv_base + keys[:, None] * HEAD_DIM + dims[None, :]
        k = tl.load(k_ptr + offsets, mask=ok[:, None], other=0.0)
        v = tl.load(v_ptr + offsets, mask=ok[:, None], other=0.0)
        scores = tl.where(ok, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        o_i = o_i * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    tl.store(m_ptr + row * num_splits + split, m_i)
    tl.store(l_ptr + row * num_splits + split, l_i)
    tl.store(o_ptr + (row * num_splits + split) * HEAD_DIM + dims, o_i / l_i)


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
    kv_base = (batch * n_kv_heads + kv_head) * n_keys * HEAD_DIM
    start = split * chunk
    end = tl.minimum(start + chunk, n_keys)
    m_i = float("-inf")
    l_i = 0.0
    o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for key in range(start, end):
        k = tl.load(k_ptr + kv_base + key * HEAD_DIM + dims)
        v = tl.load(v_ptr + kv_base + key * HEAD_DIM + dims)
        score = tl.sum(q * k, axis=0) * sm_scale
        m_new = tl.maximum(m_i, score)
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(score - m_new)
        l_i = l_i * alpha + p
        o_i = o_i * alpha + p * v
        m_i = m_new
    tl.store(m_ptr + row * num_splits + split, m_i)
    tl.store(l_ptr + row * num_splits + split, l_i)
    tl.store(o_ptr + (row * num_splits + split) * HEAD_DIM + dims, o_i)


# %% grade_id: decode_partial_kernel | cheat: a loop over single keys whose step only mentions BLOCK_N (1 + 0 * BLOCK_N)
# expect: does not step one tile of BLOCK_N keys
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
    kv_base = (batch * n_kv_heads + kv_head) * n_keys * HEAD_DIM
    start = split * chunk
    end = tl.minimum(start + chunk, n_keys)
    m_i = float("-inf")
    l_i = 0.0
    o_i = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for key in range(start, end, 1 + 0 * BLOCK_N):
        k = tl.load(k_ptr + kv_base + key * HEAD_DIM + dims)
        v = tl.load(v_ptr + kv_base + key * HEAD_DIM + dims)
        score = tl.sum(q * k, axis=0) * sm_scale
        m_new = tl.maximum(m_i, score)
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(score - m_new)
        l_i = l_i * alpha + p
        o_i = o_i * alpha + p * v
        m_i = m_new
    tl.store(m_ptr + row * num_splits + split, m_i)
    tl.store(l_ptr + row * num_splits + split, l_i)
    tl.store(o_ptr + (row * num_splits + split) * HEAD_DIM + dims, o_i)
