"""Data-centre GPUs: memory size, memory bandwidth, peak tensor throughput and on-chip SRAM.

Spec-sheet numbers, in SI units (1 GB = 10**9 bytes, 1 TB/s = 10**12 bytes/s). FLOP/s are *dense*
tensor-core peaks: NVIDIA's data sheets print the 2:4-sparsity figure first, which is twice these.
``sram_per_sm_bytes`` is the combined L1 / shared-memory array of one streaming multiprocessor
(the part a kernel may use as shared memory is a little smaller: 164 KiB on A100, 228 KiB on
H100/H200/B200). ``exp_rate`` is how many exponentials the multi-function units compute per
second, where the table knows the clock: the softmax's scarce resource (chapter 07).
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
    fp32_flops: float | None = None   # FP32 FLOP/s off the tensor cores (FMA = 2), data sheet
    clock_hz: float | None = None     # the boost clock behind fp16_flops, Hz

    # Exponentials (and the other special functions) per SM per clock on the multi-function
    # units: CUDA C++ Programming Guide, throughput of arithmetic instructions, compute
    # capability 8.0 and 9.0 (32-bit base-2 exponential).
    EXP_PER_SM_PER_CLOCK = 16

    @property
    def sram_bytes(self) -> int:
        """SRAM summed over all SMs."""
        return self.sram_per_sm_bytes * self.sms

    @property
    def exp_rate(self) -> float | None:
        """Exponentials per second of all the multi-function units (EXP_PER_SM_PER_CLOCK x
        SMs x clock); None where the clock is not in the table."""
        if self.clock_hz is None:
            return None
        return self.EXP_PER_SM_PER_CLOCK * self.sms * self.clock_hz


_A100_SOURCE = ("NVIDIA A100 Tensor Core GPU data sheet (SXM column; 312 TFLOPS fp16 dense, "
                "624 with sparsity; 19.5 TFLOPS FP32) and NVIDIA A100 architecture white paper "
                "(108 SMs, 192 KB L1/shared per SM, 1,410 MHz boost clock)")
_HOPPER_SOURCE = ("NVIDIA {name} data sheet (SXM column; fp16/bf16 1,979 and fp8 3,958 TFLOPS are "
                  "with sparsity, halved here; 67 TFLOPS FP32) and NVIDIA H100 architecture "
                  "white paper (132 SMs enabled on SXM5, 256 KB L1/shared per SM); the 1,830 MHz "
                  "behind the tensor peak is the clock FlashAttention-3 (Shah et al. 2024) uses")

GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("A100 40GB", 40 * 10**9, 1.555e12, 312e12, None, 192 * KIB, 108, _A100_SOURCE,
        fp32_flops=19.5e12, clock_hz=1.41e9),
    GPU("A100 80GB", 80 * 10**9, 2.039e12, 312e12, None, 192 * KIB, 108, _A100_SOURCE,
        fp32_flops=19.5e12, clock_hz=1.41e9),
    GPU("H100 SXM", 80 * 10**9, 3.35e12, 989.4e12, 1978.9e12, 256 * KIB, 132,
        _HOPPER_SOURCE.format(name="H100") + "; an H100 80GB HBM3 reports 132 SMs, 228 KiB "
        "of shared memory per SM and 85,017,493,504 bytes of memory to "
        "torch.cuda.get_device_properties (torch 2.11)",
        fp32_flops=67e12, clock_hz=1.83e9),
    GPU("H200", 141 * 10**9, 4.8e12, 989.4e12, 1978.9e12, 256 * KIB, 132,
        _HOPPER_SOURCE.format(name="H200"), fp32_flops=67e12, clock_hz=1.83e9),
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
