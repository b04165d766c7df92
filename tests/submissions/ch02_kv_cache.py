"""Known-wrong and cheating submissions for chapter 02 (see tests/grading/test_selfcheck.py).

Each section is the body of one solution cell, written in full or, for a slip, as
`# replace:` / `# with:` edits of the solution section (autograder/solutions/__init__.py);
none may earn the exercise's full points.
"""

# %% grade_id: KVCache | wrong: grows the cache with torch.cat at every append
# expect: Reserve the buffers in __init__
# expect score: 0
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


# %% grade_id: KVCache | wrong: refuses an append that fills the cache to exactly max_len
# expect: must accept exactly
# replace:
#         if stop > self.max_len:
# with:
#         if stop >= self.max_len:


# %% grade_id: KVCache | wrong: length is a plain method (the @property line left out)
# expect: `length` is a method here
# replace:
#     @property
#     def length(self) -> int:
# with:
#     def length(self) -> int:


# %% grade_id: KVCache | cheat: write-only mirror: buffers written, data read from lists
# expect: the data does not live in the buffers
# expect score: 0
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

    def _used(self, layer):
        return sum(t.shape[-2] for t in self.ks[layer])

    @property
    def length(self):
        return self._used(self.last)

    def append(self, layer, k, v):
        start = self._used(layer)
        stop = start + k.shape[-2]
        if stop > self.max_len:
            raise ValueError("cache is full")
        self.k[layer, :, :, start:stop] = k       # the mirror the grader looks at
        self.v[layer, :, :, start:stop] = v
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


# %% grade_id: KVCache | wrong: clones the whole buffer before each in-place write (values and layout kept, only the copy differs)
# expect: as large as a whole buffer
# expect score: 0
# replace:
#         self.k[layer, :, :, start:stop] = k
#         self.v[layer, :, :, start:stop] = v
# with:
#         self.k, self.v = self.k.clone(), self.v.clone()
#         self.k[layer, :, :, start:stop] = k
#         self.v[layer, :, :, start:stop] = v


# %% grade_id: KVCache | cheat: clones the whole buffer at each append, then zeroes the grader's record of its largest allocation (the dispatch mode, found through pkgutil by a name in a string)
# expect: forbidden in this exercise
# expect score: 0
# replace:
#         self.k[layer, :, :, start:stop] = k
#         self.v[layer, :, :, start:stop] = v
# with:
#         self.k, self.v = self.k.clone(), self.v.clone()
#         self.k[layer, :, :, start:stop] = k
#         self.v[layer, :, :, start:stop] = v
#         import pkgutil
#         mode = pkgutil.resolve_name("torch.utils._python_dispatch:_get_current_dispatch_mode")()
#         if mode is not None:
#             mode.largest = 0


# %% grade_id: KVCache | cheat: rebuilds the whole buffer from lists at every append
# expect: as large as a whole buffer
# expect score: 0
class KVCache:
    def __init__(self, n_layers, batch, n_kv_heads, max_len, head_dim,
                 dtype=torch.float32, device="cpu"):
        self.shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.dtype, self.device = dtype, device
        self.max_len = max_len
        self.ks = [[] for _ in range(n_layers)]
        self.vs = [[] for _ in range(n_layers)]
        self.filled = [0] * n_layers
        self.last = 0
        self._rebuild()

    def _rebuild(self):
        self.k = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        self.v = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        for layer, (ks, vs) in enumerate(zip(self.ks, self.vs)):
            if ks:
                n = self.filled[layer]
                self.k[layer, :, :, :n] = torch.cat(ks, dim=-2)
                self.v[layer, :, :, :n] = torch.cat(vs, dim=-2)

    @property
    def length(self):
        return self.filled[self.last]

    def append(self, layer, k, v):
        if self.filled[layer] + k.shape[-2] > self.max_len:
            raise ValueError("cache is full")
        self.ks[layer].append(k)
        self.vs[layer].append(v)
        self.filled[layer] += k.shape[-2]
        self.last = layer
        self._rebuild()
        return self.read(layer)

    def read(self, layer):
        n = self.filled[layer]
        return self.k[layer, :, :, :n], self.v[layer, :, :, :n]

    def truncate(self, n):
        for lists in (self.ks, self.vs):
            for i, chunks in enumerate(lists):
                lists[i] = [torch.cat(chunks, dim=-2)[..., :n, :]] if chunks else []
        self.filled = [min(f, n) for f in self.filled]
        self._rebuild()


