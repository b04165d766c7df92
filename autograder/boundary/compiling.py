"""Build a Triton kernel for a real NVIDIA GPU on a machine without one, and read its budget.

The one source of the three targets and of the build: `reference/kernels/targets.py` (the
course's compile matrix) imports it, and the grader's compile worker runs `serve` (worker side:
the standard library, torch and triton only).

`triton.compile` needs no GPU: given a `GPUTarget("cuda", capability, 32)` it lowers a kernel to
PTX and runs the `ptxas` that ships with the triton wheel to build the cubin. What the build
tells us is what a launch on that GPU would meet:

- shared memory: `metadata.shared`, bytes per block. Triton refuses to load a kernel that asks
  for more than the device's opt-in limit (`OutOfResources`, triton/compiler/compiler.py); the
  limits below are NVIDIA's per-block opt-in maxima (`cudaDevAttrMaxSharedMemoryPerBlockOptin`,
  the attribute triton reads): 64 KiB on a T4, 163 KiB on an A100 (164 KiB per SM less the 1 KiB
  CUDA reserves per block), 227 KiB on an H100 (228 KiB less 1 KiB).
- registers and spills: `ptxas -v` prints them for the real build (triton passes `-v` and
  discards the log unless asked; we ask, and read only what the cubin stage printed, so that a
  kernel's own `tl.static_print` cannot pass for ptxas). A block of W warps needs W warp
  allocations of registers (32 x registers per thread, rounded up to 256) from the SM's 65536,
  and a spill is a register that lives in local memory (DRAM, behind the L1) instead.

What it does not tell: speed, races between programs, numerics that differ on a GPU (TF32,
fused multiply-add, the order of reductions). Those need a lent GPU.

Only in a process that imported triton without TRITON_INTERPRET=1: under it, `@triton.jit` makes
interpreter objects that no compiler accepts.
"""
from __future__ import annotations

import contextlib
import io
import linecache
import os
import re
import tempfile
import warnings
from dataclasses import asdict, dataclass

import torch

from autograder.boundary.protocol import read_message, write_message

REGISTERS_PER_SM = 65536           # 32-bit registers per SM, and per block, on sm_75 ... sm_90
REGISTER_ALLOCATION_UNIT = 256     # a warp's registers are allocated in units of 256
KIB = 1024


@dataclass(frozen=True)
class Target:
    """One GPU: its compute capability and the most shared memory one block may use (bytes)."""
    name: str
    capability: int
    shared_per_block: int
    source: str


DOCS = "https://docs.nvidia.com/cuda"
TARGETS = (
    Target("T4", 75, 64 * KIB, f"{DOCS}/turing-tuning-guide/ (Turing: a block may address all 64 KB); "
                               f"{DOCS}/cuda-c-programming-guide/ technical specifications, cc 7.5"),
    Target("A100", 80, 163 * KIB, f"{DOCS}/ampere-tuning-guide/ (up to 163 KB per block: 164 KB per SM, "
                                  f"1 KB reserved per block); programming guide, cc 8.0"),
    Target("H100", 90, 227 * KIB, f"{DOCS}/hopper-tuning-guide/ (up to 227 KB per block: 228 KB per SM, "
                                  f"1 KB reserved per block); programming guide, cc 9.0"),
)


