"""Known-wrong and cheating submissions for chapter 02 (see tests/test_selfcheck.py).

Each section is the body of one solution cell, written in full or, for a slip, as
`# replace:` / `# with:` edits of the solution section (autograder/solutions/__init__.py);
none may earn the exercise's full points.
"""

# %% grade_id: KVCache | wrong: grows the cache with torch.cat at every append
# expect: Reserve the buffers in __init__
class KVCache:
    def __init__(self, n_layers, batch, n_kv_heads, max_len, head_dim,
                 dtype=torch.float32, device="cpu"):
        self.max_len = max_len
        empty = torch.zeros(batch, n_kv_heads, 0, head_dim, dtype=dtype, device=device)
        self.ks = [empty] * n_layers
        self.vs = [empty] * n_layers
        self.last = 0

    @property
    def length(self):
        return self.ks[self.last].shape[-2]

    def append(self, layer, k, v):
        if self.ks[layer].shape[-2] + k.shape[-2] > self.max_len:
            raise ValueError("cache is full")
        self.ks[layer] = torch.cat([self.ks[layer], k], dim=-2)
        self.vs[layer] = torch.cat([self.vs[layer], v], dim=-2)
        self.last = layer
        return self.ks[layer], self.vs[layer]

    def read(self, layer):
        return self.ks[layer], self.vs[layer]

    def truncate(self, n):
        self.ks = [t[..., :n, :] for t in self.ks]
        self.vs = [t[..., :n, :] for t in self.vs]


# %% grade_id: KVCache | wrong: one shared write position for all layers
# expect: Each layer needs its own fill level
# replace:
#         self.filled = [0] * n_layers   # positions held, per layer
# with:
#         self.filled = 0                # ONE write position, shared by all layers

# replace:
#         return self.filled[self.last_layer]
# with:
#         return self.filled

# replace:
#         start = self.filled[layer]
# with:
#         start = self.filled

# replace:
#         self.filled[layer] = stop
# with:
#         self.filled = stop

# replace:
#         used = self.filled[layer]
# with:
#         used = self.filled

# replace:
#         self.filled = [min(used, n) for used in self.filled]
# with:
#         self.filled = min(self.filled, n)


# %% grade_id: KVCache | wrong: no capacity check, the slice silently clips
# expect: raise ValueError when an append
# replace:
#         if stop > self.max_len:
#             raise ValueError(f"cache holds at most {self.max_len} tokens; "
#                              f"layer {layer} has {start} and {k.shape[-2]} more were appended")
#         self.k[layer, :, :, start:stop] = k
#         self.v[layer, :, :, start:stop] = v
# with:
#         stop = min(stop, self.max_len)          # no error: the slice clips what does not fit
#         self.k[layer, :, :, start:stop] = k[..., :stop - start, :]
#         self.v[layer, :, :, start:stop] = v[..., :stop - start, :]


# %% grade_id: KVCache | cheat: shows preallocated-looking buffers but keeps lists
# expect: must live in the preallocated buffer
class KVCache:
    def __init__(self, n_layers, batch, n_kv_heads, max_len, head_dim,
                 dtype=torch.float32, device="cpu"):
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.ks = [[] for _ in range(n_layers)]
        self.vs = [[] for _ in range(n_layers)]
        self.last = 0

    @property
    def length(self):
        return sum(t.shape[-2] for t in self.ks[self.last])

    def append(self, layer, k, v):
        if sum(t.shape[-2] for t in self.ks[layer]) + k.shape[-2] > self.max_len:
            raise ValueError("cache is full")
        self.ks[layer].append(k.clone())
        self.vs[layer].append(v.clone())
        self.last = layer
        return self.read(layer)

    def read(self, layer):
        return torch.cat(self.ks[layer], dim=-2), torch.cat(self.vs[layer], dim=-2)

    def truncate(self, n):
        for lists in (self.ks, self.vs):
            for i, chunks in enumerate(lists):
                lists[i] = [torch.cat(chunks, dim=-2)[..., :n, :]] if chunks else []


