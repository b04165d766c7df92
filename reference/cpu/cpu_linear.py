"""How a linear layer runs at the weight-streaming floor on a CPU: weights packed once for oneDNN.

A decode step, a prompt chunk or a pass that verifies k drafts multiplies a few rows of
activations (M = 1 to ~16) by every weight matrix of the model. In float32 such a product does
about M/2 FLOPs per weight byte, below a laptop's ridge point (chapter 04) up to M of roughly 8,
so it should cost one read of the weights whatever M is. `F.linear` does not get there: for every
call with M > 1 the BLAS GEMM re-packs the whole weight matrix into its blocked layout before
multiplying, so a 5-row product reads and writes the weights several times.

A single row is different: BLAS runs it as a matrix-vector product that streams the weight as
stored, with nothing to re-pack, and may or may not beat the packed weight depending on the CPU,
the thread count and the load; so it is decided by measurement, once per process and thread
count (`one_row_path`, about 0.1 s), not by a rule. Both give the same numbers up to float
rounding. (Where the native code is built, a batch-1 pass over up to 16 new positions, a decode
step among them, does not come here at all: `reference.cpu.native_step` runs the whole pass,
products included, in one call.)

`linear` packs each weight once (the first time it is used, again whenever the weight changes)
into oneDNN's blocked layout and multiplies with oneDNN's inner-product primitive, which then only
streams it. The cost is memory: the packed copy sits beside the plain parameter, which
the rest of the course still reads (state dicts, the embedding lookup, chapter 03's byte counts),
so the weights' resident size doubles (`packed_bytes`).

The packing ops are private torch ops (`torch.ops.mkldnn._reorder_linear_weight`,
`torch.ops.mkldnn._linear_pointwise`); this module is the only place that names them. Where they
are missing (a torch built without oneDNN), on a GPU, for a dtype other than float32, or when the
fast path is switched off (`REFERENCE_PACKED_LINEAR=0` in the environment, or `set_enabled`), the
plain `F.linear` runs instead and gives the same numbers up to float rounding. So do matrices
under `MIN_PACKED_BYTES`, which live in the CPU's caches anyway.
"""
from __future__ import annotations

import functools
import time

import torch
from torch import Tensor
from torch.nn import functional as F
from torch.utils.weak import WeakTensorKeyDictionary

from reference.switch import Switch

_switch = Switch("REFERENCE_PACKED_LINEAR")   # whether `linear` takes the packed path when it can
enabled, set_enabled = _switch.enabled, _switch.set_enabled

# Smaller weights stay on F.linear: they sit in the CPU's caches, where there is no memory traffic
# to save, and a oneDNN call costs ~20 us more than a BLAS one (the tiny test model's matrices,
# 64 KiB at most, would run several times slower). SmolLM2's smallest matrix is 1.3 MB.
MIN_PACKED_BYTES = 1 << 20

# The one-row race runs on a matrix this large (well past any CPU's last-level cache, as a model's
# weights are), shaped like SmolLM2's MLP projections, stored [out, in] as nn.Linear stores them.
RACE_SHAPE = (1536 * 8, 576 * 2)  # [out, in], 56.6 MB in float32


@functools.cache
def available() -> bool:
    """True when this torch can pack weights for oneDNN (a CPU build with oneDNN's private ops)."""
    ops = getattr(torch.ops, "mkldnn", None)
    return (torch.backends.mkldnn.is_available() and ops is not None
            and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))


# weight tensor -> (its state when packed, the packed copy); weak keys, so a dropped model frees both.
_packed = WeakTensorKeyDictionary()


def _streamed(weight: Tensor) -> bool:
    """A float32 CPU matrix large enough to be read from memory rather than from the caches."""
    return (weight.dtype == torch.float32 and weight.is_cpu and weight.dim() == 2
            and weight.numel() * weight.element_size() >= MIN_PACKED_BYTES)


def packed_weight(weight: Tensor) -> Tensor:
    """The oneDNN-packed copy of `weight` [out, in], made on first use and remade when the
    weight's storage, dtype or contents (its version counter) have changed since."""
    state = (weight.data_ptr(), weight.dtype, weight.shape, weight._version)
    hit = _packed.get(weight)
    if hit is not None and hit[0] == state:
        return hit[1]
    with torch.inference_mode(False), torch.no_grad():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())
    _packed[weight] = (state, packed)
    return packed


# thread count -> the one-row path measured fastest on this machine: "blas" or "packed".
_one_row_path: dict[int, str] = {}


def _fastest(candidates: dict, rounds: int = 5, clock=time.perf_counter) -> str:
    """The name of the fastest of `candidates` (name -> function): each called once to warm up,
    then once per round, in turn, keeping each one's best time. Interleaved, so that a burst of
    load from another process hits every candidate rather than the one that happened to run then."""
    for fn in candidates.values():
        fn()
    best = dict.fromkeys(candidates, float("inf"))
    for _ in range(rounds):
        for name, fn in candidates.items():
            start = clock()
            fn()
            best[name] = min(best[name], clock() - start)
    return min(best, key=best.get)


def one_row_path() -> str:
    """The faster way to stream a weight through a one-row product at torch's current thread count:
    "blas" (BLAS's matrix-vector product on the weight as stored) or "packed" (oneDNN's packed
    weight; raced only where `available`), raced on a `RACE_SHAPE` weight (`_fastest`, ~0.1 s);
    the answer is kept for the process."""
    threads = torch.get_num_threads()
    if threads not in _one_row_path:
        with torch.inference_mode(False), torch.no_grad():
            weight = torch.full(RACE_SHAPE, 0.5)                         # [out, in]
            row = torch.full((1, RACE_SHAPE[1]), 0.5)
            candidates = {"blas": lambda: F.linear(row, weight)}
            if available():
                packed = torch.ops.mkldnn._reorder_linear_weight(weight)
                candidates["packed"] = lambda: torch.ops.mkldnn._linear_pointwise(row, packed, None, "none", [], "")
            _one_row_path[threads] = _fastest(candidates)
    return _one_row_path[threads]


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., in] @ weight[out, in]^T -> [..., out], through the packed weight where possible.

    A single row takes whichever path `one_row_path` measured fastest on this machine. The checks
    come cheapest first: a decode step makes ~120 of these calls, and each microsecond here is
    ~0.5% of a step (a oneDNN call costs ~13 us before it reads a byte of the weight)."""
    if _switch.on and x.dtype == torch.float32 and _streamed(weight):
        if x.numel() == x.shape[-1] and one_row_path() == "blas":        # one row
            return F.linear(x, weight)
        if available():
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed_weight(weight), None, "none", [], "")
    return F.linear(x, weight)


def packed_bytes() -> int:
    """Bytes held by packed copies right now (the memory this module costs)."""
    return sum(w.numel() * w.element_size() for w, _ in list(_packed.items()))
