"""Solutions of exercises/ch02_kv_cache.ipynb, one section per solution cell.

Loaded with ``autograder.solutions.load_solutions("ch02_kv_cache")``.
"""

# %% grade_id: KVCache
import torch


class KVCache:
    """Keys and values of every layer, written into buffers reserved once at construction.

    k, v: [n_layers, batch, n_kv_heads, max_len, head_dim] tensors of ``dtype`` on ``device``.
    append(layer, k, v) copies [batch, n_kv_heads, T, head_dim] into the next T free slots of
    that layer and returns views of everything the layer holds, [batch, n_kv_heads, len, head_dim].
    Going past max_len raises ValueError. ``length`` is the number of tokens held by the layer
    written last; truncate(n) forgets every token from position n on, in all layers.
    """

    def __init__(self, n_layers, batch, n_kv_heads, max_len, head_dim,
                 dtype=torch.float32, device="cpu"):
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.n_layers = n_layers
        self.max_len = max_len
        self._filled = [0] * n_layers
        self._last_layer = 0

    @property
    def length(self) -> int:
        return self._filled[self._last_layer]

    def append(self, layer, k, v):
        start = self._filled[layer]
        stop = start + k.shape[-2]
        if stop > self.max_len:
            raise ValueError(f"cache holds at most {self.max_len} tokens; "
                             f"layer {layer} has {start} and {k.shape[-2]} more were appended")
        self.k[layer, :, :, start:stop] = k
        self.v[layer, :, :, start:stop] = v
        self._filled[layer] = stop
        self._last_layer = layer
        return self.read(layer)

    def read(self, layer):
        used = self._filled[layer]
        return self.k[layer, :, :, :used], self.v[layer, :, :, :used]

    def truncate(self, n):
        if n < 0:
            raise ValueError("cannot truncate to a negative length")
        self._filled = [min(used, n) for used in self._filled]


# %% grade_id: decode_attention
import math

import torch
from torch import Tensor


def decode_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Attention of one new query against every cached position.

    q: [B, H, 1, D]; k, v: [B, H, T, D] (the cache, the new token's own key/value included).
    Returns [B, H, 1, D] = softmax(q k^T / sqrt(D)) v. No mask: nothing in the cache lies in
    the query's future.
    """
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.matmul(torch.softmax(scores, dim=-1), v)


# %% grade_id: cached_generate
import torch


def cached_generate(model, prompt_ids: list[int], n_new: int, cache) -> list[int]:
    """Greedy decoding with a KV cache; returns the same ids as naive decoding.

    One forward over the whole prompt fills the cache (prefill) and yields the first token;
    each further token costs one forward of a single position, model(ids [1, 1], cache=cache).
    Returns the n_new generated ids only.
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
