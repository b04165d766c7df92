"""Known-wrong and cheating submissions for chapter 04 (see tests/grading/test_selfcheck.py).

Each section is the body of one solution cell, written in full or, for a slip, as
`# replace:` / `# with:` edits of the solution section (autograder/solutions/__init__.py);
none may earn the exercise's full points.
"""

# %% grade_id: standard_attention_traffic | wrong: counts each N x N matrix once (writes only)
# expect: each N x N matrix is counted once
# replace:
#             ("write S", square), ("read S", square),
#             ("write P", square), ("read P", square),
# with:
#             ("write S", square),
#             ("write P", square),


# %% grade_id: standard_attention_traffic | wrong: counts bits instead of bytes
# expect: those are bits
# replace:
#     size = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[dtype]
# with:
#     size = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8}[dtype]


# %% grade_id: standard_attention_traffic | wrong: S is written but never read back
# expect: one N x N leg is missing
# replace:
#             ("write S", square), ("read S", square),
# with:
#             ("write S", square),


# %% grade_id: standard_attention_traffic | wrong: reports MiB
# expect: those are MiB
# replace:
#     row_block, square = n * d * size, n * n * size
# with:
#     row_block, square = n * d * size / 2**20, n * n * size / 2**20


# %% grade_id: standard_attention_traffic | cheat: imports the reference implementation
# expect: is not allowed
from reference.calculators.roofline import standard_attention_traffic  # noqa: F401


# %% grade_id: standard_attention_traffic | cheat: returns the book's 132 MiB example for any input
# expect score: 0
# expect: eight legs: load Q, load K
def standard_attention_traffic(n, d, dtype):
    row, square = 2**20, 32 * 2**20
    return [("load Q", row), ("load K", row), ("write S", square), ("read S", square),
            ("write P", square), ("read P", square), ("load V", row), ("write O", row)]


# %% grade_id: matmul_intensity | wrong: counts multiply-adds, not FLOPs
# expect: a multiply-add is 2 FLOPs
# replace:
#     flops = 2 * m * k * n
# with:
#     flops = m * k * n


# %% grade_id: matmul_intensity | wrong: forgets to write C
# expect: C must be written back
# replace:
#     moved = (m * k + k * n + m * n) * size
# with:
#     moved = (m * k + k * n) * size


# %% grade_id: matmul_intensity | wrong: two bytes per element whatever the dtype
# expect: every dtype was given 2 bytes per element
# replace:
#     size = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[dtype]
# with:
#     size = 2


# %% grade_id: matmul_intensity | cheat: calls the reference cost model
# expect: is not allowed
from reference.calculators.roofline import arithmetic_intensity, matmul_cost


def matmul_intensity(m, k, n, dtype):
    return arithmetic_intensity(*matmul_cost(m, k, n, dtype))


# %% grade_id: matmul_intensity | cheat: the rule of thumb "intensity = batch" (returns m)
# expect: Intensity = FLOPs / bytes
def matmul_intensity(m, k, n, dtype):
    return float(m)


# %% grade_id: attainable_flops | wrong: max instead of min
# expect: max instead of min
# replace:
#         return torch.clamp(intensity * bandwidth, max=peak_flops)
#     return min(peak_flops, intensity * bandwidth)
# with:
#         return torch.clamp(intensity * bandwidth, min=peak_flops)
#     return max(peak_flops, intensity * bandwidth)


# %% grade_id: attainable_flops | wrong: only the memory roof
# expect: the compute roof is missing
# replace:
#     if isinstance(intensity, torch.Tensor):
#         return torch.clamp(intensity * bandwidth, max=peak_flops)
#     return min(peak_flops, intensity * bandwidth)
# with:
#     return intensity * bandwidth


# %% grade_id: attainable_flops | wrong: Python's min, which fails on tensors
# expect: ambiguous
# expect: work elementwise: torch.clamp(intensity * bandwidth, max=peak_flops)
# replace:
#     if isinstance(intensity, torch.Tensor):
#         return torch.clamp(intensity * bandwidth, max=peak_flops)
# with:


# %% grade_id: attainable_flops | cheat: borrows the grader's reference module from the call stack
# expect: sys._getframe: the grader does not let learner code reach a stack frame
import sys


