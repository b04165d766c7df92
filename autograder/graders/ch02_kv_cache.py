"""Grader for exercises/ch02_kv_cache.ipynb.

Expected values come from ``reference`` (or, for the cache, from a plain list-of-tensors
model kept here) on inputs drawn from ``torch.Generator().manual_seed(seed)``.
"""
from __future__ import annotations


import torch
from torch.nn import functional as F

from autograder.boundary.causes import LearnerError
from autograder.rules.feedback import (PrerequisiteFailed, assert_close, assert_equal,
                                      assert_equal_tokens)
from autograder.rules.inputs import generator, qkv, randint
from autograder.rules.plugin import exercise
from autograder.boundary.refs import CacheRef, Handle, ModelRef
from reference.decoding import generate
from reference.model import build_tiny

VOCAB = 256  # the tiny model's vocabulary
# torch's attention under the public names a cell could call. The quantizable MultiheadAttention
# of torch.ao computes attention in Python from operations the exercise allows (bmm, softmax),
# which no operation limit can tell from a learner's own, and a cell can have one without naming
# it (torch.ao.quantization.prepare swaps it in for a layer's MultiheadAttention): its attention,
# _forward_impl, is guarded on the class, whatever reached the module.
FORBIDDEN_ATTENTION = ["torch.nn.functional.scaled_dot_product_attention",
                       "torch.nn.functional.multi_head_attention_forward",
                       "torch.nn.attention.flex_attention.flex_attention",
                       "torch.nn.MultiheadAttention",
                       "torch.ao.nn.quantizable.MultiheadAttention._forward_impl"]


def _close(a, b, tol=1e-6) -> bool:
    """Elementwise closeness computed by hand (learner code may have patched torch.allclose)."""
    if not isinstance(a, torch.Tensor) or tuple(a.shape) != tuple(b.shape):
        return False
    diff = (a.detach().double() - b.detach().double()).abs()
    return not bool(torch.isnan(diff).any()) and not bool((diff > tol + tol * b.double().abs()).any())


# ------------------------------------------------------------------------------ KVCache

class ListCache:
    """What a KV cache must hold, kept the simple way: one list of chunks per layer."""

    def __init__(self, n_layers: int):
        self.k = [list() for layer in range(n_layers)]
        self.v = [list() for layer in range(n_layers)]

    def append(self, layer, k, v):
        self.k[layer].append(k)
        self.v[layer].append(v)
        return self.read(layer)

    def read(self, layer):
        return torch.cat(self.k[layer], dim=2), torch.cat(self.v[layer], dim=2)

    def length(self, layer=-1) -> int:
        return sum(t.shape[2] for t in self.k[layer])

    def truncate(self, n):
        for store in (self.k, self.v):
            for i, chunks in enumerate(store):
                store[i] = [torch.cat(chunks, dim=2)[:, :, :n]] if chunks else []


def _dims(gen):
    """Random cache geometry: n_layers, batch, n_kv_heads, head_dim."""
    return randint(gen, 2, 4), randint(gen, 1, 2), randint(gen, 1, 3), randint(gen, 2, 8)


def _pair(result, what: str):
    if not (isinstance(result, (tuple, list)) and len(result) == 2
            and all(isinstance(t, torch.Tensor) for t in result)):
        raise AssertionError(f"{what} must return a pair of tensors (k_all, v_all); "
                             f"got {type(result).__name__}")
    return result


