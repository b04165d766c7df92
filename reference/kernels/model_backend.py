"""`use_kernels(model)`: route every attention layer of the model through our Triton kernels.

The routing itself is `reference.context.kernel_attention` (the "triton" dense backend): prefill
through `flash_attention`, one-token decode steps through `decode_attention`.
"""
from __future__ import annotations

from reference.context import DENSE_BACKENDS


def use_kernels(model, backend: str = "triton"):
    """Route every attention layer of `model` (a reference.model.Llama) through `backend`."""
    if backend not in DENSE_BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}: choose one of {DENSE_BACKENDS}")
    model.attention_backend = backend
    return model