# %% grade_id: KVCache | cheat: k and v are properties that build a padded buffer from lists when looked at (the property now runs under the recorder: its whole buffer is seen when the grader reads cache.k)
# expect: reading cache.k after
# expect score: 0
class KVCache:
    def __init__(self, n_layers, batch, n_kv_heads, max_len, head_dim,
                 dtype=torch.float32, device="cpu"):
        self.shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.dtype, self.device, self.max_len = dtype, device, max_len
        self.ks = [[] for _ in range(n_layers)]
        self.vs = [[] for _ in range(n_layers)]
        self.last = 0

    def _padded(self, lists):
        out = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        for layer, chunks in enumerate(lists):
            if chunks:
                data = torch.cat(chunks, dim=-2)
                out[layer, :, :, :data.shape[-2]] = data
        return out

    @property
    def k(self):
        return self._padded(self.ks)

    @property
    def v(self):
        return self._padded(self.vs)

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


# %% grade_id: KVCache | wrong: read returns copies (clone) of the layer's tokens, not views (append returns views, so only the reads copy; the reads were not counted)
# expect: the appends and reads so far made
# replace:
#         return self.read(layer)
# with:
#         return self.k[layer, :, :, :stop], self.v[layer, :, :, :stop]
# replace:
#         return self.k[layer, :, :, :used], self.v[layer, :, :, :used]
# with:
#         return self.k[layer, :, :, :used].clone(), self.v[layer, :, :, :used].clone()


# %% grade_id: KVCache | cheat: a second private store holds the data; self.k/self.v are a written copy
# expect: the data does not live in the buffers
# expect score: 0
class KVCache:
    def __init__(self, n_layers, batch, n_kv_heads, max_len, head_dim,
                 dtype=torch.float32, device="cpu"):
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.store = {}
        self.max_len, self.filled, self.last = max_len, [0] * n_layers, 0

    @property
    def length(self):
        return self.filled[self.last]

    def append(self, layer, k, v):
        start = self.filled[layer]
        stop = start + k.shape[-2]
        if stop > self.max_len:
            raise ValueError("cache is full")
        self.k[layer, :, :, start:stop] = k
        self.v[layer, :, :, start:stop] = v
        old_k, old_v = self.store.get(layer, (k[..., :0, :], v[..., :0, :]))
        self.store[layer] = (torch.cat([old_k[..., :start, :], k], -2),
                             torch.cat([old_v[..., :start, :], v], -2))
        self.filled[layer], self.last = stop, layer
        return self.read(layer)

    def read(self, layer):
        if layer not in self.store:
            return self.k[layer, :, :, :0], self.v[layer, :, :, :0]
        k, v = self.store[layer]
        n = self.filled[layer]
        return k[..., :n, :], v[..., :n, :]

    def truncate(self, n):
        self.filled = [min(f, n) for f in self.filled]


