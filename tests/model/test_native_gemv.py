"""reference.native_gemv: the C one-row product equals a float64 reference on odd shapes and
thread counts, shares torch's OpenMP runtime, is cached, and gives way to torch's paths when it
cannot be built; reference.cpu_linear takes it where it won the race."""
import os
import re
import stat
import sys

import pytest
import torch

from reference import cpu_linear, native_gemv, native_step
from reference.decoding import generate
from reference.model import build_tiny
from test_cpu_linear import relative_error

needs_native = pytest.mark.skipif(not native_gemv.available(),
                                  reason=f"native GEMV not built here: {native_gemv.describe()}")


@pytest.fixture
def rebuilt(monkeypatch, tmp_path):
    """A fresh look for the library (env changes take effect), in an empty cache; restored after."""
    monkeypatch.setenv("REFERENCE_CACHE_DIR", str(tmp_path / "cache"))
    native_gemv._library.cache_clear()
    yield tmp_path
    monkeypatch.undo()
    native_gemv._library.cache_clear()


@needs_native
@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@pytest.mark.parametrize("n_in, n_out", [(1, 1), (7, 3), (16, 17), (33, 250), (576, 960), (1536, 577), (40, 4099)])
def test_equals_a_float64_reference(threads, n_in, n_out):
    gen = torch.Generator().manual_seed(n_in * 7919 + n_out)
    weight = torch.randn(n_in, n_out, generator=gen).t()                # [out, in], input-major
    x = torch.randn(1, 1, n_in, generator=gen)
    got = native_gemv.gemv(x, weight)
    assert got.shape == (1, 1, n_out) and got.dtype == torch.float32
    assert relative_error(got, x.double() @ weight.double().T) < 1e-6


@needs_native
def test_refuses_what_it_cannot_read_as_one_input_major_row():
    weight = torch.randn(32, 48).t()                                     # [48, 32] input-major
    with pytest.raises(ValueError, match="input-major"):
        native_gemv.gemv(torch.randn(1, 32), weight.contiguous())       # row-major
    with pytest.raises(ValueError):
        native_gemv.gemv(torch.randn(2, 32), weight)                    # two rows
    with pytest.raises(ValueError):
        native_gemv.gemv(torch.randn(1, 32, dtype=torch.float64), weight.double())


@needs_native
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_one_openmp_runtime_in_the_process():
    torch.ones(1 << 16).sum()                                            # torch's pool up
    native_gemv.gemv(torch.ones(1, 64), torch.ones(64, 64).t())
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
def test_without_a_build_the_race_keeps_torchs_paths(rebuilt, monkeypatch, setting):
    failing = rebuilt / "cc"
    failing.write_text("#!/bin/sh\necho 'fake cc 1.0'; [ \"$1\" = --version ]\n")
    failing.chmod(0o700)
    env = {"missing compiler": ("REFERENCE_CC", "/nonexistent/cc"),
           "failing compiler": ("REFERENCE_CC", str(failing)),
           "switched off": ("REFERENCE_NATIVE_GEMV", "0")}[setting]
    monkeypatch.setenv(*env)
    assert not native_gemv.available() and native_gemv.describe().startswith("unavailable")
    monkeypatch.setattr(cpu_linear, "_one_row_path", {})
    assert cpu_linear.one_row_path() in ("blas", "split", "packed")
    x, weight = torch.randn(1, 1, 64), torch.randn(64, 256).t()
    assert relative_error(cpu_linear.linear(x, weight), x.double() @ weight.double().T) < 1e-6


@needs_native
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_linear_takes_the_native_path_where_it_won(threads, monkeypatch):
    monkeypatch.setattr(cpu_linear, "MIN_PACKED_BYTES", 0)
    monkeypatch.setattr(cpu_linear, "_one_row_path", {threads: "native"})
    calls = []
    real = native_gemv.gemv
    monkeypatch.setattr(native_gemv, "gemv", lambda x, w: calls.append(w.shape) or real(x, w))
    x = torch.randn(1, 1, 64)
    input_major = torch.randn(64, 256).t()
    assert relative_error(cpu_linear.linear(x, input_major), x.double() @ input_major.double().T) < 1e-6
    row_major = torch.randn(256, 64)                                     # not input-major: torch's path
    assert relative_error(cpu_linear.linear(x, row_major), x.double() @ row_major.double().T) < 1e-6
    assert calls == [(256, 64)]


@needs_native
def test_greedy_tokens_equal_torchs_path(monkeypatch):
    """The tiny model's matrices through the native GEMV give the same greedy text as through BLAS
    (the model's operators: the native step, which runs batch-1 steps in one call, switched off)."""
    monkeypatch.setattr(native_step._switch, "on", False)
    monkeypatch.setattr(cpu_linear, "MIN_PACKED_BYTES", 0)
    calls = []
    real = native_gemv.gemv
    monkeypatch.setattr(native_gemv, "gemv", lambda x, w: calls.append(1) or real(x, w))
    model = build_tiny(seed=0)
    prompt = list(range(5, 25))
    tokens = {}
    for path in ("blas", "native"):
        monkeypatch.setattr(cpu_linear, "_one_row_path", dict.fromkeys(range(1, 257), path))  # any thread count
        tokens[path] = generate(model, prompt, 24)
    assert tokens["native"] == tokens["blas"]
    assert len(calls) >= 23 * (4 * model.config.n_layers + 1), "every decode step's products, natively"
