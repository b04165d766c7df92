"""Huge pages (reference/cpu/huge_pages.py): the packed weights a decode step streams in memory the
kernel was asked to back with 2 MiB pages, ordinary memory when switched off, the same logits; the
copy that decode is compared with measured in the same kind of memory."""
import pytest
import torch

from reference.bench import measure
from reference.cpu import CpuModel, huge_pages, native_gemv, native_step
from reference.model import build_tiny

pytestmark = pytest.mark.skipif(not huge_pages.supported(), reason="huge pages are Linux's (madvise)")


def test_huge_buffer_is_aligned_zeroed_writable_and_advised():
    buffer = huge_pages.huge_buffer(3 << 20)
    assert buffer.numel() == 3 << 20 and buffer.data_ptr() % huge_pages.HUGE_PAGE == 0
    assert not buffer.any()
    buffer.view(torch.float32).fill_(2.0)
    assert buffer.view(torch.float32).sum().item() == 2.0 * (3 << 18)
    assert huge_pages.on_huge_pages(buffer) and not huge_pages.on_huge_pages(torch.zeros(8))


@pytest.mark.skipif(not native_gemv.available(), reason="the packed copy is the native step's")
def test_the_packed_weights_live_on_huge_pages_and_give_the_same_logits_without_them():
    """The copy of the weights a CpuModel's decode step streams is on huge pages; switched off,
    it is made in ordinary memory and the logits are the same."""
    logits = []
    for on in (True, False):
        previous = huge_pages.set_enabled(on)
        try:
            model = build_tiny(2)
            fast = CpuModel(model)
            assert huge_pages.on_huge_pages(native_step._tables[model].buffer) == on
            cache = model.new_cache(1, 8)
            fast(torch.tensor([[1, 2, 3]]), cache=cache)
            logits.append(fast(torch.tensor([[4]]), cache=cache))
        finally:
            huge_pages.set_enabled(previous)
    assert torch.equal(*logits)


def test_the_copy_reference_lives_on_huge_pages_too(monkeypatch):
    made = []
    real = huge_pages.huge_buffer
    monkeypatch.setattr(huge_pages, "huge_buffer", lambda n: made.append(n) or real(n))
    assert measure.copy_bandwidth(n_bytes=4 << 20, seconds=0.05) > 0
    assert made == [4 << 20, 4 << 20]
    previous = huge_pages.set_enabled(False)
    try:
        measure.copy_bandwidth(n_bytes=4 << 20, seconds=0.05)
    finally:
        huge_pages.set_enabled(previous)
    assert len(made) == 2
