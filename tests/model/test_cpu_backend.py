"""The fast CPU path against the model it is built from (llm.c's one parity test): on the real
model and a tiny one, `reference.cpu.CpuModel`'s logits equal the plain model's and both equal a
float64 run, for a prefill, batch-1 decode steps, passes over 2 to 16 new positions after a cached
prefix (their keys and values too) and an engine step; the backend is chosen, refused and kept as
`backend_for` says; importing the course changes nothing."""
import copy
import subprocess
import sys

import pytest
import torch

from reference.cpu import CpuModel, backend_for, native_gemv, native_step
from reference.decoding import generate
from reference.model import build_tiny
from test_cpu_linear import relative_error


def _passes(model, fast, model64, prompt: list[int], steps: list[int], verify: list[int]):
    """(backend, plain, float64) logits of a prefill, decode steps and a multi-position pass."""
    out = []
    for runner in (fast, model, model64):
        cache = model64.new_cache(1, 64) if runner is model64 else model.new_cache(1, 64)
        logits = [runner(torch.tensor([prompt]), cache=cache)[:, -1]]
        logits += [runner(torch.tensor([[t]]), cache=cache) for t in steps]
        logits.append(runner(torch.tensor([verify]), cache=cache))
        out.append(logits)
    return out


@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_the_backend_and_the_plain_model_agree_with_float64(which, request):
    if which == "tiny":
        model = build_tiny(seed=1)
        prompt, steps, verify = list(range(3, 20)), [5, 9, 11], [4, 8, 15, 16, 23]
    else:
        model, tok = request.getfixturevalue("real_model")
        prompt = tok.chat_ids("Why is the sky blue?")
        steps, verify = tok.encode(" Light scatters")[:3], tok.encode(" off the air molecules")[:5]
    fast, model64 = CpuModel(model), copy.deepcopy(model).double()
    got, plain, want = _passes(model, fast, model64, prompt, steps, verify)
    for i, (g, p, w) in enumerate(zip(got, plain, want)):
        assert relative_error(g, w) < 1e-5, f"backend vs float64, pass {i}"
        assert relative_error(p, w) < 1e-5, f"plain model vs float64, pass {i}"


@pytest.mark.skipif(not native_gemv.available(), reason=f"native code not built: {native_gemv.describe()}")
@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_passes_over_several_positions_agree_with_float64(which, request, monkeypatch):
    """A pass over T = 2, 5 and 16 new positions after a cached prefix, ending exactly at max_len
    (a verification of drafts, a prompt's chunk): the backend's (one native call) logits and the
    keys and values it writes at the new positions equal the plain model's, and both float64's."""
    calls, real = [], native_step.forward
    monkeypatch.setattr(native_step, "forward", lambda *a: calls.append(a[1].shape[1]) or real(*a))
    if which == "tiny":
        model, prompt = build_tiny(seed=1), list(range(3, 20))
        new = [(7 * i + 1) % 256 for i in range(16)]
    else:
        model, tok = request.getfixturevalue("real_model")
        prompt = tok.chat_ids("Why is the sky blue?")
        new = tok.encode(" Light scatters off the molecules of the air, and blue light, whose waves are short,"
                         " scatters most.")[:16]
    fast, model64 = CpuModel(model), copy.deepcopy(model).double()
    for rows in (2, 5, 16):
        ids, start, end = torch.tensor([new[:rows]]), len(prompt), len(prompt) + rows
        out = {}
        for name, runner, owner in (("backend", fast, model), ("plain", model, model), ("float64", model64, model64)):
            cache = owner.new_cache(1, end)                 # the pass ends exactly at max_len
            runner(torch.tensor([prompt]), cache=cache)
            out[name] = (runner(ids, cache=cache), cache)
        assert calls[-1] == rows, "the pass did not run natively"
        (got, cache), (plain, plain_cache), (want, cache64) = out["backend"], out["plain"], out["float64"]
        assert got.shape == want.shape == (1, rows, model.config.vocab_size) and cache.length == end
        assert relative_error(got, want) < 1e-5, f"backend vs float64, {rows} positions"
        assert relative_error(plain, want) < 1e-5, f"plain model vs float64, {rows} positions"
        for name in ("k", "v"):
            mine, theirs = getattr(cache, name)[..., start:end, :], getattr(cache64, name)[..., start:end, :]
            assert relative_error(mine, theirs) < 1e-5, f"{name} at the new positions, {rows} positions"
            assert relative_error(getattr(plain_cache, name)[..., start:end, :], theirs) < 1e-5


