"""Shared by tests/kernels/test_kernels_*.py: where the kernels run, fresh inputs, poisoned outputs.

Importing this module before `reference.kernels` chooses how the Triton kernels run: natively
when a CUDA GPU is present, otherwise in Triton's interpreter. `@triton.jit` reads
TRITON_INTERPRET when a kernel is defined, so the variable is set here, at collection time. On a
machine without CUDA nothing else in the suite can run compiled Triton code anyway, so the
variable changes nothing for the other tests.
"""
from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from reference.kernels import checks  # noqa: E402  (after the variable is set)

DEVICE = torch.device("cpu" if checks.INTERPRETED else "cuda")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# max |out - ref| / max |ref| against float64: fp32 accumulation, output rounded to the dtype.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
LSE_TOLERANCE = 1e-4          # absolute, on log-sum-exp values in fp32 whatever the input dtype


@pytest.fixture
def seed() -> int:
    """A fresh seed per test (or KERNEL_TEST_SEED to replay one); printed in every failure."""
    return int(os.environ.get("KERNEL_TEST_SEED", random.SystemRandom().randrange(2**31)))


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Kernel outputs start as NaN: an element the kernel forgets to write fails the test."""
    def nan_filled(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    monkeypatch.setattr(checks, "empty", nan_filled)


def randn(gen: torch.Generator, *shape: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    """Standard normal values drawn on the CPU from `gen`, rounded to dtype, on DEVICE."""
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype).to(DEVICE)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|, in float64; inf if out has NaN where ref has none."""
    out, ref = out.double().cpu(), ref.double().cpu()
    if not torch.equal(torch.isnan(out), torch.isnan(ref)):
        return float("inf")
    finite = ~torch.isnan(ref)
    diff = (out[finite] - ref[finite]).abs()
    return (diff.max() / ref[finite].abs().max().clamp_min(1e-30)).item() if diff.numel() else 0.0


def assert_matches(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, seed: int, what: str) -> float:
    """Every element of out against the float64 reference; returns the relative error."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    error = rel_error(out, ref)
    assert error <= TOLERANCE[dtype], (f"{what} ({dtype}): max relative error {error:.2e} > "
                                       f"{TOLERANCE[dtype]:.0e} (KERNEL_TEST_SEED={seed}; "
                                       "inf means NaN where the reference has a number: an unwritten element)")
    return error


def sweep_sample(cases: list, seed: int) -> list:
    """All cases with KERNEL_SWEEP=all, else a fresh random handful (the default suite's cheap form)."""
    if os.environ.get("KERNEL_SWEEP") == "all":
        return cases
    return random.Random(seed).sample(cases, min(len(cases), int(os.environ.get("KERNEL_SWEEP", "4"))))
