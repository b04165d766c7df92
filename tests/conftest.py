"""Suite-wide set-up, read by pytest before any test module is imported.

Triton reads ``TRITON_INTERPRET`` when a kernel is defined, and any test module may be the first
to import ``reference.kernels`` (``test_flash_versions.py`` is collected before the kernel
tests). On a machine without CUDA the interpreter is therefore chosen here, once, for the whole
run; ``tests/kernel_support.py`` does the same when a kernel test file runs on its own.
"""
import os

# Under xdist the workers share the cores: each takes its share of threads, and so does every
# process a test starts (command lines, Jupyter kernels, the sandbox's workers). Threads beyond
# the cores only wait for each other (a third more CPU time on 2 cores, measured).
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // WORKERS))

import pytest  # noqa: E402 - after the thread count, which torch reads when imported
import torch  # noqa: E402

if WORKERS > 1:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker more than the cores (``--maxprocesses`` caps it). Many tests wait on
    a process they started (a sandbox worker, a Jupyter kernel, a grader command line); a spare
    worker runs in those gaps. On 2 cores, 3 workers took the suite from about 370 s to 330 s
    of wall time for the same work (idle CPU time 50 -> 6 s)."""
    return len(os.sched_getaffinity(0)) + 1


@pytest.fixture(scope="session")
def real_model():
    """(model, tokenizer) of SmolLM2-135M-Instruct in float32, loaded once per test session.
    Tests must not change it (use their own load_model for that)."""
    from reference.model import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def hf_peer():
    """Hugging Face transformers' Llama on the same GGUF file (`load_hf_peer`), loaded once per
    test session (~17 CPU-seconds: transformers parses the file twice). Every test that uses it
    is in one xdist group, so one worker loads it. Tests must not change it."""
    from reference.bench.hf_peer import load_hf_peer

    return load_hf_peer()


@pytest.fixture
def threads(request):
    """torch's thread count set to the test's parameter (indirect=True), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.hookimpl(tryfirst=True)   # before xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """The suite runs over xdist workers (``--dist loadgroup``, pyproject.toml): a test that uses
    a module-scoped fixture (a model loaded, a course directory built, a zip graded) joins its
    module's group, so the fixture is made once, in one worker; the other tests spread one by
    one. A test that names its own group (the self-checks: one per chapter) keeps it; the tests
    that use HF's model (``hf_peer``) share one group."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        if "hf_peer" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("hf_peer"))
            continue
        definitions = getattr(item, "_fixtureinfo", None)
        scopes = {d.scope for defs in (definitions.name2fixturedefs.values() if definitions else ())
                  for d in defs}
        if "module" in scopes:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
