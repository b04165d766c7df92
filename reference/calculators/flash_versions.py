"""Which FlashAttention version to use on which GPU, as a small rule with its sources.

The facts, each from the project's own README or paper (see book/references.bib):

- FlashAttention 1.x runs on Turing and Ampere GPUs, head dimensions that are multiples of 8 up
  to 128; its backward pass for head dimensions above 64 needs an A100 or H100, so on a Turing
  card (T4, RTX 2080) it can train only with head dimension <= 64 (FlashAttention 1.x README).
- FlashAttention-2 supports Ampere, Ada and Hopper GPUs, all head dimensions up to 256, and sends
  Turing users back to 1.x (FlashAttention-2 README; dao2023flashattention2).
- FlashAttention-3 is written for Hopper only (H100/H800 and the H200 of the same architecture):
  FP16/BF16 forward and backward, FP8 forward (FlashAttention-3 README; shah2024flashattention3).
- FlashAttention-4 (CuTe-DSL) targets datacenter Blackwell (B200, GB200) and also runs on
  Hopper (flash-attn-4 package description; flashattention4_2026); on Hopper, FA3 remains the
  mature default (NVIDIA TransformerEngine prefers FA3 over FA4 on SM90, FA4's SM90 backward
  being limited).
- No FlashAttention release supports Volta (V100) or older: use PyTorch's memory-efficient
  scaled_dot_product_attention backend there.

Version 0 means "no FlashAttention kernel fits". The table stops at head dimension 128, which
every version supports in the forward pass.
"""
from __future__ import annotations

from typing import NamedTuple

from reference.calculators.memory import whole_number

# GPU name (upper case) -> architecture generation
GPU_GENERATIONS = {
    "P100": "Pascal", "V100": "Volta",
    "T4": "Turing", "RTX 2080": "Turing",
    "A100": "Ampere", "A10": "Ampere", "A6000": "Ampere", "RTX 3090": "Ampere",
    "L4": "Ada", "L40S": "Ada", "RTX 4090": "Ada",
    "H100": "Hopper", "H200": "Hopper", "H800": "Hopper",
    "B200": "Blackwell", "GB200": "Blackwell",
}
HEAD_DIMS = tuple(range(8, 129, 8))       # multiples of 8 up to 128
FA1_TURING_TRAIN_MAX_HEAD_DIM = 64        # FA1 backward above 64 needs A100/H100


class FlashChoice(NamedTuple):
    """The version to use (0: none fits, else 1-4) and why, naming the GPU's generation."""
    version: int
    reason: str


def pick_flash(gpu: str, training: bool, head_dim: int = 64) -> FlashChoice:
    """The FlashAttention version for `gpu` (a name of GPU_GENERATIONS, any case), for training
    (forward and backward) or inference (forward only), at head dimension `head_dim`.

    Raises ValueError for an unknown GPU or a head dimension outside HEAD_DIMS, TypeError when
    `training` is not a bool.
    """
    original = head_dim
    if not isinstance(gpu, str) or gpu.strip().upper() not in GPU_GENERATIONS:
        raise ValueError(f"unknown GPU {gpu!r}; known: {', '.join(GPU_GENERATIONS)}")
    if not isinstance(training, bool):
        raise TypeError(f"training must be True or False, got {training!r}")
    try:   # a whole-number float (64.0) is accepted
        head_dim = whole_number("head_dim", head_dim)
    except TypeError:
        head_dim = None
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be a multiple of 8 from 8 to 128, got {original!r}")
    generation = GPU_GENERATIONS[gpu.strip().upper()]
    if generation in ("Pascal", "Volta"):
        return FlashChoice(0, f"{generation}: no FlashAttention version supports it; "
                              "use PyTorch's memory-efficient attention")
    if generation == "Turing":
        if training and head_dim > FA1_TURING_TRAIN_MAX_HEAD_DIM:
            return FlashChoice(0, f"Turing: FlashAttention 1.x's backward above head dim "
                                  f"{FA1_TURING_TRAIN_MAX_HEAD_DIM} needs an A100 or H100, and "
                                  "FlashAttention-2 does not run on Turing")
        return FlashChoice(1, "Turing: FlashAttention-2 needs Ampere or newer; 1.x runs on Turing")
    if generation in ("Ampere", "Ada"):
        return FlashChoice(2, f"{generation}: FlashAttention-2 supports it; FA3 is Hopper-only")
    if generation == "Hopper":
        return FlashChoice(3, "Hopper: FlashAttention-3 was built for it (TMA, WGMMA, warp "
                              "specialisation) and is the mature default there")
    return FlashChoice(4, "Blackwell: FlashAttention-4 targets its asynchronous MMA and tensor memory")
