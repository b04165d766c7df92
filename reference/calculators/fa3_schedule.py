"""FlashAttention-3's overlap of softmax and matrix products, as a toy schedule
(chapter 07).

One iteration of a consumer warpgroup's loop is three operations on one K/V
tile: GEMM0 (S = Q K_j^T, tensor cores), softmax (exponentials on the
multi-function unit) and GEMM1 (O += P V_j, tensor cores). The model has two
units per SM, each running one operation at a time: the tensor cores, for
every GEMM, and the exponential units, for every softmax. Both are shared by
all the SM's warpgroups (a warpgroup's four warps sit one on each of the
SM's four sub-partitions and use all of its multi-function units), so two
warpgroups' softmaxes queue for the same unit. Each unit runs its operations
in the order they are listed; an operation starts when its unit is free and
the operations it depends on have ended. Three schedules of the same work (Shah et al. 2024, section 3):

- serial: a warpgroup waits for each result (what FlashAttention-2 does):
  the tensor cores idle while the softmax runs.
- pingpong: two warpgroups, each on its own query tile; barriers give the
  tensor cores to one warpgroup's GEMMs (GEMM1 of iteration j, GEMM0 of j+1)
  while the other runs its softmax, then the roles swap.
- pipelined: one warpgroup issues GEMM0 of iteration j+1 and GEMM1 of j
  without waiting, so the softmax of j+1 runs under GEMM1 of j (the 2-stage
  pipelining of the paper's Algorithm 2).

Durations are in arbitrary units; the paper's H100 figure for head dimension
128 is an exponential taking about half the time of the two GEMMs.
"""
from __future__ import annotations

from typing import NamedTuple

TENSOR_CORES = "tensor cores"
EXPONENTIALS = "exponential units"


class Op(NamedTuple):
    """One operation: which warpgroup, which kind, which K/V tile."""
    warpgroup: int
    kind: str           # "GEMM0", "softmax" or "GEMM1"
    iteration: int


class Span(NamedTuple):
    """An operation placed on the time axis, on the unit that ran it."""
    op: Op
    unit: str
    start: float
    end: float


def _unit(op: Op) -> str:
    return EXPONENTIALS if op.kind == "softmax" else TENSOR_CORES


def run(program: list[tuple[Op, list[Op]]], gemm: float,
        softmax: float) -> list[Span]:
    """Place each (op, ops it waits for) in list order: start at the later of
    its unit becoming free and its dependencies ending."""
    free: dict[str, float] = {}
    ends: dict[Op, float] = {}
    spans = []
    for op, waits_for in program:
        unit = _unit(op)
        start = max([free.get(unit, 0.0)] + [ends[w] for w in waits_for])
        ends[op] = free[unit] = start + (softmax if op.kind == "softmax"
                                         else gemm)
        spans.append(Span(op, unit, start, ends[op]))
    return spans


def serial(n_tiles: int) -> list[tuple[Op, list[Op]]]:
    """One warpgroup: GEMM0, softmax, GEMM1 per K/V tile, each waiting for
    the one before."""
    program, previous = [], None
    for j in range(n_tiles):
        for kind in ("GEMM0", "softmax", "GEMM1"):
            op = Op(0, kind, j)
            program.append((op, [previous] if previous else []))
            previous = op
    return program


def pingpong(n_tiles: int) -> list[tuple[Op, list[Op]]]:
    """Two warpgroups; each gets the tensor cores for GEMM1 of tile j and
    GEMM0 of tile j+1 in turn, and runs its softmax under the other's."""
    program = []
    for j in range(n_tiles + 1):
        for wg in (0, 1):
            if j > 0:      # GEMM1 of tile j-1 waits for its softmax
                program.append((Op(wg, "GEMM1", j - 1),
                                [Op(wg, "softmax", j - 1)]))
            if j < n_tiles:
                after = [Op(wg, "GEMM1", j - 1)] if j > 0 else []
                program.append((Op(wg, "GEMM0", j), after))
                program.append((Op(wg, "softmax", j), [Op(wg, "GEMM0", j)]))
    return program


def pipelined(n_tiles: int) -> list[tuple[Op, list[Op]]]:
    """One warpgroup, two stages: GEMM0 of j+1 and GEMM1 of j are issued
    together and the softmax of j+1 runs while GEMM1 of j does."""
    program = [(Op(0, "GEMM0", 0), []),
               (Op(0, "softmax", 0), [Op(0, "GEMM0", 0)])]
    for j in range(1, n_tiles + 1):
        loop_start = [Op(0, "softmax", j - 1)]
        if j > 1:                        # the previous iteration's last wait
            loop_start.append(Op(0, "GEMM1", j - 2))
        if j < n_tiles:
            program.append((Op(0, "GEMM0", j), loop_start))
        program.append((Op(0, "GEMM1", j - 1), loop_start))
        if j < n_tiles:
            program.append((Op(0, "softmax", j),
                            [Op(0, "GEMM0", j), Op(0, "softmax", j - 1)]))
    return program


def tensor_core_busy(spans: list[Span]) -> float:
    """Fraction of the schedule's length during which a GEMM runs."""
    busy = sum(s.end - s.start for s in spans if s.unit == TENSOR_CORES)
    return busy / max(s.end for s in spans)


def pingpong_busy_bound(gemm: float, softmax: float) -> float:
    """The most the tensor cores can be busy in a long pingpong schedule.

    Per round, the two warpgroups need 4 GEMMs (4 * gemm on the tensor
    cores) and 2 softmaxes (2 * softmax on the shared exponential units);
    each warpgroup's own chain, GEMM1 then GEMM0 then its softmax, takes
    2 * gemm + softmax. The round lasts at least the longest of the three."""
    round_time = max(4 * gemm, 2 * softmax, 2 * gemm + softmax)
    return 4 * gemm / round_time