def test_greedy_tokens_are_the_same_through_every_backend(real_model):
    model, tok = real_model
    ids = tok.chat_ids("Name two planets.")
    tokens = {b: generate(model, ids, 16, backend=b) for b in ("auto", "cpu", "torch")}
    assert tokens["auto"] == tokens["cpu"] == tokens["torch"]


def test_backend_for_chooses_refuses_and_keeps():
    model = build_tiny(seed=2)
    fast = backend_for(model)
    assert isinstance(fast, CpuModel) and backend_for(model) is fast and backend_for(model, "cpu") is fast
    assert backend_for(model, "torch") is model and backend_for(fast, "torch") is model
    with pytest.raises(ValueError, match="backend must be one of"):
        backend_for(model, "gpu")
    wide = build_tiny(seed=2, dtype=torch.float64)
    assert backend_for(wide) is wide
    with pytest.raises(ValueError, match="float32 weights on the CPU"):
        backend_for(wide, "cpu")
    assert fast.config is model.config and fast.new_cache(1, 4).k.shape[3] == 4
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        assert backend_for(model) is model, "a global hook: the plain model, which runs it"
    finally:
        handle.remove()
    assert isinstance(copy.deepcopy(fast), CpuModel)


@pytest.mark.skipif(not native_gemv.available(), reason=f"native code not built: {native_gemv.describe()}")
def test_an_engine_step_through_the_backend_equals_the_plain_model():
    from reference.engine import LLM, SamplingParams
    from reference.tokenizer import ByteTokenizer
    model = build_tiny(seed=4)
    prompts = [[1, 2, 3], list(range(5, 30)), [7] * 9]
    replies = {}
    for backend in ("cpu", "torch"):
        llm = LLM(model, tokenizer=ByteTokenizer(), backend=backend, block_size=4, max_num_seqs=3,
                  max_num_batched_tokens=16)
        assert isinstance(llm.engine.model, CpuModel) == (backend == "cpu")
        outs = llm.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
        replies[backend] = [o.token_ids for o in outs]
    assert replies["cpu"] == replies["torch"]


IMPORT_EVERYTHING = """
import os, pkgutil, importlib, sys, torch
from torch.nn.modules import module as hooks
def state():
    names = [n for n in vars(hooks) if n.startswith("_global_") and isinstance(getattr(hooks, n), dict)]
    return ({n: len(getattr(hooks, n)) for n in names}, dict(os.environ), torch.get_num_threads(),
            torch.get_num_interop_threads(), list(sys.meta_path), list(sys.path_hooks))
before = state()
import reference
for info in pkgutil.walk_packages(reference.__path__, "reference."):
    if not info.name.startswith("reference.bench"):
        importlib.import_module(info.name)
after = state()
print(before == after, [k for k in before[0] if before[0][k] != after[0][k]], before[2:], after[2:])
"""


def test_importing_the_course_changes_nothing_in_the_process():
    """Every module of reference/ but the benchmarks imported: torch's global module hooks,
    the environment, torch's thread settings and the import system's finders and hooks are what
    they were."""
    done = subprocess.run([sys.executable, "-c", IMPORT_EVERYTHING], capture_output=True, text=True,
                          timeout=300)
    assert done.stdout.startswith("True"), done.stdout + done.stderr[-2000:]
