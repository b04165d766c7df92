"""Compile a Triton kernel for a real NVIDIA GPU on a machine without one, and read its budget.

`triton.compile` needs no GPU: given a `GPUTarget("cuda", capability, 32)` it lowers a kernel to
PTX and runs the `ptxas` that ships with the triton wheel to build the cubin. What the build
tells us is what a launch on that GPU would meet:

- shared memory: `metadata.shared`, bytes per block. Triton refuses to load a kernel that asks
  for more than the device's opt-in limit (`OutOfResources`, triton/compiler/compiler.py); the
  limits below are NVIDIA's per-block opt-in maxima (`cudaDevAttrMaxSharedMemoryPerBlockOptin`,
  the attribute triton reads): 64 KiB on a T4, 163 KiB on an A100 (164 KiB per SM less the 1 KiB
  CUDA reserves per block), 227 KiB on an H100 (228 KiB less 1 KiB).
- registers and spills: `ptxas -v` prints them for the real build (triton passes `-v` and
  discards the log unless asked; we ask). A block of W warps needs W warp allocations of
  registers (32 x registers per thread, rounded up to 256) from the SM's 65536, and a spill is
  a register that lives in local memory (DRAM, behind the L1) instead.

What it does not tell: speed, races between programs, numerics that differ on a GPU (TF32,
fused multiply-add, the order of reductions). Those need a lent GPU.

    from reference.kernels.targets import TARGETS, compile_for
    report = compile_for(kernel, args, {"BLOCK": 1024, "num_warps": 4}, TARGETS[0])

Only in a process that imported triton without TRITON_INTERPRET=1 (the tests, which set it, run
`python -m reference.bench kernels --targets` as a child process).

Reports are cached as JSON keyed by the kernel's source hash (its callees included), the
launch's specialisation, options, target and triton version, under COMPILE_REPORT_CACHE
(default: <tempdir>/llm-course-compile-reports): a second run of the same source is free.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

REGISTERS_PER_SM = 65536           # 32-bit registers per SM, and per block, on sm_75 ... sm_90
REGISTER_ALLOCATION_UNIT = 256     # a warp's registers are allocated in units of 256


@dataclass(frozen=True)
class Target:
    """One GPU: its compute capability and the most shared memory one block may use (bytes)."""
    name: str
    capability: int
    shared_per_block: int
    source: str


DOCS = "https://docs.nvidia.com/cuda"
TARGETS = (
    Target("T4", 75, 64 * 1024, f"{DOCS}/turing-tuning-guide/ (Turing: a block may address all 64 KB); "
                                f"{DOCS}/cuda-c-programming-guide/ technical specifications, cc 7.5"),
    Target("A100", 80, 163 * 1024, f"{DOCS}/ampere-tuning-guide/ (up to 163 KB per block: 164 KB per SM, "
                                   f"1 KB reserved per block); programming guide, cc 8.0"),
    Target("H100", 90, 227 * 1024, f"{DOCS}/hopper-tuning-guide/ (up to 227 KB per block: 228 KB per SM, "
                                   f"1 KB reserved per block); programming guide, cc 9.0"),
)


@dataclass(frozen=True)
class CompileReport:
    """What ptxas and triton said about one kernel launch built for one target.

    shared_bytes: shared memory per block; registers: per thread; spill_stores, spill_loads:
    bytes per thread moved to and from local memory; threads: per block. error: the compiler's
    first line when the build failed (the other numbers are then 0).
    """
    target: str
    shared_bytes: int = 0
    shared_limit: int = 0
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    threads: int = 0
    error: str | None = None

    @property
    def registers_per_block(self) -> int:
        per_warp = -(-self.registers * 32 // REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
        return per_warp * (self.threads // 32)

    @property
    def spills(self) -> bool:
        return self.spill_stores + self.spill_loads > 0

    def problems(self) -> list[str]:
        """Why this launch would not run on the target (empty: it would). Spills are not here:
        they run, slowly; callers decide which spills they accept."""
        if self.error:
            return [f"does not compile for {self.target}: {self.error}"]
        out = []
        if self.shared_bytes > self.shared_limit:
            out.append(f"needs {self.shared_bytes} B of shared memory per block; a {self.target} "
                       f"allows {self.shared_limit} B")
        if self.registers_per_block > REGISTERS_PER_SM:
            out.append(f"needs {self.registers_per_block} registers per block ({self.registers} per thread x "
                       f"{self.threads} threads); an SM has {REGISTERS_PER_SM}")
        return out


def cache_dir() -> Path:
    return Path(os.environ.get("COMPILE_REPORT_CACHE",
                               Path(tempfile.gettempdir()) / "llm-course-compile-reports"))


def compile_for(kernel, args: tuple, kwargs: dict, target: Target) -> CompileReport:
    """Build `kernel[grid](*args, **kwargs)` for `target` as a launch there would, and report.

    args: as for a launch (tensors stand for pointers: their dtype and 16-byte alignment count,
    not their device; ints are specialised like a launch's: 1, multiples of 16); kwargs: the
    constexprs plus num_warps / num_stages.
    """
    if not isinstance(kernel, JITFunction):
        raise RuntimeError(
            "triton was imported here with TRITON_INTERPRET=1: the kernels, and triton.language's own "
            "jitted helpers (tl.max, tl.sum, ...), are interpreter objects no compiler accepts. Compile in "
            "a process without it: python -m reference.bench kernels --targets")
    jit = kernel
    gpu = GPUTarget("cuda", target.capability, 32)
    backend = make_backend(gpu)
    bound, specialization, options = create_function_from_signature(jit.signature, jit.params, backend)(
        *args, **kwargs)
    with warnings.catch_warnings():        # fusion on: the default a launch takes (triton 3.9 warns of 3.10's)
        warnings.filterwarnings("ignore", "TRITON_DEFAULT_FP_FUSION")
        options, signature, constexprs, attrs = jit._pack_args(backend, kwargs, bound, specialization, options)
    key = hashlib.sha256(repr((jit.cache_key, signature, sorted(constexprs.items()), sorted(attrs.items()),
                               sorted(options.__dict__.items()), target, triton.__version__)).encode()).hexdigest()
    cached = cache_dir() / f"{key}.json"
    if cached.exists():
        return CompileReport(**json.loads(cached.read_text()))
    report = _build(ASTSource(jit, signature, constexprs, attrs), gpu, options.__dict__, target)
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(dataclasses.asdict(report)))
    return report


def _build(source: ASTSource, gpu: GPUTarget, options: dict, target: Target) -> CompileReport:
    """Compile (never from triton's cache, so that ptxas runs) and read ptxas's verbose log."""
    log = io.StringIO()
    with knobs.nvidia.scope(), knobs.compilation.scope(), knobs.cache.scope(), \
            tempfile.TemporaryDirectory() as scratch, contextlib.redirect_stdout(log), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "TRITON_DEFAULT_FP_FUSION")
        knobs.nvidia.dump_ptxas_log = True
        knobs.compilation.always_compile = True
        knobs.cache.dir = scratch
        try:
            compiled = triton.compile(source, target=gpu, options=options)
        except Exception as exc:  # noqa: BLE001  (any compiler failure is the verdict)
            last = [line.strip() for line in str(exc).splitlines() if line.strip()][-1:] or [type(exc).__name__]
            return CompileReport(target.name, shared_limit=target.shared_per_block, error=last[0])
    return CompileReport(target.name, shared_bytes=compiled.metadata.shared, shared_limit=target.shared_per_block,
                         threads=compiled.metadata.num_warps * 32, **ptxas_usage(log.getvalue()))


def ptxas_usage(log: str) -> dict[str, int]:
    """registers, spill_stores, spill_loads (bytes) from a `ptxas -v` log of one kernel."""
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    registers = re.search(r"Used (\d+) registers", log)
    if not (spills and registers):
        raise ValueError(f"no register or spill line in the ptxas log:\n{log}")
    return {"registers": int(registers[1]), "spill_stores": int(spills[1]), "spill_loads": int(spills[2])}