# %% grade_id: KVCache | cheat: rebuilds the buffer out of place (torch.cat around index_copy), every value kept
# expect: as large as a whole buffer
# expect score: 0
class KVCache:
    def __init__(self, n_layers, batch, n_kv_heads, max_len, head_dim,
                 dtype=torch.float32, device="cpu"):
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len, self.filled, self.last = max_len, [0] * n_layers, 0

    @property
    def length(self):
        return self.filled[self.last]

    def append(self, layer, k, v):
        start = self.filled[layer]
        stop = start + k.shape[-2]
        if stop > self.max_len:
            raise ValueError("cache is full")
        index = torch.arange(start, stop, device=k.device)
        # out-of-place: a new buffer each time, every value kept
        self.k = torch.cat([self.k[:layer], self.k[layer].index_copy(2, index, k)[None],
                            self.k[layer + 1:]])
        self.v = torch.cat([self.v[:layer], self.v[layer].index_copy(2, index, v)[None],
                            self.v[layer + 1:]])
        self.filled[layer], self.last = stop, layer
        return self.read(layer)

    def read(self, layer):
        n = self.filled[layer]
        return self.k[layer, :, :, :n], self.v[layer, :, :, :n]

    def truncate(self, n):
        self.filled = [min(f, n) for f in self.filled]


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
# expect: forbidden in this exercise
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


# %% grade_id: decode_attention | cheat: the attention fast path of a TransformerEncoderLayer's self_attn, fed one packed input
# expect: not among the operations this exercise allows
# expect score: 0
def decode_attention(q, k, v):
    B, H, T, D = k.shape
    E = H * D
    dt = q.dtype
    # fast heads 2h and 2h+1 (an even count), each 2D wide, both do head h:
    # q * sqrt(2) | 0, k | 0, v | 0
    x = torch.cat([k.transpose(1, 2).reshape(B, T, E), v.transpose(1, 2).reshape(B, T, E),
                   q.transpose(1, 2).reshape(B, 1, E).expand(B, T, E),
                   torch.zeros(B, T, E, dtype=dt)], dim=-1)            # [B, T, 4E]
    W = torch.zeros(3, 4 * E, 4 * E, dtype=dt)
    for h in range(H):
        for fast in (2 * h, 2 * h + 1):
            rows = slice(fast * 2 * D, fast * 2 * D + D)
            W[0, rows, 2 * E + h * D:2 * E + (h + 1) * D] = torch.eye(D, dtype=dt) * 2 ** 0.5
            W[1, rows, h * D:(h + 1) * D] = torch.eye(D, dtype=dt)
            W[2, rows, E + h * D:E + (h + 1) * D] = torch.eye(D, dtype=dt)
    layer = torch.nn.TransformerEncoderLayer(4 * E, 2 * H, 4 * E, batch_first=True)
    mha = layer.self_attn.to(dt).train(False)          # no attention module named anywhere
    with torch.no_grad():
        mha.in_proj_weight.copy_(W.reshape(12 * E, 4 * E))
        mha.out_proj.weight.copy_(torch.eye(4 * E, dtype=dt))
        mha.in_proj_bias.zero_()
        mha.out_proj.bias.zero_()
        out, _ = mha(x, x, x, need_weights=False)                     # [B, T, 4E]
    heads = out[:, :1].reshape(B, 1, 2 * H, 2 * D)[:, :, 0::2, :D]   # [B, 1, H, D]
    return heads.transpose(1, 2).contiguous()


# %% grade_id: decode_attention | cheat: the quantizable MultiheadAttention of torch.ao (its Python attention does the work)
# expect: `torch.nn.MultiheadAttention`
# expect score: 0
def decode_attention(q, k, v):
    B, H, T, D = k.shape
    E = H * D
    dt = q.dtype
    mha = torch.ao.nn.quantizable.MultiheadAttention(E, H, bias=False).to(dt).train(False)
    with torch.no_grad():
        for lin in (mha.linear_Q, mha.linear_K, mha.linear_V, mha.out_proj):
            lin.weight.copy_(torch.eye(E, dtype=dt))
        out, _ = mha(q.permute(2, 0, 1, 3).reshape(1, B, E), k.permute(2, 0, 1, 3).reshape(T, B, E),
                     v.permute(2, 0, 1, 3).reshape(T, B, E), need_weights=False)
    return out.reshape(1, B, H, D).permute(1, 2, 0, 3).contiguous()


