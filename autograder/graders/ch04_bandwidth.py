"""Grader for exercises/ch04_bandwidth.ipynb.

Every expected value comes from ``reference.calculators.roofline`` in the grader process, on sizes drawn
with ``torch.Generator().manual_seed(seed)``. When an answer is wrong, the message compares it
with what the usual slips produce (bits for bytes, MiB for bytes, a matrix counted once, a
missing factor 2, GB vs GiB) and names the slip that matches.
"""
from __future__ import annotations

import math

import torch

from autograder.boundary.causes import LearnerError
from autograder.rules.feedback import as_number, assert_close
from autograder.rules.inputs import generator, randint
from autograder.rules.plugin import exercise
from reference.calculators import roofline as rf

TRAFFIC_DTYPES = ["fp32", "fp16", "bf16", "fp8"]
WEIGHT_DTYPES = ["fp32", "fp16", "bf16", "fp8", "int8", "int4"]
HEAD_DIMS = [32, 64, 80, 96, 128, 256]


def _pick(gen: torch.Generator, options: list):
    return options[randint(gen, 0, len(options) - 1)]


def _covering(gen: torch.Generator, options: list[str], count: int) -> list[str]:
    """`count` dtypes from `options`, every element size among them at least once, in a seeded
    order: an answer right only for some sizes (the book's fp16 for every dtype) fails at any
    seed, not only where the draws happen to miss the other sizes."""
    by_size: dict[int, list[str]] = {}
    for option in options:
        by_size.setdefault(rf.dtype_bits(option), []).append(option)
    chosen = [_pick(gen, group) for group in by_size.values()]
    chosen += [_pick(gen, options) for _ in range(count - len(chosen))]
    return [chosen[i] for i in torch.randperm(len(chosen), generator=gen).tolist()]


def _unlike(gen: torch.Generator, options: list, book) -> object:
    """An option other than the book example's (for a dtype: of another element size), so
    that the fresh inputs of an example test differ from the example in that argument."""
    if isinstance(book, str):
        return _pick(gen, [o for o in options if rf.dtype_bits(o) != rf.dtype_bits(book)])
    return _pick(gen, [o for o in options if o != book])


def _near(a, b, rel: float = 1e-9) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a) \
        and math.isclose(a, b, rel_tol=rel, abs_tol=1e-300)


def _judge(cases: list[tuple[str, float, float, list[tuple[float, str]]]], rule: str) -> None:
    """Fail on the first case where got != expected. Each case is (call, got, expected, slips),
    with the same slips in the same order for every case; the advice is that of the first slip
    that reproduces the learner's answers in every case (one case alone can be ambiguous)."""
    wrong = [case for case in cases if not _near(case[1], case[2])]
    if not wrong:
        return
    call, got, expected, slips = wrong[0]
    for i, (value, advice) in enumerate(slips):
        if not _near(value, expected) and all(_near(c[1], c[3][i][0]) for c in cases):
            raise AssertionError(f"{call} returned {got:.6g}, expected {expected:.6g}: {advice}")
    raise AssertionError(f"{call} returned {got:.6g}, expected {expected:.6g}. {rule}")


# ------------------------------------------------------------ standard_attention_traffic

def _traffic_slips(n: int, d: int, size: int) -> list[tuple[list[float], str]]:
    row, sq = n * d * size, n * n * size
    right = [row, row, sq, sq, sq, sq, row, row]
    return [
        ([8 * b for b in right], "those are bits. Count bytes: an fp16 element is 2 bytes, not 16."),
        ([b / 2**20 for b in right], "those are MiB; return plain bytes (ints)."),
        ([b / 1e6 for b in right], "those are MB (10^6 bytes); return plain bytes (ints)."),
        ([row, row, sq, sq, row, row], "each N x N matrix is counted once. S and P are each "
         "written to HBM by one kernel and read back by the next: x2 for write + read."),
        ([row, row, sq, sq, sq, row, row], "one N x N leg is missing: S is written then read "
         "back by the softmax, P is written then read back by P @ V (four N x N legs)."),
        ([row, row, row, sq, sq, sq, sq, row], "the stages are out of order. The three kernels "
         "run S = QK^T (load Q, load K, write S), softmax (read S, write P), then P @ V "
         "(read P, load V, write O)."),
    ]


