"""Device plumbing (reference/device.py): `load_model(device=)`, `LLM(device=)`, the CLI's
`--device`. On a CPU-only machine: "auto" means the CPU and "cuda" is refused in one line. The
`device` fixture runs the same engine and decoding checks on CUDA when a GPU is present."""
import subprocess
import sys

import pytest
import torch

from reference.decoding import generate
from reference.device import resolve_device
from reference.engine import LLM, SamplingParams
from reference.model import build_tiny, load_model
from reference.tokenizer import ByteTokenizer

from devices import DEVICES

CUDA = torch.cuda.is_available()


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def test_auto_follows_what_torch_sees(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") == resolve_device(None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


@pytest.mark.parametrize("bad", ["gpu", "xpu", "cuda:x", 3.5])
def test_unknown_devices_are_refused_in_one_line(bad):
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"):
        resolve_device(bad)


@pytest.mark.skipif(CUDA, reason="checks the refusal on a machine without a GPU")
def test_cuda_without_a_gpu_says_what_to_do():
    with pytest.raises(ValueError, match="sees no CUDA GPU: use device='cpu'"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="sees no CUDA GPU"):
        LLM("tiny", device="cuda")


def test_load_model_puts_weights_and_caches_on_the_device(device):
    model, _ = load_model("tiny", device=device)
    assert model.device.type == device
    assert {p.device.type for p in model.parameters()} == {device}
    assert model.new_cache(batch=1, max_len=8).k.device.type == device


def test_greedy_decoding_on_the_device_matches_the_cpu(device):
    cpu_model = build_tiny(seed=0)
    model, _ = load_model("tiny", device=device)
    prompt = [5, 17, 99, 3]
    want = generate(cpu_model, prompt, 12)
    assert generate(model, prompt, 12) == want
    sampled = dict(temperature=0.9, top_p=0.9, seed=7)
    assert len(generate(model, prompt, 12, **sampled)) == 12


def test_the_engine_serves_on_the_device_the_tokens_of_the_cpu_reference(device):
    cpu_model = build_tiny(seed=0)
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7], list(range(40, 70))]
    want = [generate(cpu_model, p, 10) for p in prompts]
    llm = LLM("tiny", device=device, block_size=4)
    assert llm.engine.runner.k_pool.device.type == device
    outs = llm.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    assert [o.token_ids for o in outs] == want
    seeded = SamplingParams(max_tokens=6, temperature=0.8, seed=3, ignore_eos=True)
    assert len(llm.generate([prompts[0]], seeded)[0].token_ids) == 6


def test_a_model_object_is_served_where_it_is_and_a_conflicting_device_is_refused():
    model = build_tiny(seed=0)
    assert LLM(model, tokenizer=ByteTokenizer()).engine.runner.k_pool.device.type == "cpu"
    other = "cuda" if CUDA else "cpu"
    if CUDA:
        with pytest.raises(ValueError, match="the model is on cpu"):
            LLM(model, tokenizer=ByteTokenizer(), device=other)
    else:
        assert LLM(model, tokenizer=ByteTokenizer(), device="cpu").engine.runner.k_pool.device.type == "cpu"


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "reference", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_device_option(device):
    result = run_cli("generate", "hello", "--model", "tiny", "--max-new-tokens", "4", "--device", device)
    assert result.returncode == 0, result.stderr
    assert f", {device}" in result.stderr and "4 new tokens" in result.stderr


@pytest.mark.skipif(CUDA, reason="checks the refusal on a machine without a GPU")
def test_cli_cuda_without_a_gpu_is_one_line_and_exit_2():
    for command in (["generate", "hi"], ["serve"]):
        result = run_cli(*command, "--model", "tiny", "--device", "cuda")
        assert result.returncode == 2, result.stderr
        assert "sees no CUDA GPU" in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
