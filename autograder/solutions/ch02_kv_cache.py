"""Solutions of exercises/ch02_kv_cache.ipynb, one section per solution cell.

Loaded with ``autograder.solutions.load_solutions("ch02_kv_cache")``.
"""

# %% grade_id: KVCache
import torch
from torch import Tensor


class KVCache:
    """Preallocated per-layer key/value storage for incremental decoding.

    k, v: the buffers, each [n_layers, batch, n_kv_heads, max_len, head_dim], allocated once
        by __init__ and written in place by append (they never grow nor get replaced).
        The data lives there and nowhere else: append writes into self.k and self.v, read
        returns views of them (the grader swaps in buffers of its own and checks both).
    length: int, positions held by the most recently written layer (a property below; a
        plain attribute kept up to date works too).
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype=torch.float32, device="cpu"):
        """Allocate self.k and self.v with zeros; every layer starts empty (length 0)."""
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.filled = [0] * n_layers   # positions held, per layer
        self.last_layer = 0

    @property
    def length(self) -> int:
        """Positions held by the layer written most recently (each layer has its own count)."""
        return self.filled[self.last_layer]

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v ([batch, n_kv_heads, T, head_dim]) after what `layer` already holds.

        Returns (k_all, v_all), views [batch, n_kv_heads, len + T, head_dim] of the layer's
        filled part of self.k and self.v. Raises ValueError if len + T > max_len.
        """
        start = self.filled[layer]
        stop = start + k.shape[-2]
        if stop > self.max_len:
            raise ValueError(f"cache holds at most {self.max_len} tokens; "
                             f"layer {layer} has {start} and {k.shape[-2]} more were appended")
        self.k[layer, :, :, start:stop] = k
        self.v[layer, :, :, start:stop] = v
        self.filled[layer] = stop
        self.last_layer = layer
        return self.read(layer)

    def read(self, layer: int) -> tuple[Tensor, Tensor]:
        """The views append would return for `layer`, without appending anything."""
        used = self.filled[layer]
        return self.k[layer, :, :, :used], self.v[layer, :, :, :used]

    def truncate(self, n: int) -> None:
        """Keep the first n positions of every layer (later appends overwrite the rest)."""
        if n < 0:
            raise ValueError("cannot truncate to a negative length")
        self.filled = [min(used, n) for used in self.filled]


# %% grade_id: decode_attention
import math

import torch
from torch import Tensor


def decode_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Attention of one new query over all cached positions.

    q: [B, H, 1, D]; k, v: [B, H, T, D] (T >= 1, the newest position included).
    Returns [B, H, 1, D] with the dtype of q: softmax(q k^T / sqrt(D)) v over the T positions,
    without any mask.
    """
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.matmul(torch.softmax(scores, dim=-1), v)


# %% grade_id: cached_generate
import torch


def cached_generate(model, prompt_ids: list[int], n_new: int, cache) -> list[int]:
    """Greedy decoding with a KV cache: one prefill forward, then one position per forward.

    model: callable model(ids [1, T], cache=cache) -> logits [1, T, vocab]; it appends to `cache`.
    prompt_ids: non-empty list of ints. n_new: tokens to generate (>= 1). cache: an empty KV cache.
    Returns the n_new new ids (list of int), identical to the naive greedy loop. Model calls: one
    of shape [1, len(prompt_ids)], then n_new - 1 of shape [1, 1], all with cache=cache.
    """
    if n_new <= 0:
        return []
    with torch.no_grad():
        logits = model(torch.tensor([[int(t) for t in prompt_ids]], dtype=torch.long), cache=cache)
        token = int(torch.argmax(logits[0, -1]))
        generated = [token]
        while len(generated) < n_new:
            logits = model(torch.tensor([[token]], dtype=torch.long), cache=cache)
            token = int(torch.argmax(logits[0, -1]))
            generated.append(token)
    return generated
