"""The course's native CPU code, compiled into one library: the batch-1 pass over 1 to 16 new
positions, a decode step among them (native_step.c), and the products it runs on its packed
weights (native_gemv.c), the engine's
decode attention read in the paged pool (native_attention.c) and its steps' element-wise work
(native_batch.c). Hand-written because a decode step's cost is reading the weights, and torch's
operators, one dispatch, allocation and fork/join of the threads each, do not get there.

Built at first use with the C compiler found as $REFERENCE_CC, $CC or `cc` (`-O3 -march=native`,
~0.3 s), into a cache directory ($REFERENCE_CACHE_DIR, else $XDG_CACHE_HOME or ~/.cache, under
llm-inference-course/, owner-only) keyed by a hash of the source, the compiler and its version,
the flags, the OpenMP runtime and the CPU; later processes load it from there. The library links
the OpenMP runtime file this process has already loaded (torch's own libgomp), so its threads are
torch's pool: linked with a plain `-fopenmp` it would load the system's libgomp beside torch's
wherever torch's copy has another name: a second pool of spinning threads on the same cores
(measured within noise of the shared pool with nothing else running; it can only cost under
load). It is called through ctypes (which releases the GIL) with the tensors' data pointers.
Where there is no compiler, the build fails, or REFERENCE_NATIVE_GEMV=0, `available()` is False:
`reference.cpu.CpuModel` then runs its steps with torch's operators, which give the same numbers up
to float rounding.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path


# The batch-1 pass (native_step.c) and its products (native_gemv.c), the engine's paged decode
# attention (native_attention.c) and its steps' element-wise work (native_batch.c): one library.
SOURCES = [Path(__file__).with_name(name)
           for name in ("native_gemv.c", "native_step.c", "native_attention.c", "native_batch.c")]
HEADERS = [Path(__file__).with_name("native_math.h")]   # included by the sources: part of the build key
FLAGS = ["-O3", "-march=native", "-fPIC", "-fopenmp"]

# Why the library is missing, for `describe()`; None while it loads or once it has loaded.
_why_not: str | None = None


def describe() -> str:
    """'native (PATH)' where the library loaded, else 'unavailable: REASON'."""
    lib = _library()
    return f"native ({lib._name})" if lib is not None else f"unavailable: {_why_not}"


def available() -> bool:
    """Whether the native library is built and loaded in this process (built on first call)."""
    return _library() is not None


@functools.cache
def _library() -> ctypes.CDLL | None:
    global _why_not
    if os.environ.get("REFERENCE_NATIVE_GEMV", "1") == "0":
        _why_not = "switched off (REFERENCE_NATIVE_GEMV=0)"
        return None
    try:
        lib = ctypes.CDLL(str(_build()))
    except Exception as error:  # no compiler, a failed build, an unloadable file: torch's paths instead
        _why_not = f"{type(error).__name__}: {str(error).strip()[:300]}"
        return None
    pointer, size = ctypes.c_void_p, ctypes.c_long
    lib.step_work_floats.argtypes = [pointer, size, ctypes.c_int]
    lib.step_work_floats.restype = size
    lib.forward_pass.argtypes = [pointer, size, pointer, size, pointer, pointer, pointer, pointer, pointer,
                                 pointer, pointer, ctypes.c_float, pointer, size, pointer, pointer, ctypes.c_int]
    lib.forward_pass.restype = size
    lib.stream_step.argtypes = [pointer, size, pointer, pointer, pointer, pointer, pointer, ctypes.c_int]
    lib.stream_step.restype = None
    lib.paged_decode_attention.argtypes = [pointer, pointer, size, pointer, pointer, pointer, pointer,
                                           size, pointer, ctypes.c_int]
    lib.paged_decode_attention.restype = None
    lib.batch_rms_norm.argtypes = [pointer, pointer, pointer, pointer, size, size, ctypes.c_float, ctypes.c_int]
    lib.batch_silu_mul.argtypes = [pointer, pointer, size, size, ctypes.c_int]
    lib.batch_rope_store.argtypes = [pointer, pointer, pointer, pointer, pointer, pointer, size, pointer,
                                     ctypes.c_int]
    for name in ("batch_rms_norm", "batch_silu_mul", "batch_rope_store"):
        getattr(lib, name).restype = None
    return lib


def _build() -> Path:
    """The compiled library's path, compiled now unless the cache holds it already."""
    compiler = os.environ.get("REFERENCE_CC") or os.environ.get("CC") or "cc"
    executable = shutil.which(compiler)
    if executable is None:
        raise OSError(f"no C compiler {compiler!r} on PATH")
    runtime = _openmp_runtime()
    version = subprocess.run([executable, "--version"], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    key = hashlib.sha256(b"\0".join(
        [*(source.read_bytes() for source in SOURCES + HEADERS), executable.encode(), version.encode(),
         " ".join(FLAGS).encode(), str(runtime).encode(), _cpu_identity().encode()])).hexdigest()[:16]
    directory = _cache_dir()
    library = directory / f"native_gemv-{key}.so"
    if library.exists():
        return library
    with tempfile.TemporaryDirectory(dir=directory) as work:
        objects, built = [Path(work, source.stem + ".o") for source in SOURCES], Path(work, "native.so")
        for source, obj in zip(SOURCES, objects):
            _run([executable, *FLAGS, "-c", str(source), "-o", str(obj)])
        # Link the runtime this process already uses by its file (-fopenmp at link time would add -lgomp).
        link = ([str(runtime), f"-Wl,-rpath,{runtime.parent}"] if runtime else ["-fopenmp"])
        _run([executable, "-shared", *map(str, objects), *link, "-lm", "-o", str(built)])
        os.replace(built, library)  # atomic: a process compiling beside this one finds a whole file
    return library


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise subprocess.SubprocessError(f"{' '.join(command)}: {done.stderr}")


def _openmp_runtime() -> Path | None:
    """The file of the OpenMP runtime loaded in this process (torch's libgomp), from /proc/self/maps."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        path = fields[5].strip() if len(fields) == 6 else ""
        if re.fullmatch(r"lib(gomp|iomp5|omp)\b[-.\w]*\.so[.\d]*", os.path.basename(path)):
            return Path(path)
    return None


def _cpu_identity() -> str:
    """What -march=native depends on: the CPU's model and feature flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        return "\n".join(re.findall(r"^(?:model name|flags|Features)\s*:.*$", info, re.M)[:2])
    except OSError:
        return platform.processor() + platform.machine()


def _cache_dir() -> Path:
    """An owner-only directory for the compiled library: created if missing, refused (a fresh
    temporary directory instead) when another user owns it or others may write to it."""
    root = os.environ.get("REFERENCE_CACHE_DIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "llm-inference-course")
    directory = Path(root)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        status = directory.stat()
        if status.st_uid == os.getuid() and not status.st_mode & 0o022:
            return directory
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="native_gemv-"))
