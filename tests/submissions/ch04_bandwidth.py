"""Known-wrong and cheating submissions for chapter 04 (see tests/test_selfcheck.py).

Each section is the body of one solution cell; none may earn the exercise's full points.
"""

# %% grade_id: standard_attention_traffic | wrong: counts each N x N matrix once (writes only)
# expect: each N x N matrix is counted once
def standard_attention_traffic(n, d, dtype):
    size = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[dtype]
    row, square = n * d * size, n * n * size
    return [("load Q", row), ("load K", row), ("write S", square), ("write P", square),
            ("load V", row), ("write O", row)]


# %% grade_id: standard_attention_traffic | wrong: counts bits instead of bytes
# expect: those are bits
def standard_attention_traffic(n, d, dtype):
    bits = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8}[dtype]
    row, square = n * d * bits, n * n * bits
    return [("load Q", row), ("load K", row), ("write S", square), ("read S", square),
            ("write P", square), ("read P", square), ("load V", row), ("write O", row)]


# %% grade_id: standard_attention_traffic | wrong: S is written but never read back
# expect: one N x N leg is missing
def standard_attention_traffic(n, d, dtype):
    size = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[dtype]
    row, square = n * d * size, n * n * size
    return [("load Q", row), ("load K", row), ("write S", square), ("write P", square),
            ("read P", square), ("load V", row), ("write O", row)]


# %% grade_id: standard_attention_traffic | wrong: reports MiB
# expect: those are MiB
def standard_attention_traffic(n, d, dtype):
    size = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[dtype]
    row, square = n * d * size / 2**20, n * n * size / 2**20
    return [("load Q", row), ("load K", row), ("write S", square), ("read S", square),
            ("write P", square), ("read P", square), ("load V", row), ("write O", row)]


# %% grade_id: standard_attention_traffic | cheat: imports the reference implementation
# expect: is not allowed
from reference.calculators.roofline import standard_attention_traffic  # noqa: F401


# %% grade_id: standard_attention_traffic | cheat: returns the book's 132 MiB example for any input
# expect: eight legs: load Q, load K
def standard_attention_traffic(n, d, dtype):
    row, square = 2**20, 32 * 2**20
    return [("load Q", row), ("load K", row), ("write S", square), ("read S", square),
            ("write P", square), ("read P", square), ("load V", row), ("write O", row)]


# %% grade_id: matmul_intensity | wrong: counts multiply-adds, not FLOPs
# expect: a multiply-add is 2 FLOPs
def matmul_intensity(m, k, n, dtype):
    size = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[dtype]
    return m * k * n / ((m * k + k * n + m * n) * size)


# %% grade_id: matmul_intensity | wrong: forgets to write C
# expect: C must be written back
def matmul_intensity(m, k, n, dtype):
    size = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[dtype]
    return 2 * m * k * n / ((m * k + k * n) * size)


# %% grade_id: matmul_intensity | wrong: two bytes per element whatever the dtype
# expect: every dtype was given 2 bytes per element
def matmul_intensity(m, k, n, dtype):
    return 2 * m * k * n / ((m * k + k * n + m * n) * 2)


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
def attainable_flops(intensity, peak_flops, bandwidth):
    if isinstance(intensity, torch.Tensor):
        return torch.clamp(intensity * bandwidth, min=peak_flops)
    return max(peak_flops, intensity * bandwidth)


# %% grade_id: attainable_flops | wrong: only the memory roof
# expect: the compute roof is missing
def attainable_flops(intensity, peak_flops, bandwidth):
    return intensity * bandwidth


# %% grade_id: attainable_flops | wrong: Python's min, which fails on tensors
# expect: ambiguous
def attainable_flops(intensity, peak_flops, bandwidth):
    return min(peak_flops, intensity * bandwidth)


# %% grade_id: attainable_flops | cheat: borrows the grader's reference module from the call stack
# expect: attainable = min(peak_flops, intensity x bandwidth)
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
def decode_floor_seconds(n_params, dtype, bandwidth, kv_bytes=0):
    bits = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}[dtype]
    return (n_params * bits + kv_bytes * 8) / bandwidth


# %% grade_id: decode_floor_seconds | wrong: doubles the bytes for read + write
# expect: no x2 for read + write
def decode_floor_seconds(n_params, dtype, bandwidth, kv_bytes=0):
    bits = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}[dtype]
    return 2 * (n_params * bits / 8 + kv_bytes) / bandwidth


# %% grade_id: decode_floor_seconds | wrong: forgets the KV cache
# expect: K/V cache bytes
def decode_floor_seconds(n_params, dtype, bandwidth, kv_bytes=0):
    bits = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}[dtype]
    return n_params * bits / 8 / bandwidth


# %% grade_id: decode_floor_seconds | wrong: int4 weights take a whole byte
# expect: int4 packs two weights
def decode_floor_seconds(n_params, dtype, bandwidth, kv_bytes=0):
    size = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 1}[dtype]
    return (n_params * size + kv_bytes) / bandwidth


# %% grade_id: decode_floor_seconds | wrong: GiB of weights over GB/s of bandwidth
# expect: GB and GiB are mixed
def decode_floor_seconds(n_params, dtype, bandwidth, kv_bytes=0):
    bits = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}[dtype]
    gib = (n_params * bits / 8 + kv_bytes) / 2**30
    return gib / (bandwidth / 1e9)


# %% grade_id: decode_floor_seconds | cheat: returns the book's 70 ms for any model
# expect: floor = (n_params x bytes per weight + kv_bytes) / bandwidth
def decode_floor_seconds(n_params, dtype, bandwidth, kv_bytes=0):
    return 0.07


# %% grade_id: decode_floor_seconds | cheat: imports the reference floor
# expect: is not allowed
from reference.calculators.roofline import decode_floor_seconds as _floor, nbytes as _nbytes


def decode_floor_seconds(n_params, dtype, bandwidth, kv_bytes=0):
    return _floor(_nbytes(n_params, dtype) + kv_bytes, bandwidth)
