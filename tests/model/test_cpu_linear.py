"""reference.cpu.cpu_linear: the packed oneDNN path computes what F.linear computes, follows weight
changes, and falls back to F.linear when it is switched off or its private ops are missing."""
import pytest
import torch
from torch.nn import functional as F

from reference.cpu import cpu_linear
from reference.decoding import generate
from reference.model import build_tiny

needs_packing = pytest.mark.skipif(not cpu_linear.available(), reason="this torch has no oneDNN packing ops")


@pytest.fixture
def packed_on(monkeypatch):
    """The packed path on, for matrices of any size (the tests' matrices are small)."""
    monkeypatch.setattr(cpu_linear, "MIN_PACKED_BYTES", 0)
    previous = cpu_linear.set_enabled(True)
    yield
    cpu_linear.set_enabled(previous)


def relative_error(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


@needs_packing
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 16, 17])
def test_packed_product_equals_f_linear(packed_on, rows):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(300, 72, generator=gen)
    x = torch.randn(2, rows, 72, generator=gen)
    got = cpu_linear.linear(x, weight)
    assert got.shape == (2, rows, 300)
    assert relative_error(got, x.double() @ weight.double().T) < 1e-6


@needs_packing
@pytest.mark.parametrize("layout", ["row-major", "input-major"])
def test_non_contiguous_inputs_and_either_weight_layout(packed_on, layout):
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 40, generator=gen)                          # nn.Linear's layout
    if layout == "input-major":
        weight = weight.t().contiguous().t()
    x = torch.randn(40, 6, generator=gen).t()                            # a transposed view
    assert relative_error(cpu_linear.linear(x, weight), F.linear(x, weight)) < 1e-6


@needs_packing
def test_a_changed_weight_is_packed_again(packed_on):
    layer = torch.nn.Linear(16, 8, bias=False)
    x = torch.randn(3, 16)
    before = cpu_linear.linear(x, layer.weight)
    with torch.no_grad():
        layer.weight.mul_(2.0)                     # in place: same storage, new version
    torch.testing.assert_close(cpu_linear.linear(x, layer.weight), 2 * before)
    layer.load_state_dict({"weight": torch.zeros(8, 16)})
    assert torch.count_nonzero(cpu_linear.linear(x, layer.weight)) == 0


def test_switched_off_is_exactly_f_linear():
    previous = cpu_linear.set_enabled(False)
    try:
        x, weight = torch.randn(5, 32), torch.randn(48, 32)
        assert torch.equal(cpu_linear.linear(x, weight), F.linear(x, weight))
    finally:
        cpu_linear.set_enabled(previous)


def test_missing_private_ops_fall_back_to_f_linear(packed_on, monkeypatch):
    monkeypatch.setattr(cpu_linear, "available", lambda: False)
    x, weight = torch.randn(5, 32), torch.randn(48, 32)
    assert torch.equal(cpu_linear.linear(x, weight), F.linear(x, weight))


def test_a_single_row_takes_the_matrix_vector_path_where_blas_won(packed_on, monkeypatch):
    monkeypatch.setattr(cpu_linear, "_one_row_path", {torch.get_num_threads(): "blas"})
    x, weight = torch.randn(1, 1, 64), torch.randn(256, 64)
    assert torch.equal(cpu_linear.linear(x, weight), F.linear(x, weight))
    assert weight not in cpu_linear._packed, \
        "where BLAS's GEMV won the race, a one-row product must not pack its weight"


@needs_packing
def test_a_single_row_takes_the_packed_path_where_onednn_won(packed_on, monkeypatch):
    monkeypatch.setattr(cpu_linear, "_one_row_path", {torch.get_num_threads(): "packed"})
    x, weight = torch.randn(1, 1, 64), torch.randn(256, 64)
    assert relative_error(cpu_linear.linear(x, weight), x.double() @ weight.double().T) < 1e-6
    assert weight in cpu_linear._packed


def test_the_race_keeps_its_verdict(monkeypatch):
    races = []
    monkeypatch.setattr(cpu_linear, "_fastest", lambda candidates: races.append(list(candidates)) or "blas")
    monkeypatch.setattr(cpu_linear, "_one_row_path", {})
    want = ["blas", "packed"] if cpu_linear.available() else ["blas"]
    assert cpu_linear.one_row_path() == "blas"
    assert cpu_linear.one_row_path() == "blas" and races == [want], "the verdict must be kept, not re-raced"


def test_the_race_interleaves_and_keeps_each_candidates_best_time():
    """A burst of load that slows one round of the fast candidate must not hand the race to the slow one."""
    now = [0.0]
    def clock():
        return now[0]
    def costs(*seconds):
        it = iter(seconds)
        return lambda: now.__setitem__(0, now[0] + next(it))
    candidates = {"steady": costs(9, 2.0, 2.0, 2.0), "fast but hit once": costs(9, 5.0, 1.0, 1.0)}
    assert cpu_linear._fastest(candidates, rounds=3, clock=clock) == "fast but hit once"


def test_small_matrices_take_the_plain_path():
    x, weight = torch.randn(4, 64), torch.randn(256, 64)     # 64 KiB: cache-resident
    assert weight.numel() * 4 < cpu_linear.MIN_PACKED_BYTES
    assert torch.equal(cpu_linear.linear(x, weight), F.linear(x, weight))


@needs_packing
def test_model_sized_matrices_are_packed_once():
    weight = torch.randn(960, 576)                            # SmolLM2's fused QKV: 2.2 MB
    x = torch.randn(5, 576)
    assert relative_error(cpu_linear.linear(x, weight), x.double() @ weight.double().T) < 1e-6
    first = cpu_linear.packed_weight(weight)
    cpu_linear.linear(x, weight)
    assert cpu_linear.packed_weight(weight) is first          # reused, not packed per call


def test_other_dtypes_take_the_plain_path(packed_on):
    x, weight = torch.randn(4, 32).double(), torch.randn(24, 32).double()
    assert torch.equal(cpu_linear.linear(x, weight), F.linear(x, weight))


@needs_packing
def test_tiny_model_greedy_tokens_are_the_same_either_way(packed_on):
    model = build_tiny(3)
    prompt = list(range(10, 30))
    packed = generate(model, prompt, 40, backend="cpu")
    cpu_linear.set_enabled(False)
    assert generate(model, prompt, 40, backend="cpu") == packed