def _compare_kv(got, expected, what: str, layer: int) -> None:
    got_k, got_v = _pair(got, what)
    exp_k, exp_v = expected
    if got_k.dim() == 4 and got_k.shape[:2] == exp_k.shape[:2] and got_k.shape[3] == exp_k.shape[3] \
            and got_k.shape[2] != exp_k.shape[2]:
        hint = (f"layer {layer} holds {exp_k.shape[2]} tokens but {what} returned "
                f"{got_k.shape[2]} positions. ")
        if layer > 0:
            hint += ("Each layer needs its own fill level: in one forward layer 0 appends before "
                     "layer 1, so a single shared counter puts layer 1's tokens after layer 0's "
                     "(or before they are counted). ")
        if got_k.shape[2] > exp_k.shape[2]:
            hint += ("Return only the filled prefix of the layer, buffer[layer, :, :, :filled], "
                     "not more.")
        raise AssertionError(hint)
    for name, g, e in (("k_all", got_k, exp_k), ("v_all", got_v, exp_v)):
        if _close(g, e) or not isinstance(g, torch.Tensor) or g.shape != e.shape:
            assert_close(g, e, name=f"{name} of {what}",
                         hint="the returned tensors are every key/value appended to this layer, "
                              "in order, along dim 2")
            continue
        filled = e.shape[2]
        hint = "the layer's tokens, oldest first, along dim 2"
        if filled and _close(g[:, :, -1:], e[:, :, -1:]) and not _close(g, e):
            hint = ("the newest tokens are right but older ones were overwritten: write at the "
                    "layer's current fill position, not at 0 or at a position shared by all layers")
        assert_close(g, e, name=f"{name} of {what}", hint=hint)


def _length(learner, cache) -> int:
    value = learner.getattr(cache, "length")
    if isinstance(value, Handle) or callable(value):
        raise AssertionError(
            "`length` is a method here, so cache.length is the method itself, not a number. "
            "The contract reads it without parentheses (cache.length, as the model does): put "
            "@property on the line above `def length(self)`, or keep a plain int attribute "
            "self.length up to date")
    if not isinstance(value, int) or isinstance(value, bool):
        raise AssertionError(f"`length` should be an int (an attribute or a property), got "
                             f"{type(value).__name__} {value!r:.60}")
    return value


def _fill(learner, cache, model: ListCache, gen, n_layers, batch, heads, dim, steps, dtype,
          max_len=None):
    """Append ``steps`` (a list of chunk lengths) to every layer in order, checking each return
    (``max_len``: the cache's capacity, named when an append that fits is refused)."""
    for t in steps:
        for layer in range(n_layers):
            k = torch.randn(batch, heads, t, dim, generator=gen, dtype=torch.float64).to(dtype)
            v = torch.randn(batch, heads, t, dim, generator=gen, dtype=torch.float64).to(dtype)
            what = f"append({layer}, k, v) with {t} new token(s)"
            held = model.length(layer)
            try:
                got = learner.method(cache, "append", layer, k, v)
            except LearnerError as exc:
                if max_len is None or held + t > max_len or "ValueError" not in str(exc):
                    raise
                exactly = (f"a cache created with max_len={max_len} must accept exactly "
                           f"{max_len} tokens per layer, but {what} was refused when layer "
                           f"{layer} held {held} ({held} + {t} = {max_len}): {exc}. Refuse an "
                           "append only when len + T > max_len (not >=)")
                fits = (f"{what} was refused when layer {layer} held {held} tokens, although "
                        f"{held} + {t} fits in max_len={max_len}: {exc}. Compare the layer's "
                        "own fill level plus T with max_len")
                raise AssertionError(exactly if held + t == max_len else fits) from None
            _compare_kv(got, model.append(layer, k, v), what, layer)
        assert_equal(_length(learner, cache), model.length(), name="cache.length",
                     hint="after a forward (every layer appended once) length is the number of "
                          "tokens each layer holds")


@exercise("KVCache", points=4)
def test_kvcache_append_and_read_match_a_list_of_tensors(learner, seed):
    gen = generator(seed)
    n_layers, batch, heads, dim = _dims(gen)
    steps = [randint(gen, 2, 7)] + [1] * randint(gen, 2, 5) + [randint(gen, 2, 4), 1]
    cache = learner.new("KVCache", n_layers, batch, heads, sum(steps) + randint(gen, 0, 5), dim)
    assert_equal(_length(learner, cache), 0, name="length of a new cache")
    model = ListCache(n_layers)
    _fill(learner, cache, model, gen, n_layers, batch, heads, dim, steps, torch.float32)
    for layer in range(n_layers):
        _compare_kv(learner.method(cache, "read", layer), model.read(layer), f"read({layer})", layer)


