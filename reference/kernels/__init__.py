"""Triton kernels of chapters 05-08, each with its PyTorch reference beside it.

    from reference.kernels import softmax, flash_attention, decode_attention
    from reference.kernels import store_kv, paged_decode_attention

On a machine without a CUDA GPU, set TRITON_INTERPRET=1 before importing this package to run
the kernels in Triton's interpreter.
"""
from reference import _report_moved
from reference.kernels.decode_attention import decode_attention
from reference.kernels.flash_attention import flash_attention
from reference.kernels.paged_attention import paged_decode_attention, store_kv
from reference.kernels.softmax import softmax

_report_moved(__path__)   # reference.kernels.versions (reference.MOVED)

__all__ = ["decode_attention", "flash_attention", "paged_decode_attention", "softmax", "store_kv"]
