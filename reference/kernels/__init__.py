"""Triton kernels of chapters 05-07, each with its PyTorch reference beside it.


On a machine without a CUDA GPU, set TRITON_INTERPRET=1 before importing this package to run
the kernels in Triton's interpreter.
"""
from reference.kernels.flash_attention import flash_attention
from reference.kernels.softmax import softmax