@exercise("KVCache", points=4)
def test_kvcache_truncate_then_append_again(learner, seed):
    gen = generator(seed + 1)
    n_layers, batch, heads, dim = _dims(gen)
    cache = learner.new("KVCache", n_layers, batch, heads, 32, dim)
    model = ListCache(n_layers)
    _fill(learner, cache, model, gen, n_layers, batch, heads, dim, [randint(gen, 4, 8), 1, 1, 1],
          torch.float32)
    keep = randint(gen, 1, model.length() - 1)
    learner.method(cache, "truncate", keep)
    model.truncate(keep)
    assert_equal(_length(learner, cache), keep, name=f"length after truncate({keep})",
                 hint="truncate(n) keeps the first n tokens of every layer and forgets the rest")
    for layer in range(n_layers):
        _compare_kv(learner.method(cache, "read", layer), model.read(layer),
                    f"read({layer}) after truncate({keep})", layer)
    # New tokens go right after the kept prefix, overwriting what was forgotten.
    _fill(learner, cache, model, gen, n_layers, batch, heads, dim, [randint(gen, 2, 3), 1],
          torch.float32)


@exercise("KVCache", points=4)
def test_kvcache_refuses_to_overflow(learner, seed):
    gen = generator(seed + 2)
    n_layers, batch, heads, dim = _dims(gen)
    max_len = randint(gen, 3, 8)
    cache = learner.new("KVCache", n_layers, batch, heads, max_len, dim)
    model = ListCache(n_layers)
    # Filling the cache exactly to max_len is allowed ...
    _fill(learner, cache, model, gen, n_layers, batch, heads, dim, [max_len - 1, 1], torch.float32,
          max_len)
    # ... one more token is not, whether it comes alone or in a chunk, and a refused append
    # leaves the cache as it was.
    for t in (1, 2):
        k = torch.randn(batch, heads, t, dim, generator=gen)
        try:
            learner.method(cache, "append", 0, k, k.clone())
        except LearnerError as exc:
            if not str(exc).startswith("your code raised ValueError: "):
                raise AssertionError(
                    f"appending past max_len={max_len} should raise ValueError with a clear "
                    f"message; instead {exc}") from None
        else:
            raise AssertionError(
                f"a cache created with max_len={max_len} already held {max_len} tokens and "
                f"accepted {t} more without complaint; raise ValueError when an append would "
                "go past max_len (the buffers never grow)")
        _compare_kv(learner.method(cache, "read", 0), model.read(0),
                    f"read(0) after a refused append of {t} token(s)", 0)


BUFFER_RULE = ("a KV cache preallocates its buffers once, writes each append into them by "
               "position and returns views of them")
SENTINEL, MARKER = 1000.0, -1000.0   # far from any appended value (standard normal draws)


def _buffers_at_construction(learner, cache, full: list[int]) -> None:
    """``k`` and ``v`` of a new cache: tensors of the full shape, float64 as asked."""
    for name in ("k", "v"):
        try:
            buf = learner.getattr(cache, name)
        except LearnerError:
            raise PrerequisiteFailed(
                f"a new KVCache has no attribute `{name}`. Reserve the buffers in __init__: "
                f"self.k and self.v of shape [n_layers, batch, n_kv_heads, max_len, head_dim] "
                f"(here {full})", rule=BUFFER_RULE) from None
        if not isinstance(buf, torch.Tensor) or list(buf.shape) != full:
            shape = list(buf.shape) if isinstance(buf, torch.Tensor) else type(buf).__name__
            raise PrerequisiteFailed(
                f"right after construction `{name}` should be the whole buffer of shape {full} "
                f"(n_layers, batch, n_kv_heads, max_len, head_dim), but it is {shape}. "
                "Allocate it once at full size; appending writes into it", rule=BUFFER_RULE)
        if buf.dtype != torch.float64:
            raise AssertionError(f"KVCache(..., dtype=torch.float64) allocated `{name}` as "
                                 f"{buf.dtype}; use the dtype argument")