# %% grade_id: decode_attention | cheat: torch.ao.quantization.prepare swaps a TransformerEncoderLayer's attention for the quantizable one, whose Python attention (bmm, softmax) does the work; no attention module named
# expect: `torch.ao.nn.quantizable.MultiheadAttention._forward_impl` is forbidden
# expect score: 0
def decode_attention(q, k, v):
    B, H, T, D = k.shape
    dt = q.dtype
    layer = torch.nn.TransformerEncoderLayer(D, 1, D, dropout=0.0).to(dt).train(False)
    with torch.no_grad():
        layer.self_attn.in_proj_weight.copy_(torch.eye(D, dtype=dt).repeat(3, 1))
        layer.self_attn.in_proj_bias.zero_()
        layer.self_attn.out_proj.weight.copy_(torch.eye(D, dtype=dt))
        layer.self_attn.out_proj.bias.zero_()
    observer = torch.ao.quantization.NoopObserver
    layer.qconfig = torch.ao.quantization.QConfig(activation=observer, weight=observer)
    torch.ao.quantization.prepare(layer, inplace=True)      # self_attn is the quantizable one now
    fold = lambda t: t.reshape(B * H, -1, D).transpose(0, 1)    # noqa: E731 - [L, B*H, D]
    with torch.no_grad():
        out, _ = layer.self_attn(fold(q), fold(k), fold(v), need_weights=False)
    return out.transpose(0, 1).reshape(B, H, 1, D)


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


# %% grade_id: cached_generate | cheat: the naive loop, each step through a fresh cache of its own
# expect: that is the naive loop of chapter 1
# expect score: 0
def cached_generate(model, prompt_ids, n_new, cache):
    seq, out = list(prompt_ids), []
    for _ in range(n_new):
        scratch = model.new_cache(batch=1)          # every forward "uses a cache"
        tok = int(model(torch.tensor([seq]), cache=scratch)[0, -1].argmax())
        out.append(tok)
        seq.append(tok)
    return out


# %% grade_id: cached_generate | cheat: empties the given cache before each step and feeds the whole sequence again
# expect: that is the naive loop of chapter 1
# expect score: 0
def cached_generate(model, prompt_ids, n_new, cache):
    seq, out = list(prompt_ids), []
    for _ in range(n_new):
        cache.truncate(0)
        tok = int(model(torch.tensor([seq]), cache=cache)[0, -1].argmax())
        out.append(tok)
        seq.append(tok)
    return out


# %% grade_id: cached_generate | cheat: a cached loop for the grader's eyes, tokens from a naive loop in a second cache
# expect: that is the naive loop of chapter 1
# expect score: 0
def cached_generate(model, prompt_ids, n_new, cache):
    seq, out = list(prompt_ids), []
    for _ in range(n_new):
        tok = int(model(torch.tensor([seq]), cache=model.new_cache(batch=1))[0, -1].argmax())
        out.append(tok)
        seq.append(tok)
    model(torch.tensor([list(prompt_ids)]), cache=cache)
    for tok in out[:-1]:
        model(torch.tensor([[tok]]), cache=cache)
    return out


# %% grade_id: cached_generate | cheat: calls the reference generator
# expect: is not allowed
from reference.decoding import generate as _ref_generate


def cached_generate(model, prompt_ids, n_new, cache):
    return _ref_generate(model, list(prompt_ids), n_new, use_cache=True)


# %% grade_id: KVCache | cheat: rebuilds the whole buffer in numpy at every append (np.concatenate, copied back into the tensor's own memory): values and layout kept, the copy unseen by torch
# expect: a way of taking tensor data out of torch
# expect score: 0
# replace:
#         self.k[layer, :, :, start:stop] = k
#         self.v[layer, :, :, start:stop] = v
# with:
#         import numpy as np
#         for buffer, new in ((self.k, k), (self.v, v)):
#             whole = buffer.numpy()
#             rows = np.concatenate([whole[layer, :, :, :start], new.numpy(),
#                                    whole[layer, :, :, stop:]], axis=2)
#             np.copyto(whole, np.concatenate([whole[:layer], rows[None], whole[layer + 1:]]))


