"""Launching a learner's Triton kernel where the grader's tensors live on the CPU.

Graders build their inputs (and NaN-poisoned outputs) on the CPU. Under ``TRITON_INTERPRET=1``
the kernel reads them there. Where a CUDA GPU runs the kernel compiled, each tensor argument is
copied to the GPU with the same sizes and strides (so strides the grader passes stay true), the
kernel runs, and every tensor's contents are copied back into the grader's CPU tensor.

The launch's memory traffic is counted in the interpreter (``autograder.boundary.traffic``): a
compiled launch is run a second time there, on copies of its arguments, for the count alone.
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
    and the launch's memory traffic (``traffic.Recording.wire()``). Where the kernel runs
    compiled on a GPU, its traffic is counted by running it once more in the interpreter, on
    copies of the arguments as they were before the launch (``interpreted_traffic``)."""
    if not runs_compiled():
        return list(args), interpreted_traffic(kernel, grid, args, kwargs)
    before = ([_copy(a, "cpu") for a in args], {k: _copy(v, "cpu") for k, v in kwargs.items()})
    pairs = []

    def to_gpu(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.is_cuda:
            return value
        copy = _copy(value, "cuda")
        pairs.append((value, copy))
        return copy

    kernel[tuple(grid)](*map(to_gpu, args), **{k: to_gpu(v) for k, v in kwargs.items()})
    torch.cuda.synchronize()
    for host, device in pairs:
        host.copy_(device.cpu())
    return list(args), interpreted_traffic(kernel, grid, *before)


def _copy(value: Any, device: str) -> Any:
    """A tensor's copy on ``device`` with the same sizes and strides (anything else as is)."""
    if not isinstance(value, torch.Tensor):
        return value
    copy = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=device)
    return copy.copy_(value)


def interpreted_traffic(kernel: Any, grid: tuple[int, ...], args: tuple, kwargs: dict
                        ) -> dict | None:
    """Launch ``kernel`` in Triton's interpreter on ``args`` (CPU tensors) and return its
    memory traffic. A compiled kernel (``JITFunction``) is interpreted from its Python function,
    the ``@triton.jit`` functions it calls too (they are put back afterwards); an autotuned one
    is not counted (None)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    traffic.install()
    if isinstance(kernel, InterpretedFunction):
        with traffic.recording(args, kwargs) as record:
            kernel[tuple(grid)](*args, **kwargs)
        return record.wire()
    if not isinstance(kernel, JITFunction):
        return None
    names = kernel.fn.__globals__
    compiled = {name: value for name, value in list(names.items())
                if isinstance(value, JITFunction)}
    try:
        names.update({name: InterpretedFunction(value.fn) for name, value in compiled.items()})
        with traffic.recording(args, kwargs) as record:
            InterpretedFunction(kernel.fn)[tuple(grid)](*args, **kwargs)
    finally:
        names.update(compiled)
    return record.wire()