def _grader_buffer(gen, expected: torch.Tensor, filled: list[int]) -> torch.Tensor:
    """A buffer of the grader's own, to put in place of the learner's: the same shape and dtype,
    a SENTINEL-sized value at every filled position, a MARKER-sized one at every free position,
    stored in an unusual memory layout (max_len outermost), so that a tensor built anew by
    torch.cat or torch.zeros is told from the one the grader installed."""
    n_layers, batch, heads, max_len, dim = expected.shape
    physical = torch.empty(max_len, dim, n_layers, batch, heads, dtype=torch.float64)
    buf = physical.permute(2, 3, 4, 0, 1)
    noise = torch.rand(expected.shape, generator=gen, dtype=torch.float64)
    for layer in range(n_layers):
        n = filled[layer]
        buf[layer, :, :, :n] = SENTINEL + noise[layer, :, :, :n]
        buf[layer, :, :, n:] = MARKER - noise[layer, :, :, n:]
    return buf


def _layout(t: torch.Tensor) -> list[int]:
    return [stride for size, stride in zip(t.shape, t.stride()) if size > 1]


def _buffers_after(learner, cache, expected: dict, installed: bool, what: str) -> tuple[dict, int]:
    """(self.k / self.v after ``what``, bytes of new tensors reading them made), refused
    (``PrerequisiteFailed``) when the cache put a tensor of its own in their place: another
    shape, or, once the grader's buffers are in, another memory layout or none of the grader's
    marks past the filled positions left."""
    buffers, made = {}, 0
    for name in ("k", "v"):
        buf, want = learner.getattr(cache, name), expected[name]
        made += _made(learner, f"reading cache.{name} after {what}", want.numel() * 4)
        if not isinstance(buf, torch.Tensor) or list(buf.shape) != list(want.shape):
            shape = list(buf.shape) if isinstance(buf, torch.Tensor) else type(buf).__name__
            raise PrerequisiteFailed(
                f"after {what} `{name}` is {shape} instead of the buffer of shape "
                f"{list(want.shape)}: the buffer was replaced. Growing tensors with torch.cat "
                "copies the whole prefix at every step; write the new slice into the "
                "preallocated buffer instead", rule=BUFFER_RULE)
        marks = want <= MARKER / 2
        if installed and (_layout(buf) != _layout(want) or not (buf[marks] == want[marks]).any()):
            lost = ("it is not the tensor the grader put there (its memory layout changed)"
                    if (buf[marks] == want[marks]).any() else
                    f"the {int(marks.sum())} values the grader had put past the filled positions "
                    "(which an append never touches) are gone")
            raise PrerequisiteFailed(
                f"after {what} `{name}` is a new tensor: {lost}. The grader had put a buffer of "
                f"its own in self.{name}; an append must write into whatever tensor self.{name} "
                f"is, in place: self.{name}[layer, :, :, start:stop] = {name}. Re-creating the "
                "buffer at every append (torch.zeros, torch.cat, index_copy, ...) copies the "
                "whole cache at every step: the quadratic copying a KV cache exists to remove",
                rule=BUFFER_RULE)
        buffers[name] = buf
    return buffers, made