# %% grade_id: KVCache | cheat: wraps a reference cache class found in the learner's process
# expect: is not defined because its cell failed
import gc
import sys

_Ref = getattr(sys.modules["__main__"], "KVCache", None) or next(
    o for o in gc.get_objects() if isinstance(o, type)
    and getattr(o, "__module__", "").startswith("reference"))


class KVCache:
    def __init__(self, *args, **kwargs):
        object.__setattr__(self, "_cache", _Ref(*args, **kwargs))

    def __getattr__(self, name):
        return getattr(self._cache, name)


# %% grade_id: KVCache | cheat: imports the reference cache
# expect: is not allowed
from reference.kv_cache import KVCache  # noqa: F401


# %% grade_id: decode_attention | wrong: forgets the 1/sqrt(D) scale
# expect: not divided by sqrt(D)
# replace:
#     scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
# with:
#     scores = torch.matmul(q, k.transpose(-2, -1))


# %% grade_id: decode_attention | wrong: reuses a causal mask built for a square matrix
# expect: use no mask
# replace:
#     scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
# with:
#     scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
#     mask = torch.ones(scores.shape[-2], scores.shape[-1], dtype=torch.bool).triu(1)
#     scores = scores.masked_fill(mask, float("-inf"))


# %% grade_id: decode_attention | cheat: reaches the forbidden fused kernel by a built name
# expect: is forbidden in this exercise
_fused = getattr(F, "scaled_dot_" + "product_attention")


def decode_attention(q, k, v):
    return _fused(q, k, v)


# %% grade_id: decode_attention | cheat: the fused math kernel under its torch.ops.aten name
# expect: may not reach torch's internals
def decode_attention(q, k, v):
    return torch.ops.aten._scaled_dot_product_attention_math(q, k, v)[0]


# %% grade_id: decode_attention | cheat: returns the newest value vector
# expect: one of its inputs
def decode_attention(q, k, v):
    return v[..., -1:, :]


# %% grade_id: cached_generate | wrong: feeds the prompt one token at a time
# expect: fed one token at a time
# replace:
#         logits = model(torch.tensor([[int(t) for t in prompt_ids]], dtype=torch.long), cache=cache)
# with:
#         for t in prompt_ids:
#             logits = model(torch.tensor([[int(t)]], dtype=torch.long), cache=cache)


# %% grade_id: cached_generate | wrong: reads the first row of the prefill logits
# expect: LAST row of the prefill logits
# replace:
#         token = int(torch.argmax(logits[0, -1]))
# with:
#         token = int(torch.argmax(logits[0, 0]))


# %% grade_id: cached_generate | wrong: runs one forward too many
# expect: stop once n_new tokens are collected
# replace:
#             generated.append(token)
# with:
#             generated.append(token)
#         model(torch.tensor([[token]], dtype=torch.long), cache=cache)   # one forward too many


# %% grade_id: cached_generate | cheat: ignores the cache and re-runs the whole sequence
# expect: without the cache
def cached_generate(model, prompt_ids, n_new, cache):
    seq = list(prompt_ids)
    out = []
    for _ in range(n_new):
        tok = int(model(torch.tensor([seq]))[0, -1].argmax())
        out.append(tok)
        seq.append(tok)
    return out


# %% grade_id: cached_generate | cheat: naive loop through model.forward, then decoy calls shaped like a cached loop
# expect: without the cache
def cached_generate(model, prompt_ids, n_new, cache):
    seq, out = list(prompt_ids), []
    for _ in range(n_new):
        tok = int(model.forward(torch.tensor([seq]))[0, -1].argmax())
        out.append(tok)
        seq.append(tok)
    decoy = model.new_cache(batch=1)
    model(torch.tensor([list(prompt_ids)]), cache=decoy)
    for _ in range(n_new - 1):
        model(torch.tensor([[0]]), cache=decoy)
    return out


# %% grade_id: cached_generate | cheat: calls the reference generator
# expect: is not allowed
from reference.decoding import generate as _ref_generate


def cached_generate(model, prompt_ids, n_new, cache):
    return _ref_generate(model, list(prompt_ids), n_new, use_cache=True)