@dataclass(frozen=True)
class CompileReport:
    """What ptxas and triton said about one kernel launch built for one target.

    shared_bytes: shared memory per block; registers: per thread; spill_stores, spill_loads:
    bytes per thread moved to and from local memory; threads: per block. error: the compiler's
    message when the build failed (the other numbers are then 0).
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
            out.append(f"needs {self.shared_bytes / KIB:.1f} KiB of shared memory per block; "
                       f"{a(self.target)} allows {self.shared_limit / KIB:.0f} KiB")
        if self.registers_per_block > REGISTERS_PER_SM:
            out.append(f"needs {self.registers_per_block} registers per block ({self.registers} per thread x "
                       f"{self.threads} threads); an SM has {REGISTERS_PER_SM}")
        return out


def a(name: str) -> str:
    """The name with its article, as it is read out: a T4, an A100, an H100."""
    return f"{'an' if name[0] in 'AEFHILMNORSX' else 'a'} {name}"


def target_named(name: str) -> Target:
    return next(t for t in TARGETS if t.name == name)


def require_compiler(kernel) -> None:
    """RuntimeError unless ``kernel`` is a compilable ``@triton.jit`` function."""
    from triton.runtime.jit import JITFunction
    if not isinstance(kernel, JITFunction):
        raise RuntimeError(
            "triton was imported here with TRITON_INTERPRET=1: the kernels, and triton.language's own "
            "jitted helpers (tl.max, tl.sum, ...), are interpreter objects no compiler accepts. Compile in "
            "a process without it: python -m reference.bench kernels --targets")


def specialise(kernel, args: tuple, kwargs: dict, target: Target):
    """(ASTSource, GPUTarget, options dict, identity) of `kernel[grid](*args, **kwargs)` on
    `target`, as a launch there would specialise it: tensors stand for pointers (their dtype and
    16-byte alignment count, not their device), ints are specialised like a launch's (1, multiples
    of 16); kwargs: the constexprs plus num_warps / num_stages. identity: a tuple of what makes two
    builds of one source the same."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature
    require_compiler(kernel)
    gpu = GPUTarget("cuda", target.capability, 32)
    backend = make_backend(gpu)
    bound, specialization, options = create_function_from_signature(kernel.signature, kernel.params, backend)(
        *args, **kwargs)
    with warnings.catch_warnings():        # fusion on: the default a launch takes (triton 3.9 warns of 3.10's)
        warnings.filterwarnings("ignore", "TRITON_DEFAULT_FP_FUSION")
        options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    identity = (signature, sorted(constexprs.items()), sorted(attrs.items()), sorted(options.__dict__.items()),
                target, triton.__version__)
    return ASTSource(kernel, signature, constexprs, attrs), gpu, options.__dict__, identity


def build(kernel, args: tuple, kwargs: dict, target: Target) -> tuple[CompileReport, str]:
    """Build `kernel[grid](*args, **kwargs)` for `target` (never from triton's cache, so that
    ptxas runs) and return its report and PTX ("" when the build failed)."""
    import triton
    from triton import knobs
    source, gpu, options, _ = specialise(kernel, args, kwargs, target)
    cubin_log = io.StringIO()

    def read_ptxas_log(backend=None, stages=None, *_):  # only the cubin stage's own output
        if stages is None:                                  # asked for a cache key (the build skips the cache)
            return "course-ptxas-log", "1"
        make_cubin = stages["cubin"]

        def logged(src, metadata):
            with contextlib.redirect_stdout(cubin_log):
                return make_cubin(src, metadata)
        stages["cubin"] = logged

    with knobs.nvidia.scope(), knobs.compilation.scope(), knobs.cache.scope(), knobs.runtime.scope(), \
            tempfile.TemporaryDirectory() as scratch, contextlib.redirect_stdout(io.StringIO()), \
            warnings.catch_warnings():
        warnings.filterwarnings("ignore", "TRITON_DEFAULT_FP_FUSION")
        knobs.nvidia.dump_ptxas_log = True
        knobs.compilation.always_compile = True
        knobs.cache.dir = scratch
        knobs.runtime.add_stages_inspection_hook = read_ptxas_log
        try:
            compiled = triton.compile(source, target=gpu, options=options)
        except Exception as exc:  # noqa: BLE001  (any compiler failure is the verdict)
            return CompileReport(target.name, shared_limit=target.shared_per_block, error=compiler_message(exc)), ""
    report = CompileReport(target.name, shared_bytes=compiled.metadata.shared, shared_limit=target.shared_per_block,
                           threads=compiled.metadata.num_warps * 32, **ptxas_usage(cubin_log.getvalue()))
    return report, compiled.asm.get("ptx", "")