def _made(learner, what: str, whole: int) -> int:
    """Bytes of the tensors the learner's last call made (an append, a read, an attribute
    looked at: a property runs under the recorder too); ``PrerequisiteFailed`` where one of
    them was as large as a whole buffer (``whole`` bytes in float32)."""
    if getattr(learner, "largest_allocation", 0) >= whole:
        raise PrerequisiteFailed(
            f"{what} allocated a tensor of {learner.largest_allocation} bytes, as large as a "
            f"whole buffer ({whole} bytes in float32): it copies the whole cache (clone, "
            "torch.cat, slice_scatter...) where an append should write its few tokens into the "
            "preallocated buffer in place, self.k[layer, :, :, pos:pos + T] = k, and a read "
            "return views. That copy is the quadratic cost a KV cache exists to remove",
            rule=BUFFER_RULE)
    work = getattr(learner, "last_call_work", None)
    return work.allocated_bytes if work is not None else 0


def _check_buffer_values(buffers: dict, expected: dict, filled: list[int], installed: bool,
                         what: str, layer: int, start: int) -> None:
    """The appended tokens are in the buffers at their positions, and nothing else changed
    (before the grader's buffers are in: the filled part of each layer)."""
    for name in ("k", "v"):
        buf, want = buffers[name], expected[name]
        new = (layer, slice(None), slice(None), slice(start, filled[layer]))
        if not _close(buf[new], want[new], 0.0):
            raise PrerequisiteFailed(
                f"after {what}, `{name}[{layer}, :, :, {start}:{filled[layer]}]` does not hold "
                f"the tokens just appended to layer {layer} (although append returned them): "
                "the values must live in the preallocated buffer itself (append writes into "
                "it; read returns views of it)", rule=BUFFER_RULE)
        for other, n in enumerate(filled):
            part = (other,) if installed else (other, slice(None), slice(None), slice(0, n))
            if not _close(buf[part], want[part], 0.0):
                raise AssertionError(
                    f"after {what}, `{name}[{other}]` changed outside the positions appended "
                    f"(layer {layer}, positions {start}..{filled[layer] - 1}). An append writes "
                    "its T tokens at positions len..len+T-1 of its own layer and nothing else")


# The tensors an append may make, in total over the appends, per byte of new tokens given: one
# copy of them (a conversion to the buffer's dtype, a contiguous copy); more means the tokens
# already held are copied too (an in-place write into the buffer makes none).
APPEND_SLACK = 1
# And append by append, so that a copy of the cache made now and then cannot hide in what the
# in-place appends before it left unused: what one append makes beyond GROWTH_SLACK times its own
# new tokens is added up over the appends, and more than EXCESS_TOKENS tokens' worth (k and v)
# of it means appends copy tokens the cache already held.
GROWTH_SLACK = 2
EXCESS_TOKENS = 2


