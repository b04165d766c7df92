"""Suite-wide set-up, read by pytest before any test module is imported.

Triton reads ``TRITON_INTERPRET`` when a kernel is defined, and any test module may be the first
to import ``reference.kernels`` (``test_flash_versions.py`` is collected before the kernel
tests). On a machine without CUDA the interpreter is therefore chosen here, once, for the whole
run; ``tests/kernel_support.py`` does the same when a kernel test file runs on its own.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