def _check_traffic(learner, n: int, d: int, dtype: str) -> None:
    call = f"standard_attention_traffic({n}, {d}, {dtype!r})"
    got = learner.call("standard_attention_traffic", n, d, dtype)
    expected = [b for _, b in rf.standard_attention_traffic(n, d, dtype)]
    pairs = isinstance(got, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) for p in got)
    if not pairs:
        raise AssertionError(f"{call} returned {got!r:.120}; return a list of (stage name, bytes) "
                             "pairs, one per transfer between HBM and the chip, in order")
    values = [p[1] for p in got]
    if len(values) == len(expected) and all(_near(g, e) for g, e in zip(values, expected)):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise AssertionError(f"{call}: the byte counts are right but not ints: {values}")
        return
    size = rf.dtype_bits(dtype) // 8
    for candidate, advice in _traffic_slips(n, d, size):
        if len(values) == len(candidate) and all(_near(g, c) for g, c in zip(values, candidate)):
            raise AssertionError(f"{call}: {advice}")
    for other in (1, 2, 4):
        wrong = [b // size * other for b in expected]
        if other != size and values == wrong:
            raise AssertionError(f"{call}: every count uses {other} byte(s) per element; {dtype} "
                                 f"takes {size} (fp32: 4, fp16/bf16: 2, fp8: 1)")
    raise AssertionError(
        f"{call} gave bytes {values}, expected {expected}. Q, K, V, O are N x d, S and P are "
        "N x N; eight legs: load Q, load K, write S, read S, write P, read P, load V, write O.")


# A test on a published example earns its points only with the right answer on fresh inputs
# too: a function that returns the book's numbers for the book's arguments and anything else
# elsewhere earns nothing from the example. The fresh inputs differ from the example's in every
# argument the answer depends on (another head dim, a dtype of another element size, a K/V
# cache), so an answer that holds only for the example's dtype or shape earns nothing either.


@exercise("standard_attention_traffic", points=4)
def test_traffic_of_the_book_example(learner, seed):
    _check_traffic(learner, 4096, 128, "fp16")
    book = learner.call("standard_attention_traffic", 4096, 128, "fp16")
    total = sum(b for _, b in book)
    assert total == 132 * 2**20, f"the eight legs add up to {total / 2**20:g} MiB, not 132 MiB"
    gen = generator(seed + 11)
    for dtype in (_unlike(gen, TRAFFIC_DTYPES, "fp16"), _pick(gen, TRAFFIC_DTYPES)):
        d = _unlike(gen, HEAD_DIMS, 128)
        _check_traffic(learner, randint(gen, d + 1, 16384), d, dtype)


@exercise("standard_attention_traffic", points=4)
def test_traffic_on_random_sizes_and_dtypes(learner, seed):
    gen = generator(seed)
    for dtype in _covering(gen, TRAFFIC_DTYPES, 6):
        d = _pick(gen, HEAD_DIMS)
        n = randint(gen, d + 1, 16384)
        _check_traffic(learner, n, d, dtype)


# ---------------------------------------------------------------------- matmul_intensity

def _judge_matmuls(learner, shapes: list[tuple[int, int, int, str]]) -> None:
    cases = []
    for m, k, n, dtype in shapes:
        call = f"matmul_intensity({m}, {k}, {n}, {dtype!r})"
        got = as_number(learner.call("matmul_intensity", m, k, n, dtype), name=call)
        flops, moved = rf.matmul_cost(m, k, n, dtype)
        size = rf.dtype_bits(dtype) / 8
        ab, c = (m * k + k * n) * size, m * n * size
        cases.append((call, got, flops / moved, [
            (flops / 2 / moved, "a multiply-add is 2 FLOPs: C = A @ B costs 2 m k n FLOPs."),
            (flops / ab, "C must be written back to memory: bytes = (m k + k n + m n) x bytes per element."),
            (flops / (ab + 2 * c), "C is only written, not read first: count m n elements once."),
            (flops / (8 * moved), "the bytes were counted in bits; divide bits per element by 8."),
            (flops / (moved / size * 2), "every dtype was given 2 bytes per element; "
             "fp32 takes 4, fp16/bf16 2, fp8 1."),
            (flops / (moved / size * 4), "every dtype was given 4 bytes per element; fp32 takes 4, "
             "fp16/bf16 2, fp8 1."),
        ]))
    _judge(cases, "Intensity = FLOPs / bytes with FLOPs = 2 m k n and bytes = (m k + k n + m n) "
                  "x element size.")


@exercise("matmul_intensity", points=3)
def test_matmul_intensity_on_random_shapes(learner, seed):
    gen = generator(seed + 1)
    _judge_matmuls(learner, [(randint(gen, 2, 4096), randint(gen, 2, 4096), randint(gen, 2, 4096),
                              dtype) for dtype in _covering(gen, TRAFFIC_DTYPES, 6)])


@exercise("matmul_intensity", points=3)
def test_matmul_intensity_of_decode_shaped_products(learner, seed):
    # A decode step multiplies `batch` vectors by each weight matrix: m = batch, tiny intensity.
    gen = generator(seed + 2)
    _judge_matmuls(learner, [(batch, randint(gen, 512, 8192), randint(gen, 512, 8192), dtype)
                             for batch, dtype in zip((1, randint(gen, 2, 8), randint(gen, 16, 64)),
                                                     _covering(gen, TRAFFIC_DTYPES, 3))])


# ---------------------------------------------------------------------- attainable_flops

def _attainable_slips(intensity, peak, bandwidth) -> list[tuple[float, str]]:
    return [
        (max(peak, intensity * bandwidth), "max instead of min: a kernel is held down by the "
         "lower of its two ceilings."),
        (intensity * bandwidth, "the compute roof is missing: nothing runs faster than peak_flops."),
        (peak, "the memory roof is missing: below the ridge, speed is intensity x bandwidth."),
        (min(peak, intensity / bandwidth), "the memory roof is intensity x bandwidth "
         "(FLOPs/byte x bytes/s = FLOP/s), not intensity / bandwidth."),
    ]


@exercise("attainable_flops", points=2)
def test_attainable_flops_on_both_sides_of_the_ridge(learner, seed):
    gen = generator(seed + 3)
    cases = []
    for _ in range(6):
        peak = randint(gen, 10, 2500) * 1e12
        bandwidth = randint(gen, 500, 8000) * 1e9
        ridge = peak / bandwidth
        for intensity in (ridge * randint(gen, 1, 99) / 100, ridge * randint(gen, 101, 1000) / 100):
            call = f"attainable_flops({intensity:.6g}, {peak:.6g}, {bandwidth:.6g})"
            got = as_number(learner.call("attainable_flops", intensity, peak, bandwidth), name=call)
            cases.append((call, got, rf.attainable_flops(intensity, peak, bandwidth),
                          _attainable_slips(intensity, peak, bandwidth)))
    _judge(cases, "attainable = min(peak_flops, intensity x bandwidth).")


@exercise("attainable_flops", points=2)
def test_attainable_flops_on_a_tensor_of_intensities(learner, seed):
    gen = generator(seed + 4)
    peak, bandwidth = randint(gen, 10, 2500) * 1e12, randint(gen, 500, 8000) * 1e9
    intensity = torch.rand(12, generator=gen, dtype=torch.float64) * 3 * peak / bandwidth
    hint = ("work elementwise: torch.clamp(intensity * bandwidth, max=peak_flops). Python's "
            "min() compares with `<`, which on a tensor of 12 intensities gives 12 booleans, "
            "not one: hence 'Boolean value of Tensor ... is ambiguous'")
    try:
        got = learner.call("attainable_flops", intensity, peak, bandwidth)
    except LearnerError as exc:
        if "ambiguous" not in str(exc):
            raise
        raise AssertionError(f"attainable_flops(tensor of 12 intensities, ...) failed: {exc}\n"
                             f"Hint: {hint}") from None
    assert_close(got, rf.attainable_flops(intensity, peak, bandwidth), rtol=1e-9, atol=0,
                 name="attainable_flops(tensor of intensities, ...)", hint=hint)


# ------------------------------------------------------------------ decode_floor_seconds

def _judge_floors(learner, models: list[tuple[int, str, float, int]]) -> None:
    cases = []
    for n_params, dtype, bandwidth, kv_bytes in models:
        call = f"decode_floor_seconds({n_params}, {dtype!r}, {bandwidth:.6g}, kv_bytes={kv_bytes})"
        got = as_number(learner.call("decode_floor_seconds", n_params, dtype, bandwidth,
                                     kv_bytes=kv_bytes), name=call)
        weights = rf.nbytes(n_params, dtype)
        expected = rf.decode_floor_seconds(weights + kv_bytes, bandwidth)
        whole_bytes = max(weights, n_params)  # int4 counted as one byte per weight
        cases.append((call, got, expected, [
            (8 * expected, "the bytes were counted in bits: divide the bits per element by 8."),
            (2 * expected, "a decode step reads the weights and the cache; nothing is written "
             "back, so there is no x2 for read + write."),
            (expected * 1e3, "that is milliseconds; return seconds."),
            (weights / bandwidth, "the K/V cache bytes (kv_bytes) are read at every step too."),
            ((whole_bytes + kv_bytes) / bandwidth, "int4 packs two weights per byte: half a byte each."),
            (expected * 2**30 / 1e9, "GB and GiB are mixed: bandwidth is in bytes/s (10^9 per GB/s)."),
            (expected * 1e9 / 2**30, "GB and GiB are mixed: bandwidth is in bytes/s (10^9 per GB/s)."),
        ]))
    _judge(cases, "floor = (n_params x bytes per weight + kv_bytes) / bandwidth, in seconds.")


@exercise("decode_floor_seconds", points=3)
def test_decode_floor_of_the_70b_example(learner, seed):
    _judge_floors(learner, [(70 * 10**9, "fp16", 2e12, 0)])
    gen = generator(seed + 12)   # and fresh inputs: the example's number alone earns nothing
    _judge_floors(learner, [(randint(gen, 100, 1_000_000) * 10**6, _unlike(gen, WEIGHT_DTYPES, "fp16"),
                             randint(gen, 50, 8000) * 1e9, randint(gen, 1, 10**6) * 10**4)])


@exercise("decode_floor_seconds", points=3)
def test_decode_floor_on_random_models(learner, seed):
    gen = generator(seed + 5)
    _judge_floors(learner, [(randint(gen, 100, 1_000_000) * 10**6 + 2 * randint(gen, 0, 10**5), dtype,
                             randint(gen, 50, 8000) * 1e9, randint(gen, 1, 10**6) * 10**4)
                            for dtype in WEIGHT_DTYPES])