@exercise("KVCache", points=4)
def test_kvcache_appends_write_into_the_buffers(learner, seed):
    """The prerequisite (``PrerequisiteFailed``): the data lives in self.k / self.v. Appends of
    random lengths go to random layers; after each one the buffers are read back. Twice the
    grader puts buffers of its own in place of the learner's (``__setattr__``): ``read`` must
    then return the grader's values (a cache whose data lives in lists, with buffers as a
    written-only mirror, does not), and later appends must land in the grader's tensors,
    leaving the values it put past the filled positions where they are (a buffer re-created at
    each append, by torch.zeros or torch.cat, loses them)."""
    gen = generator(seed + 3)
    n_layers, batch, heads, dim = _dims(gen)
    max_len = randint(gen, 36, 48)
    full = [n_layers, batch, heads, max_len, dim]
    cache = learner.new("KVCache", n_layers, batch, heads, max_len, dim, dtype=torch.float64)
    _buffers_at_construction(learner, cache, full)
    expected = {name: torch.zeros(full, dtype=torch.float64) for name in ("k", "v")}
    filled, installed = [0] * n_layers, False
    appended = allocated = 0   # bytes of new tokens given, bytes the calls' operations made
    excess = 0                 # bytes each append and its reads made beyond GROWTH_SLACK times
    reads = 0                  # its own new tokens; bytes the reads after a swap made
    n_appends = randint(gen, 16, 22)
    swaps = {randint(gen, 1, 3), randint(gen, 5, n_appends - 2)}
    for step in range(n_appends):
        if step in swaps:
            for name in ("k", "v"):
                expected[name] = _grader_buffer(gen, expected[name], filled)
                try:
                    learner.method(cache, "__setattr__", name, expected[name])
                except LearnerError as exc:
                    raise PrerequisiteFailed(
                        f"the grader could not put a buffer of its own in place of `{name}` "
                        f"({exc}). Keep k and v as plain tensor attributes, allocated once in "
                        "__init__ and written in place by append", rule=BUFFER_RULE) from None
            installed = True
            for layer in (layer for layer in range(n_layers) if filled[layer]):
                want = tuple(expected[name][layer, :, :, :filled[layer]] for name in ("k", "v"))
                got = _pair(learner.method(cache, "read", layer), f"read({layer})")
                reads += _made(learner, f"read({layer}) after the grader's buffers went in",
                               expected["k"].numel() * 4)
                if not any((g.abs() >= SENTINEL / 2).any() for g in got):
                    raise PrerequisiteFailed(
                        f"the grader replaced cache.k and cache.v by tensors of its own (same "
                        f"shape, other values), and read({layer}) still returned the values "
                        "appended before: the data does not live in the buffers. read must "
                        "return views of self.k and self.v (self.k[layer, :, :, :filled]), and "
                        "append must write into them; lists or copies kept aside make the "
                        "buffers a mirror nobody reads", rule=BUFFER_RULE)
                _compare_kv(got, want, f"read({layer}) after the buffers were replaced", layer)
        free = [layer for layer in range(n_layers) if filled[layer] < max_len - 2]
        if not free:
            break
        layer = free[randint(gen, 0, len(free) - 1)]
        t = randint(gen, 1, min(3, max_len - 2 - filled[layer]))
        k, v = (torch.randn(batch, heads, t, dim, generator=gen, dtype=torch.float64)
                for _ in range(2))
        start, filled[layer] = filled[layer], filled[layer] + t
        what = f"append({layer}, k, v) with {t} new token(s) (layer {layer} held {start})"
        got = learner.method(cache, "append", layer, k, v)
        made = _made(learner, what, expected["k"].numel() * 4)
        expected["k"][layer, :, :, start:filled[layer]] = k
        expected["v"][layer, :, :, start:filled[layer]] = v
        buffers, read_bytes = _buffers_after(learner, cache, expected, installed, what)
        length = _length(learner, cache)
        made += read_bytes + _made(learner, f"reading cache.length after {what}",
                                   expected["k"].numel() * 4) + reads
        reads, new_bytes = 0, 2 * k.numel() * k.element_size()
        appended, allocated = appended + new_bytes, allocated + made
        excess += max(0, made - GROWTH_SLACK * new_bytes)
        if allocated > APPEND_SLACK * appended + 1024 \
                or excess > EXCESS_TOKENS * new_bytes // t + 64:   # + a few scalars
            raise PrerequisiteFailed(
                f"{what}: the appends and reads so far made {allocated} bytes of new tensors for "
                f"{appended} bytes of new tokens ({made} bytes in this one and the reads after "
                f"it, for {new_bytes}; {excess} bytes more than {GROWTH_SLACK} copies of each "
                "append's own new tokens): the cache copies what it already holds (a torch.cat "
                "of the old tokens and the new, a clone, a slice_scatter), when appending or "
                "when read, a few tokens at a time, all at once, or now and then. Write the new "
                "tokens into the preallocated buffer in place, self.k[layer, :, :, pos:pos + T] "
                "= k, and read through views: the cost of an append must not grow with the "
                "tokens already held (that growth is the quadratic cost a KV cache removes)",
                rule=BUFFER_RULE)
        _compare_kv(got, tuple(expected[name][layer, :, :, :filled[layer]] for name in ("k", "v")),
                    what, layer)
        _check_buffer_values(buffers, expected, filled, installed, what, layer, start)
        assert_equal(length, filled[layer], name=f"cache.length after {what}",
                     hint="length is the number of tokens held by the layer written last")


