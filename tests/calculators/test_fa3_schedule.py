"""reference.calculators.fa3_schedule: the toy schedules of chapter 07 keep
every dependency, keep the tensor cores to one GEMM at a time and the SM's
exponential units to one softmax at a time, and hide the softmax exactly when
the paper says they should."""
import pytest

from reference.calculators.fa3_schedule import (EXPONENTIALS, TENSOR_CORES, Op, pingpong,
                                                pingpong_busy_bound, pipelined, run, serial,
                                                tensor_core_busy)

PROGRAMS = {"serial": serial, "pingpong": pingpong, "pipelined": pipelined}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("gemm, softmax", [(1.0, 1.0), (1.0, 0.4), (1.0, 3.0)])
def test_no_unit_runs_two_operations_at_once_and_no_operation_starts_early(name, gemm, softmax):
    program = PROGRAMS[name](4)
    spans = run(program, gemm, softmax)
    by_op = {s.op: s for s in spans}
    for op, waits_for in program:
        late = [w for w in waits_for if by_op[w].end > by_op[op].start]
        assert not late, f"{name}: {op} starts before {late} ends"
    for unit in {s.unit for s in spans}:
        on_unit = sorted((s for s in spans if s.unit == unit), key=lambda s: s.start)
        overlaps = [(a.op, b.op) for a, b in zip(on_unit, on_unit[1:]) if b.start < a.end]
        assert not overlaps, f"{name}: {unit} runs two operations at once: {overlaps[:2]}"


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_tile_gets_its_three_operations_in_order(name):
    n_tiles = 3
    spans = run(PROGRAMS[name](n_tiles), 1.0, 1.0)
    ops = {s.op: s for s in spans}
    warpgroups = {op.warpgroup for op in ops}
    assert len(ops) == 3 * n_tiles * len(warpgroups) == len(spans)
    for wg in warpgroups:
        for j in range(n_tiles):
            g0, sm, g1 = (ops[Op(wg, kind, j)] for kind in ("GEMM0", "softmax", "GEMM1"))
            assert g0.end <= sm.start and sm.end <= g1.start, f"{name}: tile {j} out of order"


def test_serial_leaves_the_tensor_cores_idle_during_every_softmax():
    spans = run(serial(8), 1.0, 1.0)
    assert tensor_core_busy(spans) == pytest.approx(2 / 3), "two GEMMs of 1, then a softmax of 1"


@pytest.mark.parametrize("name", ["pingpong", "pipelined"])
def test_overlap_hides_a_softmax_no_longer_than_the_gemms_it_runs_under(name):
    n_tiles = 64
    busy = tensor_core_busy(run(PROGRAMS[name](n_tiles), 1.0, 1.0))
    assert busy > 0.95, f"{name}: the tensor cores should be nearly always busy, got {busy:.2f}"
    slow = tensor_core_busy(run(PROGRAMS[name](n_tiles), 1.0, 4.0))
    assert slow < 0.7, f"{name}: a softmax 4x a GEMM cannot be hidden, yet busy = {slow:.2f}"


def test_pingpong_gives_the_tensor_cores_to_one_warpgroup_at_a_time():
    spans = sorted((s for s in run(pingpong(3), 1.0, 1.0) if s.unit == TENSOR_CORES),
                   key=lambda s: s.start)
    owners = [s.op.warpgroup for s in spans]
    assert owners == [0, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 1], owners


def test_the_two_warpgroups_share_one_set_of_exponential_units():
    spans = run(pingpong(8), 1.0, 3.0)
    softmaxes = sorted((s for s in spans if s.op.kind == "softmax"), key=lambda s: s.start)
    assert {s.unit for s in softmaxes} == {EXPONENTIALS}, \
        "every softmax runs on the SM's exponential units, whichever warpgroup issues it"
    assert {s.op.warpgroup for s in softmaxes} == {0, 1}
    overlaps = [(a.op, b.op) for a, b in zip(softmaxes, softmaxes[1:]) if b.start < a.end]
    assert not overlaps, f"two softmaxes ran at once on the shared units: {overlaps[:2]}"


@pytest.mark.parametrize("softmax", [0.5, 1.0, 2.0, 3.0, 4.0])
def test_long_pingpong_reaches_its_bound_and_never_passes_it(softmax):
    busy = tensor_core_busy(run(pingpong(256), 1.0, softmax))
    bound = pingpong_busy_bound(1.0, softmax)
    assert busy <= bound + 1e-12, f"softmax {softmax}: busy {busy:.3f} above the bound {bound:.3f}"
    assert busy > bound - 0.01, f"softmax {softmax}: busy {busy:.3f}, the bound is {bound:.3f}"


def test_a_softmax_longer_than_two_gemms_is_limited_by_the_shared_exponential_units():
    # two softmaxes of 3 per round against four GEMMs of 1: at most 4 / 6, not the 4 / 5
    # that one exponential unit per warpgroup would allow
    assert pingpong_busy_bound(1.0, 3.0) == pytest.approx(4 / 6)
    assert tensor_core_busy(run(pingpong(256), 1.0, 3.0)) < 0.7
