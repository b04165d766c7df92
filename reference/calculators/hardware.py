"""Data-centre GPUs: memory size, memory bandwidth, peak tensor throughput and on-chip SRAM.

Spec-sheet numbers, in SI units (1 GB = 10**9 bytes, 1 TB/s = 10**12 bytes/s). FLOP/s are *dense*
tensor-core peaks: NVIDIA's data sheets print the 2:4-sparsity figure first, which is twice these.
``sram_per_sm_bytes`` is the combined L1 / shared-memory array of one streaming multiprocessor
(the part a kernel may use as shared memory is a little smaller: 164 KiB on A100, 228 KiB on
H100/H200/B200).
"""
from __future__ import annotations

from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True)
class GPU:
    """One accelerator. fp8_flops is None where the tensor cores have no fp8 path (A100)."""
    name: str
    hbm_bytes: int            # device memory (HBM), bytes
    hbm_bandwidth: float      # bytes/s
    fp16_flops: float         # dense fp16/bf16 tensor-core FLOP/s
    fp8_flops: float | None   # dense fp8 tensor-core FLOP/s
    sram_per_sm_bytes: int    # L1 + shared memory per SM, bytes
    sms: int                  # streaming multiprocessors
    source: str

    @property
    def sram_bytes(self) -> int:
        """SRAM summed over all SMs."""
        return self.sram_per_sm_bytes * self.sms


_A100_SOURCE = ("NVIDIA A100 Tensor Core GPU data sheet (SXM column; 312 TFLOPS fp16 dense, "
                "624 with sparsity) and NVIDIA A100 architecture white paper (108 SMs, 192 KB "
                "L1/shared per SM)")
_HOPPER_SOURCE = ("NVIDIA {name} data sheet (SXM column; fp16/bf16 1,979 and fp8 3,958 TFLOPS are "
                  "with sparsity, halved here) and NVIDIA H100 architecture white paper (132 SMs "
                  "enabled on SXM5, 256 KB L1/shared per SM)")

GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("A100 40GB", 40 * 10**9, 1.555e12, 312e12, None, 192 * KIB, 108, _A100_SOURCE),
    GPU("A100 80GB", 80 * 10**9, 2.039e12, 312e12, None, 192 * KIB, 108, _A100_SOURCE),
    GPU("H100 SXM", 80 * 10**9, 3.35e12, 989.4e12, 1978.9e12, 256 * KIB, 132,
        _HOPPER_SOURCE.format(name="H100") + "; an H100 80GB HBM3 reports 132 SMs, 228 KiB "
        "of shared memory per SM and 85,017,493,504 bytes of memory to "
        "torch.cuda.get_device_properties (torch 2.11)"),
    GPU("H200", 141 * 10**9, 4.8e12, 989.4e12, 1978.9e12, 256 * KIB, 132,
        _HOPPER_SOURCE.format(name="H200")),
    GPU("B200", 192 * 10**9, 8.0e12, 2.25e15, 4.5e15, 256 * KIB, 148,
        "NVIDIA Blackwell architecture technical brief and HGX B200 spec (per GPU: 192 GB HBM3e, "
        "8 TB/s, fp16/bf16 4.5 and fp8 9 PFLOPS with sparsity, halved here; DGX B200 systems "
        "expose 180 GB per GPU); 148 SMs, 256 KB L1/shared per SM as on Hopper"),
)}


def gpu(name: str) -> GPU:
    """Look up a GPU of ``GPUS`` by name; unknown names raise ValueError listing the known ones."""
    if name not in GPUS:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return GPUS[name]