# ---------------------------------------------------------------------- decode_attention

def _decode_reference(q_all, k, v):
    """Last row of causal attention over the whole sequence, in float64."""
    out = F.scaled_dot_product_attention(q_all.double(), k.double(), v.double(), is_causal=True)
    return out[..., -1:, :]


def _check_decode(learner, q_all, k, v, tol):
    q = q_all[..., -1:, :].clone()
    out = learner.call("decode_attention", q, k, v)
    expected = _decode_reference(q_all, k, v)
    shape = tuple(q.shape)
    if isinstance(out, torch.Tensor) and tuple(out.shape) == shape and not _close(out, expected, 1e-4):
        d = q.shape[-1]
        unscaled = torch.softmax(q.double() @ k.double().transpose(-2, -1), -1) @ v.double()
        if k.shape[-2] > 1 and _close(out, v[..., :1, :], 1e-6):
            raise AssertionError(
                "decode_attention returned v at position 0 only: a causal mask built for a "
                "square matrix hides every key but the first from a single query row. The new "
                "query is the last position, so it may see every cached key: use no mask")
        if _close(out, unscaled, 1e-4):
            raise AssertionError(f"the scores are not divided by sqrt(D) = sqrt({d})")
        if _close(out, q, 1e-6) or _close(out, v[..., -1:, :], 1e-6):
            raise AssertionError("decode_attention returned one of its inputs; compute "
                                 "softmax(q k^T / sqrt(D)) v over all T cached positions")
    if isinstance(out, torch.Tensor) and out.dtype != q.dtype:
        raise AssertionError(f"decode_attention returned {out.dtype} for {q.dtype} inputs")
    assert_close(out.double() if isinstance(out, torch.Tensor) else out, expected,
                 name=f"decode_attention(q {list(shape)}, k/v {list(k.shape)})", atol=tol, rtol=tol,
                 hint="the output is the last row of causal attention: softmax(q k^T / sqrt(D)) v "
                      "with q of shape [B, H, 1, D]")


@exercise("decode_attention", points=2, forbid=FORBIDDEN_ATTENTION)
def test_decode_attention_is_the_last_row_of_causal_attention(learner, seed):
    gen = generator(seed)
    shape = (randint(gen, 1, 3), randint(gen, 1, 4), randint(gen, 2, 40), randint(gen, 4, 32))
    _check_decode(learner, *qkv(gen, shape), tol=1e-5)


@exercise("decode_attention", points=2, forbid=FORBIDDEN_ATTENTION)
def test_decode_attention_one_position_long_cache_and_float64(learner, seed):
    gen = generator(seed + 1)
    _check_decode(learner, *qkv(gen, (2, 3, 1, 8)), tol=1e-5)   # the cache holds one token
    _check_decode(learner, *qkv(gen, (1, 2, randint(gen, 200, 300), 16)), tol=1e-5)
    _check_decode(learner, *qkv(gen, (1, 2, randint(gen, 3, 20), 8), torch.float64), tol=1e-10)


# ----------------------------------------------------------------------- cached_generate

def _prompt(gen, low, high) -> list[int]:
    n = randint(gen, low, high)
    return [int(t) for t in torch.randint(0, VOCAB, (n,), generator=gen)]


def _cases(seed):
    gen = generator(seed)
    return [(_prompt(gen, 2, 10), randint(gen, 3, 8)), (_prompt(gen, 1, 1), randint(gen, 2, 4)),
            (_prompt(gen, 5, 20), 1)]


def _run_cached(learner, seed, prompt, n_new):
    cache = CacheRef(seed, max_len=len(prompt) + n_new + 1)
    return learner.call("cached_generate", ModelRef("tiny", seed), list(prompt), n_new, cache)


