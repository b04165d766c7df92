"""Devices a test runs on: the CPU always, CUDA when torch sees a GPU (the same test, marked, not a
copy). Use as `@pytest.fixture(params=DEVICES)` or `@pytest.mark.parametrize("device", DEVICES)`."""
import pytest
import torch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                  reason="needs a CUDA GPU"))]
