"""Launching a learner's Triton kernel where the grader's tensors live on the CPU.

Graders build their inputs (and NaN-poisoned outputs) on the CPU. Under ``TRITON_INTERPRET=1``
the kernel reads them there. Where a CUDA GPU runs the kernel compiled, each tensor argument is
copied to the GPU with the same sizes and strides (so strides the grader passes stay true), the
kernel runs, and every tensor's contents are copied back into the grader's CPU tensor.

In the interpreter the launch's memory traffic is counted too (``autograder.boundary.traffic``);
a compiled launch has no such record.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from autograder.boundary import traffic


def runs_compiled() -> bool:
    """True when Triton kernels run compiled on a CUDA GPU rather than in the interpreter."""
    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


def launch(kernel: Any, grid: tuple[int, ...], args: tuple, kwargs: dict) -> tuple[list, dict | None]:
    """``kernel[grid](*args, **kwargs)``; returns ``args`` after the launch (written in place)
    and, in the interpreter, the launch's memory traffic (``traffic.Recording.wire()``; None
    where the kernel runs compiled)."""
    if not runs_compiled():
        traffic.install()
        with traffic.recording(args, kwargs) as record:
            kernel[tuple(grid)](*args, **kwargs)
        return list(args), record.wire()
    pairs = []

    def to_gpu(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.is_cuda:
            return value
        copy = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device="cuda")
        copy.copy_(value)
        pairs.append((value, copy))
        return copy

    kernel[tuple(grid)](*map(to_gpu, args), **{k: to_gpu(v) for k, v in kwargs.items()})
    torch.cuda.synchronize()
    for host, device in pairs:
        host.copy_(device.cpu())
    return list(args), None