def _check_trace(learner, prompt, n_new) -> None:
    """The grader-side record of the model calls: one prefill of the whole prompt into an empty
    cache, then one position per step into the same cache."""
    forwards = learner.trace
    trace = [(f.shape, f.cache is not None) for f in forwards]
    expected = [((1, len(prompt)), True)] + [((1, 1), True)] * (n_new - 1)
    calls = f"(P = {len(prompt)}, n_new = {n_new}; model inputs seen: {[s for s, _ in trace]})"
    if trace == expected:
        lengths = [f.cache_length for f in forwards]
        if len({f.cache for f in forwards}) == 1 and lengths == \
                [0] + [len(prompt) + i for i in range(n_new - 1)]:
            return
        raise AssertionError(
            f"the forwards did not go through one cache that starts empty {calls}; cache "
            f"lengths before each call: {lengths}. Use the cache you were given for every call")
    if not all(cached for _, cached in trace):
        raise AssertionError(
            f"some forward passes were made without the cache {calls}. Pass cache=cache to "
            "every model call: the prefill fills it and each decode step appends to it")
    if any(shape[-1] > len(prompt) for shape, _ in trace if shape):
        raise PrerequisiteFailed(
            f"a forward of {max(shape[-1] for shape, _ in trace if shape)} positions re-ran the "
            f"prompt and the tokens generated after it {calls}: that is the naive loop of "
            "chapter 1, whatever cache the forwards went into (a fresh one at every step, or "
            "this one emptied). The cache already holds every earlier position: after ONE "
            "prefill of the prompt, feed only the newest token, shape [1, 1], with cache=cache",
            rule="a cached loop feeds the prompt once, then only the newest token per forward")
    if trace and trace[0][0] == (1, 1) and len(prompt) > 1:
        raise AssertionError(
            f"the prompt was fed one token at a time {calls}. The prefill processes all "
            "P prompt positions in ONE forward: model(torch.tensor([prompt_ids]), cache=cache)")
    if len(trace) == n_new + 1 and trace[:n_new] == expected:
        raise AssertionError(
            f"{n_new} tokens took {n_new + 1} forward passes {calls}: the last generated "
            "token is never fed back, so stop once n_new tokens are collected")
    if any(shape[-1] > 1 for shape, _ in trace[1:] if shape):
        raise AssertionError(
            f"a decode step fed more than one token {calls}. The cache already holds every "
            "earlier position; after the prefill feed only the newest token, shape [1, 1]")
    raise AssertionError(
        f"expected one prefill forward of shape [1, {len(prompt)}] and then {n_new - 1} "
        f"forwards of shape [1, 1], all with the cache {calls}")


def _check_cached_generate(learner, seed, cases) -> None:
    """Tokens equal to the naive loop's AND the model calls of a cached loop (recorded by the
    grader, not by the learner's process), for every case."""
    model = build_tiny(seed)
    for prompt, n_new in cases:
        got = _run_cached(learner, seed, prompt, n_new)
        expected = [int(t) for t in generate(model, list(prompt), n_new, use_cache=True)]
        if isinstance(got, (list, tuple)) and len(got) == len(prompt) + n_new \
                and list(got[:len(prompt)]) == prompt:
            raise AssertionError("cached_generate returned the prompt followed by the new "
                                 "tokens; return only the n_new generated ids")
        if isinstance(got, tuple):
            got = list(got)
        assert_equal_tokens(got, expected, name=f"cached_generate(model, {prompt}, {n_new}, cache)",
                            hint="the first token is the argmax of the LAST row of the prefill "
                                 "logits; each later one comes from the single row of a "
                                 "one-token forward with the same cache")
        _check_trace(learner, prompt, n_new)


@exercise("cached_generate", points=4)
def test_cached_generate_returns_the_naive_tokens(learner, seed):
    _check_cached_generate(learner, seed, _cases(seed))


@exercise("cached_generate", points=4)
def test_cached_generate_prefills_once_then_feeds_one_token(learner, seed):
    _check_cached_generate(learner, seed, _cases(seed + 1))
