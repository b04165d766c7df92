"""The model decodes the same greedy tokens through our kernels as through PyTorch's SDPA."""
import pytest
import torch

from kernel_support import DEVICE, rel_error  # noqa: F401  (sets TRITON_INTERPRET first where needed)
from reference.kernels.model_backend import use_kernels
from reference.model import build_tiny, load_model

PROMPT = "Explain in a few sentences why the sky is blue."


def greedy(model, prompt_ids, n, use_cache):
    """n greedy tokens, on the model's device (prefill + one-token steps, or the naive loop)."""
    device = model.embed.weight.device
    ids, new = list(prompt_ids), []
    cache = model.new_cache(1, len(ids) + n) if use_cache else None
    feed = ids
    for _ in range(n):
        logits = model(torch.tensor([feed], device=device), cache=cache)
        new.append(int(logits[0, -1].argmax()))
        feed = [new[-1]] if use_cache else ids + new
    return new


def greedy_both_ways(model, prompt_ids, n, use_cache=True):
    sdpa = greedy(use_kernels(model, "sdpa"), prompt_ids, n, use_cache)
    triton = greedy(use_kernels(model, "triton"), prompt_ids, n, use_cache)
    return sdpa, triton


def test_tiny_model_same_tokens_and_logits():
    model = build_tiny(seed=3).to(DEVICE)
    prompt = list(b"flash attention")
    ids = torch.tensor([prompt], device=DEVICE)
    logits_sdpa = use_kernels(model, "sdpa")(ids)
    logits_triton = use_kernels(model, "triton")(ids)
    assert rel_error(logits_triton, logits_sdpa) < 1e-4
    for use_cache, n in ((True, 6), (False, 3)):
        sdpa, triton = greedy_both_ways(model, prompt, n, use_cache)
        assert triton == sdpa, f"use_cache={use_cache}: kernels {triton} vs SDPA {sdpa}"


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown attention backend"):
        use_kernels(build_tiny(seed=0), "flash4")


@pytest.mark.slow
@pytest.mark.skipif(DEVICE.type != "cuda", reason="the real model through compiled kernels needs a CUDA GPU")
@pytest.mark.parametrize("dtype, n_tokens", [(torch.float32, 48), (torch.float16, 48)], ids=["fp32", "fp16"])
def test_smollm2_on_gpu_same_greedy_tokens(dtype, n_tokens):
    model, tok = load_model("smollm2-135m", dtype=dtype)
    sdpa, triton = greedy_both_ways(model.to("cuda"), tok.chat_ids(PROMPT), n_tokens)
    assert triton == sdpa, f"{dtype}: first difference at token {next(i for i, (a, b) in enumerate(zip(triton, sdpa)) if a != b)}"
