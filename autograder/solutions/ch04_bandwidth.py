"""Solutions of exercises/ch04_bandwidth.ipynb, one section per solution cell.

Loaded with ``autograder.solutions.load_solutions("ch04_bandwidth")``; never imported as a
module by the grader (each section is injected into the notebook and graded).
"""

# %% grade_id: standard_attention_traffic
def standard_attention_traffic(n: int, d: int, dtype: str) -> list[tuple[str, int]]:
    """HBM traffic of unfused attention for one head and one sequence.

    n: sequence length, d: head dimension, dtype: "fp32", "fp16", "bf16" or "fp8".
    Three kernels run one after the other: S = Q K^T, P = softmax(S), O = P V, with Q, K, V, O
    of shape [n, d] and S, P of shape [n, n], every tensor living in HBM between kernels.
    Returns the eight transfers in the order they happen, as (stage name, bytes) pairs:
    load Q, load K, write S, read S, write P, read P, load V, write O. Bytes are ints.
    """
    size = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[dtype]
    row_block, square = n * d * size, n * n * size
    return [("load Q", row_block), ("load K", row_block),
            ("write S", square), ("read S", square),
            ("write P", square), ("read P", square),
            ("load V", row_block), ("write O", row_block)]


# %% grade_id: matmul_intensity
def matmul_intensity(m: int, k: int, n: int, dtype: str) -> float:
    """Arithmetic intensity (FLOPs per byte) of C[m, n] = A[m, k] @ B[k, n].

    dtype: "fp32", "fp16", "bf16" or "fp8" (4, 2, 2, 1 bytes per element), for A, B and C.
    FLOPs: a multiply-add counts as 2. Bytes: A and B are read once, C is written once.
    """
    size = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[dtype]
    flops = 2 * m * k * n
    moved = (m * k + k * n + m * n) * size
    return flops / moved


# %% grade_id: attainable_flops
import torch


def attainable_flops(intensity, peak_flops: float, bandwidth: float):
    """The roofline: the FLOP/s a kernel of this arithmetic intensity can reach at best.

    intensity: FLOPs per byte, a float or a tensor (then the answer is a tensor, elementwise).
    peak_flops: the compute ceiling in FLOP/s. bandwidth: the memory ceiling in bytes/s.
    """
    if isinstance(intensity, torch.Tensor):
        return torch.clamp(intensity * bandwidth, max=peak_flops)
    return min(peak_flops, intensity * bandwidth)


# %% grade_id: decode_floor_seconds
def decode_floor_seconds(n_params: int, dtype: str, bandwidth: float, kv_bytes: int = 0) -> float:
    """Lower bound on the time of one decode step, in seconds.

    Every weight is read once per step (n_params of them, stored as dtype: "fp32", "fp16",
    "bf16", "fp8", "int8" or "int4"; int4 takes half a byte), and so is the KV cache
    (kv_bytes bytes). bandwidth: memory bandwidth in bytes/s.
    """
    bits = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}[dtype]
    weight_bytes = n_params * bits / 8
    return (weight_bytes + kv_bytes) / bandwidth