def compiler_message(exc: BaseException) -> str:
    """The compiler's error in a few lines: triton's `at L:C:` position, the source line it
    points at and the last line of its message (a traceback's worth of text is no help)."""
    lines = [line.rstrip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    where = next((i for i, line in enumerate(lines) if re.match(r"at \d+:\d+:", line)), None)
    if where is None:
        return lines[-1][:400]
    caret = next((i for i in range(where + 1, len(lines)) if set(lines[i].strip()) == {"^"}), None)
    pointed = lines[caret - 1].strip() if caret else ""
    return f"{lines[where]} {pointed} -> {lines[-1].strip()}"[:500]


def ptxas_usage(log: str) -> dict[str, int]:
    """registers, spill_stores, spill_loads (bytes) from a `ptxas -v` log of one kernel."""
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    registers = re.search(r"Used (\d+) registers", log)
    if not (spills and registers):
        raise ValueError(f"no register or spill line in the ptxas log:\n{log}")
    return {"registers": int(registers[1]), "spill_stores": int(spills[1]), "spill_loads": int(spills[2])}


# ------------------------------------------------------------------ the grader's compile worker

CANARY = '''
import triton
import triton.language as tl


@triton.jit
def canary(x_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets) * 2)
'''


def load_kernel(source: str, name: str, folder: str):
    """The `@triton.jit` function `name` that `source` defines, from a file of its own in
    `folder` (triton reads a kernel's source with inspect)."""
    path = os.path.join(folder, f"{re.sub(r'[^A-Za-z0-9_]', '_', name)}.py")
    with open(path, "w") as handle:
        handle.write(source)
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    scope = {"__name__": f"__compiled_{name}__"}
    exec(compile(source, path, "exec"), scope)
    return scope[name]


def standins(args: list) -> tuple:
    """The launch's arguments from the wire: ``("tensor", dtype name)`` becomes a small CPU
    tensor of that dtype (16-byte aligned, as a GPU allocation is); numbers stay."""
    return tuple(torch.empty(16, dtype=getattr(torch, a[1])) if isinstance(a, (list, tuple)) else a
                 for a in args)


def compile_request(request: dict, folder: str) -> dict:
    """Reports for ``request``: ``source`` (the kernel and the jit functions it calls, nothing
    else of the cell), ``name``, ``launches`` (``[args, kwargs]`` pairs) and ``targets`` (names).
    Returns ``{"reports": [[report per target] per launch], "environment": None or why no build
    works here}``: when every build fails, the built-in canary kernel says whose fault it is."""
    kernel = load_kernel(request["source"], request["name"], folder)
    targets = [target_named(name) for name in request["targets"]]
    reports = [[asdict(build(kernel, standins(args), kwargs, target)[0]) for target in targets]
               for args, kwargs in request["launches"]]
    environment = None
    if all(r["error"] for row in reports for r in row):
        canary = load_kernel(CANARY, "canary", folder)
        broken = build(canary, standins([("tensor", "float32")]), {"BLOCK": 16}, targets[0])[0].error
        environment = broken and f"this grading environment cannot build any kernel for a GPU: {broken}"
    return {"reports": reports, "environment": environment}


def serve(in_fd: int, out_fd: int, folder: str, describe) -> None:
    """The compile worker's request loop: each request is answered by `compile_request`; what
    the kernel's source raises on loading becomes ``ok: False`` with ``describe(exc)``."""
    cells = os.path.join(folder, "compiled_kernels")
    os.makedirs(cells, exist_ok=True)
    while True:
        try:
            request = read_message(in_fd)
        except EOFError:
            os._exit(0)
        try:
            reply = {"op": "done", "ok": True, "value": compile_request(request, cells)}
        except BaseException as exc:  # noqa: BLE001 - the kernel's source may raise anything
            reply = {"op": "done", "ok": False, "error": describe(exc)}
        write_message(out_fd, reply)