def attainable_flops(intensity, peak_flops, bandwidth):
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("rf")
        if module is not None and hasattr(module, "attainable_flops"):
            return module.attainable_flops(intensity, peak_flops, bandwidth)
        frame = frame.f_back
    return 0.0


# %% grade_id: decode_floor_seconds | wrong: counts bits
# expect: counted in bits
# replace:
#     weight_bytes = n_params * bits / 8
#     return (weight_bytes + kv_bytes) / bandwidth
# with:
#     return (n_params * bits + kv_bytes * 8) / bandwidth


# %% grade_id: decode_floor_seconds | wrong: doubles the bytes for read + write
# expect: no x2 for read + write
# replace:
#     return (weight_bytes + kv_bytes) / bandwidth
# with:
#     return 2 * (weight_bytes + kv_bytes) / bandwidth


# %% grade_id: decode_floor_seconds | wrong: forgets the KV cache
# expect: K/V cache bytes
# replace:
#     return (weight_bytes + kv_bytes) / bandwidth
# with:
#     return weight_bytes / bandwidth


# %% grade_id: decode_floor_seconds | wrong: int4 weights take a whole byte
# expect: int4 packs two weights
# replace:
#     bits = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}[dtype]
# with:
#     bits = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 8}[dtype]


# %% grade_id: decode_floor_seconds | wrong: GiB of weights over GB/s of bandwidth
# expect: GB and GiB are mixed
# replace:
#     return (weight_bytes + kv_bytes) / bandwidth
# with:
#     return (weight_bytes + kv_bytes) / 2**30 / (bandwidth / 1e9)


# %% grade_id: decode_floor_seconds | cheat: returns the book's 70 ms for any model
# expect score: 0
# expect: floor = (n_params x bytes per weight + kv_bytes) / bandwidth
def decode_floor_seconds(n_params, dtype, bandwidth, kv_bytes=0):
    return 0.07


# %% grade_id: decode_floor_seconds | cheat: imports the reference floor
# expect: is not allowed
from reference.calculators.roofline import decode_floor_seconds as _floor, nbytes as _nbytes


def decode_floor_seconds(n_params, dtype, bandwidth, kv_bytes=0):
    return _floor(_nbytes(n_params, dtype) + kv_bytes, bandwidth)


# %% grade_id: standard_attention_traffic | cheat: the book's example for the book's arguments, a different (wrong) answer anywhere else (it kept half the points when the example test only asked for "not the same answer again")
# expect score: 0
def standard_attention_traffic(n, d, dtype):
    if (n, d, dtype) == (4096, 128, "fp16"):
        row, square = 2**20, 32 * 2**20
        return [("load Q", row), ("load K", row), ("write S", square), ("read S", square),
                ("write P", square), ("read P", square), ("load V", row), ("write O", row)]
    return [("load Q", 0), ("load K", 0), ("write S", 0), ("read S", 0),
            ("write P", 0), ("read P", 0), ("load V", 0), ("write O", 0)]


# %% grade_id: decode_floor_seconds | cheat: the book's 70 ms for the 70B example, 0 for any other model (not the example's answer again, so the old check let it keep half)
# expect score: 0
def decode_floor_seconds(n_params, dtype, bandwidth, kv_bytes=0):
    return 0.07 if (n_params, dtype, bandwidth, kv_bytes) == (70 * 10**9, "fp16", 2e12, 0) else 0.0


# %% grade_id: standard_attention_traffic | cheat: the book's fp16 element size for every dtype (right on the 4096 x 128 example and on any fresh fp16/bf16 input: the example test kept its half whenever its fresh dtypes were 2-byte ones, at seed 1234 among others)
# expect score: 0
# expect: every count uses 2 byte(s) per element
# replace:
#     size = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[dtype]
# with:
#     size = 2                          # the book's fp16


# %% grade_id: decode_floor_seconds | cheat: the book's fp16 weights for every dtype (right on the 70B example and on any fresh fp16/bf16 model: the example test kept its half whenever its fresh model was a 2-byte one)
# expect score: 0
# expect: floor = (n_params x bytes per weight + kv_bytes) / bandwidth
# replace:
#     weight_bytes = n_params * bits / 8
# with:
#     weight_bytes = n_params * 2       # the book's fp16