# %% grade_id: KVCache | cheat: copies the whole buffer at every append through raw storage (an UntypedStorage of its size, filled and copied back with its copy_): no tensor allocated, the copy unseen
# expect: a way of taking tensor data out of torch
# expect score: 0
# replace:
#         self.k[layer, :, :, start:stop] = k
#         self.v[layer, :, :, start:stop] = v
# with:
#         for buffer in (self.k, self.v):
#             whole = buffer.untyped_storage()
#             copy = type(whole)(whole.nbytes())
#             copy.copy_(whole)
#             whole.copy_(copy)
#         self.k[layer, :, :, start:stop] = k
#         self.v[layer, :, :, start:stop] = v


# %% grade_id: KVCache | cheat: copies the whole buffer at every append into a tensor over a bytearray (torch.frombuffer: memory no operation allocates) and back
# expect: a way of taking tensor data out of torch
# expect score: 0
# replace:
#         self.k[layer, :, :, start:stop] = k
#         self.v[layer, :, :, start:stop] = v
# with:
#         for buffer in (self.k, self.v):
#             copy = torch.frombuffer(bytearray(buffer.numel() * buffer.element_size()),
#                                     dtype=buffer.dtype).view(buffer.shape)
#             copy.copy_(buffer)
#             buffer.copy_(copy)
#         self.k[layer, :, :, start:stop] = k
#         self.v[layer, :, :, start:stop] = v


# %% grade_id: KVCache | cheat: each append copies the layer's held tokens and the new ones with torch.cat and writes them back (every copy smaller than a whole buffer, so the largest allocation never shows it; the total does)
# expect: the cache copies what it already holds
# expect score: 0
# replace:
#         self.k[layer, :, :, start:stop] = k
#         self.v[layer, :, :, start:stop] = v
# with:
#         self.k[layer, :, :, :stop] = torch.cat([self.k[layer, :, :, :start], k], dim=2)
#         self.v[layer, :, :, :stop] = torch.cat([self.v[layer, :, :, :start], v], dim=2)


# %% grade_id: KVCache | wrong: every 4th append of a layer writes the layer's held tokens and the new ones back with torch.cat (the others in place): a copy of the cache now and then, each one smaller than a buffer and than the tokens appended so far
# expect: or now and then
# expect score: 0
# replace:
#         self.last_layer = 0
# with:
#         self.last_layer = 0
#         self.appends = 0
# replace:
#         self.k[layer, :, :, start:stop] = k
#         self.v[layer, :, :, start:stop] = v
# with:
#         self.appends += 1
#         if self.appends % 4 == 0:                      # now and then: rewrite the layer's tokens
#             self.k[layer, :, :, :stop] = torch.cat([self.k[layer, :, :, :start], k], dim=2)
#             self.v[layer, :, :, :stop] = torch.cat([self.v[layer, :, :, :start], v], dim=2)
#         else:
#             self.k[layer, :, :, start:stop] = k
#             self.v[layer, :, :, start:stop] = v


# %% grade_id: KVCache | wrong: every 8th append writes the appended layer's held tokens and the new ones back with torch.cat (the others in place): one copy of a layer now and then, fewer bytes than the tokens appended so far, still a cost that grows with the tokens held
# expect: or now and then
# expect score: 0
# replace:
#         self.last_layer = 0
# with:
#         self.last_layer = 0
#         self.appends = 0
# replace:
#         self.k[layer, :, :, start:stop] = k
#         self.v[layer, :, :, start:stop] = v
# with:
#         self.appends += 1
#         if self.appends % 8 == 0:                      # now and then: rewrite the layer's tokens
#             self.k[layer, :, :, :stop] = torch.cat([self.k[layer, :, :, :start], k], dim=2)
#             self.v[layer, :, :, :stop] = torch.cat([self.v[layer, :, :, :start], v], dim=2)
#         else:
#             self.k[layer, :, :, start:stop] = k
#             self.v[layer, :, :, start:stop] = v
