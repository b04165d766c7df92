"""reference.cpu.native_gemv: the course's native library shares torch's OpenMP runtime, is built
once into an owner-only cache, and gives way to torch's operators when it cannot be built."""
import os
import re
import stat
import sys

import pytest
import torch

from reference.cpu import CpuModel, native_gemv
from reference.model import build_tiny
from test_cpu_linear import relative_error

needs_native = pytest.mark.skipif(not native_gemv.available(),
                                  reason=f"native code not built here: {native_gemv.describe()}")


@pytest.fixture
def rebuilt(monkeypatch, tmp_path):
    """A fresh look for the library (env changes take effect), in an empty cache; restored after."""
    monkeypatch.setenv("REFERENCE_CACHE_DIR", str(tmp_path / "cache"))
    native_gemv._library.cache_clear()
    yield tmp_path
    monkeypatch.undo()
    native_gemv._library.cache_clear()


@needs_native
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_one_openmp_runtime_in_the_process():
    torch.ones(1 << 16).sum()                                            # torch's pool up
    fast = CpuModel(build_tiny(0))
    cache = fast.new_cache(1, 8)
    fast(torch.tensor([[1, 2]]), cache=cache)
    fast(torch.tensor([[3]]), cache=cache)                               # a native step
    runtimes = {line.split()[-1] for line in open("/proc/self/maps")
                if re.fullmatch(r"lib(gomp|iomp5|omp)\b[-.\w]*\.so[.\d]*", line.rsplit("/", 1)[-1].strip())}
    assert len(runtimes) == 1, f"two OpenMP runtimes loaded: {runtimes}"


@needs_native
def test_built_once_into_an_owner_only_cache(rebuilt):
    assert native_gemv.available()
    library = native_gemv._library()._name
    cache = rebuilt / "cache"
    assert os.path.dirname(library) == str(cache)
    assert stat.S_IMODE(cache.stat().st_mode) & 0o077 == 0
    modified = os.stat(library).st_mtime_ns
    native_gemv._library.cache_clear()
    assert native_gemv._library()._name == library and os.stat(library).st_mtime_ns == modified


@pytest.mark.parametrize("setting", ["missing compiler", "failing compiler", "switched off"])
def test_without_a_build_the_steps_run_torchs_operators(rebuilt, monkeypatch, setting):
    failing = rebuilt / "cc"
    failing.write_text("#!/bin/sh\necho 'fake cc 1.0'; [ \"$1\" = --version ]\n")
    failing.chmod(0o700)
    env = {"missing compiler": ("REFERENCE_CC", "/nonexistent/cc"),
           "failing compiler": ("REFERENCE_CC", str(failing)),
           "switched off": ("REFERENCE_NATIVE_GEMV", "0")}[setting]
    monkeypatch.setenv(*env)
    assert not native_gemv.available() and native_gemv.describe().startswith("unavailable")
    model = build_tiny(1)
    fast, cache, plain_cache = CpuModel(model), model.new_cache(1, 8), model.new_cache(1, 8)
    fast(torch.tensor([[1, 2]]), cache=cache), model(torch.tensor([[1, 2]]), cache=plain_cache)
    got, want = fast(torch.tensor([[3]]), cache=cache), model(torch.tensor([[3]]), cache=plain_cache)
    assert relative_error(got, want) < 1e-5
