"""A pass over 1 to 16 new positions of one sequence in one native call: the pass at the speed of
its weight reads.

Why: a pass of one sequence must read every weight once (SmolLM2-135M: 538 MB in float32), and on
a CPU that read is all it needs to cost, whether it feeds one new position (a decode step) or a
few (a verification of k drafted tokens, a short prompt or a prompt's chunk): below the machine's
ridge point the multiply-adds of T rows fit under the time of the read. Through torch's operators
a pass also runs hundreds of small operators between the products (norms, RoPE, cache writes,
attention, SiLU, residual adds: each a dispatch, an allocation and a pass over a few KB), and each
of its 121 products pays a call and a fork/join of the threads. `reference/cpu/native_step.c` does
the same arithmetic in one OpenMP region per pass: the threads run the whole pass, meeting at a
barrier only where one thread's output feeds another's, and every product reads each block of its
weight once for all T rows. `python -m reference.bench decode` measures a one-position pass
against its floor (`stream_weights`: the same bytes read alone) and against the operators;
`python -m reference.bench passes` a pass over T positions against a one-position pass.

The pass reads its own copy of the weight matrices, packed when the model's `CpuModel` is built
(`_pack`) in the order the C code reads them, so that each thread streams one contiguous run of
memory per matrix (reference/cpu/native_gemv.c). The products whose outputs a thread computes whole
(QKV, gate/up, the LM head) are packed in strips of 32 columns, [in, 32] each; gate/up's strips
pair 16 gate columns with the 16 up columns they multiply, so that a thread computes its hidden
units' silu(gate) * up alone. The products split by input rows (the output and down projections)
are packed in panels of 32 rows, runs of 32 x 16 blocks: a thread's share of them is one run,
where reading 32 rows of the [in, out] matrix side by side would be 32 streams. The cost is
memory, the size of the weights again (`packed_bytes`), beside the parameters the rest of the
course reads and oneDNN's packed copy for the passes the C code does not serve
(reference/cpu/cpu_linear.py); it lives as long as the model, `forget` drops it, and
REFERENCE_NATIVE_STEP=0 never makes it. A weight replaced or changed in place after packing is
packed again at the next pass (`_table`); a module replaced, a parametrized weight or one stored
otherwise than the C code reads sends the pass to the operators.

`reference.cpu.CpuModel` takes this path for the passes it serves, and `serves` says which: 1 to
MAX_ROWS (16) new positions of one sequence over a `KVCache`, continuing it or written by position
from a point within it, causal attention (no custom mask), all logit rows or some of them, no
layer limit, float32 on the CPU, the default "sdpa" attention, and the library built (see
native_gemv: a C compiler, not switched off by REFERENCE_NATIVE_GEMV=0). Otherwise (more positions,
a batch, a draft tree's mask, a self-draft through the first layers, an engine step's context),
and always where REFERENCE_NATIVE_STEP=0, its operators run: the same arithmetic, so the same
logits up to float rounding (tests/model/test_native_step.py and test_cpu_backend.py hold both to
a float64 run of the model).
"""
from __future__ import annotations

import ctypes
import operator
import threading
import weakref
from typing import NamedTuple

import torch
from torch import Tensor, nn

from reference.cpu import huge_pages, native_gemv
from reference.kv_cache import KVCache
from reference.switch import Switch

_switch = Switch("REFERENCE_NATIVE_STEP")   # whether `Llama.forward` may take this path
enabled, set_enabled = _switch.enabled, _switch.set_enabled

# model -> its `_Packed` weights (built with its CpuModel, or at its first native pass).
_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
PANEL_ROWS, PANEL_COLS, STRIP_COLS = 32, 16, 32   # the packed layouts' blocks (native_gemv.c)
MAX_ROWS = 16   # new positions a native pass takes (native_step.c, native_gemv.c)
# rows -> the C array 0, 1, ..., rows - 1: every row's logits
_ALL_ROWS = [None] + [(ctypes.c_long * rows)(*range(rows)) for rows in range(1, MAX_ROWS + 1)]
_DATA_PTR, _VERSION = Tensor.data_ptr, operator.attrgetter("_version")
_scratch = threading.local()
_APPEND = KVCache.append


def serves(model, input_ids: Tensor, positions, cache, context, num_layers, logits_rows, mask) -> bool:
    """Whether a forward of `model` with these arguments is a pass `forward` runs (cheapest checks
    first): input_ids [1, T] int64 on the CPU with 1 <= T <= MAX_ROWS, over a one-sequence
    `KVCache` of the model's shape (float32, every layer holding the same positions); positions
    None or the run p, p + 1, ..., p + T - 1 with p <= cache.length (written by position, as
    `DenseContext` writes); logits_rows None or int64 indices into the T rows (negative ones from
    the end), at most T of them; no context, mask or layer limit. Not where someone watches the
    cache's writes: a cache whose `append` was replaced (chapter 02 records what attention sees
    that way) gets the operators."""
    return (_switch.on and context is None and num_layers is None and mask is None
            and type(cache) is KVCache and input_ids.dim() == 2 and input_ids.shape[0] == 1
            and 1 <= input_ids.shape[1] <= MAX_ROWS and input_ids.dtype == torch.int64
            and input_ids.is_cpu and cache.k.dtype == torch.float32 and cache.k.is_cpu and runs(model)
            and cache.k.shape == _cache_shape(model.config, cache.max_len) and cache.aligned()
            and KVCache.append is _APPEND and "append" not in vars(cache)
            and (positions is None or _run_of_positions(positions, input_ids.shape[1], cache.length))
            and (logits_rows is None or _row_indices(logits_rows, input_ids.shape[1])))


def _run_of_positions(positions, rows: int, length: int) -> bool:
    """Whether `positions` is an int64 CPU tensor [rows] holding p, p + 1, ..., with p <= length."""
    if not (isinstance(positions, Tensor) and positions.dtype == torch.int64 and positions.is_cpu
            and positions.shape == (rows,)):
        return False
    values = positions.tolist()
    return values[0] <= length and values == list(range(values[0], values[0] + rows))


def _row_indices(logits_rows, rows: int) -> bool:
    """Whether `logits_rows` is an int64 CPU tensor of 1 to `rows` indices in [-rows, rows)."""
    return (isinstance(logits_rows, Tensor) and logits_rows.dtype == torch.int64 and logits_rows.is_cpu
            and logits_rows.dim() == 1 and 1 <= logits_rows.numel() <= rows
            and all(-rows <= row < rows for row in logits_rows.tolist()))


def _cache_shape(cfg, max_len: int) -> tuple[int, ...]:
    """The K (and V) shape of a one-sequence cache for this model, as native_step.c indexes it."""
    return (cfg.n_layers, 1, cfg.n_kv_heads, max_len, cfg.head_dim)


def runs(model) -> bool:
    """Whether this model's batch-1 passes (decode steps, short passes) take the native path:
    float32 weights on the CPU, the default attention backend, the switch on and the library built."""
    weight = model.embed.weight
    return (_switch.on and weight.dtype == torch.float32 and weight.is_cpu
            and model.attention_backend == "sdpa" and native_gemv.available())


def forward(model, input_ids: Tensor, cache: KVCache, positions: Tensor | None = None,
            logits_rows: Tensor | None = None) -> Tensor | None:
    """`model(input_ids, positions, cache, logits_rows=logits_rows)` for a pass `serves` takes:
    logits [1, T, vocab] (float32) for input_ids [1, T] at positions p .. p + T - 1 (p =
    cache.length, or positions[0]), or [1, R, vocab] for the R rows logits_rows selects; the
    pass's keys and values are written at its positions in every layer, as `Llama.forward` writes
    them, and the cache then holds p + T positions. None, with nothing done, where the model's
    modules no longer hold weights the C code reads (a parametrization computes one, a module was
    replaced by another kind, a weight is stored row-major): the operators serve the pass then.
    A full cache, a position past the RoPE table or a token outside the vocabulary raise, with
    the cache left as it was.

    Every line here runs once a pass, just after the pass before has streamed 0.5 GB through the
    CPU's caches: each object it reads comes from memory, so it reads few (the C code reads the
    tokens and checks their range; the sizes and the RoPE rows' address come from the `_Packed`)."""
    packed = _table(model)
    if packed is None:
        return None
    rows = input_ids.shape[1]
    start = cache.length if positions is None else int(positions[0])
    if start + rows > cache.max_len:
        raise ValueError(f"KV cache full: {start} + {rows} tokens exceed max_len={cache.max_len}")
    if start + rows > packed.rope_rows:
        raise ValueError(f"position {start + rows - 1} is past the model's context window of {packed.rope_rows}")
    threads = torch.get_num_threads()
    shape, floats = _step_sizes(packed, model.config, cache.max_len, threads)
    selected = _ALL_ROWS[rows] if logits_rows is None else _selected(logits_rows, rows)
    logits = torch.empty(1, len(selected), shape[6])
    ids = input_ids.contiguous()
    if native_gemv._library().forward_pass(
            shape, rows, ids.data_ptr(), start, packed.embed, packed.head, packed.layers,
            packed.final_norm, packed.rope + start * packed.rope_row_bytes, cache.k.data_ptr(),
            cache.v.data_ptr(), model.norm.eps, selected, len(selected), _work(floats).data_ptr(),
            logits.data_ptr(), threads):
        bad = next(token for token in ids[0].tolist() if not 0 <= token < shape[6])
        raise IndexError(f"token id {bad} is outside the vocabulary of {shape[6]}")
    cache.filled(start + rows)
    return logits


def _selected(logits_rows: Tensor, rows: int) -> ctypes.Array:
    """logits_rows (indices into `rows` rows, negative ones from the end) as a C array in [0, rows)."""
    return (ctypes.c_long * logits_rows.numel())(*(row % rows for row in logits_rows.tolist()))


def stream_weights(model, cache: KVCache) -> None:
    """The floor of a native decode step after the cache's positions: every weight matrix and the
    cached K/V at positions [0, cache.length) read as `forward` reads them for one new position
    (same split over the threads, same barriers), with none of the step's other work
    (native_step.c's `stream_step`). Writes nothing the model or the cache holds."""
    if not 1 <= cache.length <= cache.max_len:
        raise ValueError(f"need a cache holding 1 to max_len={cache.max_len} positions, got {cache.length}")
    packed = _table(model)
    if packed is None:
        raise ValueError("the model's modules do not hold the plain weights a native step reads")
    threads = torch.get_num_threads()
    shape, floats = _step_sizes(packed, model.config, cache.max_len, threads)
    native_gemv._library().stream_step(shape, cache.length - 1, packed.head, packed.layers,
                                       cache.k.data_ptr(), cache.v.data_ptr(), _work(floats).data_ptr(),
                                       threads)


def _step_sizes(packed: _Packed, cfg, max_len: int, threads: int) -> tuple[ctypes.Array, int]:
    """(the C pass's shape array, the floats of work a pass of up to MAX_ROWS positions needs) for
    a cache of max_len positions at this many threads, kept in the `_Packed` after the first pass
    that needs them."""
    sizes = packed.steps.get((max_len, threads))
    if sizes is None:
        shape = (ctypes.c_long * 8)(cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
                                    cfg.head_dim, cfg.d_ff, cfg.vocab_size, max_len)
        floats = native_gemv._library().step_work_floats(shape, MAX_ROWS, threads)
        sizes = packed.steps[max_len, threads] = (shape, floats)
    return sizes


def _work(floats: int) -> Tensor:
    """This thread's scratch buffer for the C pass, at least `floats` long: kept between passes
    (a fresh one would be fresh pages from the kernel, zeroed at every pass)."""
    work = getattr(_scratch, "work", None)
    if work is None or work.numel() < floats:
        work = _scratch.work = torch.empty(floats)
    return work


def _weight_modules(model) -> list:
    """The modules whose `weight` the C pass reads: per block, in native_step.c's order, attention
    norm, QKV, output projection, MLP norm, gate/up, down; then the embedding and the final norm."""
    return [module for block in model.blocks for module in (
        block.attn_norm, block.attn.qkv_proj, block.attn.o_proj,
        block.mlp_norm, block.mlp.gate_up_proj, block.mlp.down_proj)] + [model.embed, model.norm]


class _Packed(NamedTuple):
    """What the C pass reads of one model: its weight matrices packed (native_gemv.c's strips and
    panels, in one buffer), the table of pointers per layer, and what it was built from."""
    dicts: list            # where the tensors it read are held: modules' `_parameters`, the
    names: list[str]       # model's `_buffers` (the RoPE table), under these names,
    tensors: list          # the tensors: every weight in `_weight_modules` order, then the RoPE table
    pointers: list[int]    # their data pointers and versions when packed (a change repacks)
    versions: list[int]
    buffer: Tensor         # the packed matrices, 64-byte aligned, on huge pages where possible
    layers: ctypes.Array   # per layer: norm, QKV, O, norm, gate/up, down (norms: the model's own)
    embed: int             # the embedding [vocab, d_model] (the token's vector is a row)
    head: int              # the same matrix in strips: the tied LM head
    final_norm: int
    rope: int              # the RoPE table [positions, ...]: its address, rows and row size
    rope_rows: int
    rope_row_bytes: int
    steps: dict            # (max_len, threads) -> `_step_sizes`


def packed_bytes(model) -> int:
    """Bytes of the packed copy of the weights this model's native passes read (0 before packing)."""
    packed = _tables.get(model)
    return packed.buffer.numel() if packed is not None else 0


def _table(model) -> _Packed | None:
    """The model's `_Packed` (None where its modules do not hold the weights the C code reads),
    checked at every pass: each tensor read is still the one its module holds, at the same
    address, unchanged since packing by any in-place operation on it (its version counter). A
    weight replaced (a new Parameter, `.to`, `.data =`) or written in place (`mul_`, `copy_`)
    packs again, where its shape and layout are what the C code reads (`_readable`); a write
    through `.data` bypasses the counter: call `forget(model)` after one. A module replaced by
    another is not looked for here: `reference.cpu.CpuModel` serves the modules it was built on."""
    packed = _tables.get(model)
    if packed is not None:
        now = list(map(dict.get, packed.dicts, packed.names))
        if (all(map(operator.is_, now, packed.tensors)) and list(map(_DATA_PTR, now)) == packed.pointers
                and list(map(_VERSION, now)) == packed.versions):
            return packed
    _tables.pop(model, None)          # the old copy goes before the new one is made
    try:
        modules = _weight_modules(model)
    except AttributeError:            # a module replaced by one of another kind
        return None
    weights = [module._parameters.get("weight") for module in modules]
    if (not _own_kinds(model, modules) or any(weight is None for weight in weights)
            or model._buffers.get("rope_turns") is None or not _readable(model, weights)):
        return None                   # e.g. a parametrization computes the weight

    _tables[model] = packed = _pack(model, modules, weights)
    return packed


def forget(model) -> None:
    """Drop this model's packed weights: the next native pass packs them again."""
    _tables.pop(model, None)


def _pack(model, modules: list, weights: list[Tensor]) -> _Packed:
    """Pack the matrices among the modules' `weights` (all but the norms) into one buffer: per
    layer QKV in strips, O in panels, gate/up in paired strips, down in panels; then the head."""
    matrices = [w for i, w in enumerate(weights[:-2]) if i % 6 not in (0, 3)] + [weights[-2]]
    layouts = [_LAYOUTS[i % 4] for i in range(len(matrices) - 1)] + ["strips"]
    shapes = [_packed_shape(w, layout) for w, layout in zip(matrices, layouts)]
    buffer, places = huge_pages.pieces([shape.numel() * 4 for shape in shapes])
    views = [_PACKERS[layout](place.view(torch.float32).view(shape), w)
             for w, layout, shape, place in zip(matrices, layouts, shapes, places)]
    packed_of = iter(views)
    layers = [w if i % 6 in (0, 3) else next(packed_of) for i, w in enumerate(weights[:-2])]
    rope = model._buffers["rope_turns"]
    tensors = weights + [rope]
    return _Packed([module._parameters for module in modules] + [model._buffers],
                   ["weight"] * len(modules) + ["rope_turns"], tensors,
                   [t.data_ptr() for t in tensors], [t._version for t in tensors], buffer,
                   (ctypes.c_void_p * len(layers))(*(w.data_ptr() for w in layers)),
                   weights[-2].data_ptr(), views[-1].data_ptr(), weights[-1].data_ptr(),
                   rope.data_ptr(), rope.shape[0], rope.stride(0) * rope.element_size(), {})


_LAYOUTS = ["strips", "panels", "paired strips", "panels"]   # QKV, O, gate/up, down


def _packed_shape(weight: Tensor, layout: str) -> torch.Size:
    """The packed shape of weight [out, in] (native_gemv.c): panels [ceil(in / 32), ceil(out / 16),
    32, 16]; strips [ceil(out / 32), in, 32]; paired strips (gate/up: out = 2 d_ff) [ceil(d_ff / 16),
    in, 32]."""
    n_out, n_in = weight.shape
    if layout == "panels":
        return torch.Size((-(-n_in // PANEL_ROWS), -(-n_out // PANEL_COLS), PANEL_ROWS, PANEL_COLS))
    per_strip = STRIP_COLS if layout == "strips" else STRIP_COLS // 2
    columns = n_out if layout == "strips" else n_out // 2
    return torch.Size((-(-columns // per_strip), n_in, STRIP_COLS))


def _pack_panels(dest: Tensor, weight: Tensor) -> Tensor:
    """dest [panels, chunks, 32, 16] = weight [out, in] (any layout), in panels (zeros past
    its edges): dest[p, c, r, k] = weight[16 c + k, 32 p + r]."""
    panels, chunks = dest.shape[:2]
    rows = weight.detach().t()                                        # [in, out]
    if rows.shape != (panels * PANEL_ROWS, chunks * PANEL_COLS):      # widen with zeros
        whole = rows.new_zeros(panels * PANEL_ROWS, chunks * PANEL_COLS)
        whole[:rows.shape[0], :rows.shape[1]] = rows
        rows = whole
    return dest.copy_(rows.reshape(panels, PANEL_ROWS, chunks, PANEL_COLS).transpose(1, 2))


def _strip_columns(n_strips: int, n_out: int, paired: bool) -> Tensor:
    """[n_strips, 32]: the column of weight [out, in] each strip lane holds, -1 for none. Plain
    strips hold columns 32 g ... 32 g + 31; paired ones (gate/up, out = 2 d_ff) gate columns
    16 g ... 16 g + 15, then the up columns d_ff + 16 g ... d_ff + 16 g + 15."""
    lane = torch.arange(STRIP_COLS)
    if not paired:
        columns = torch.arange(n_strips)[:, None] * STRIP_COLS + lane
        return columns.where(columns < n_out, -1)
    d_ff, half = n_out // 2, STRIP_COLS // 2
    unit = torch.arange(n_strips)[:, None] * half + lane % half       # the hidden unit of each lane
    columns = unit + (lane >= half) * d_ff
    return columns.where(unit < d_ff, -1)


def _pack_strips(dest: Tensor, weight: Tensor, paired: bool = False) -> Tensor:
    """dest [strips, in, 32]: strip g, row i, lane k = weight[column, i] for the column
    `_strip_columns` gives that lane, zero for none."""
    rows = weight.detach().t()                                        # [in, out]
    columns = _strip_columns(dest.shape[0], weight.shape[0], paired)
    dest.zero_()
    for first in range(0, dest.shape[0], 256):                        # bounded temporaries
        block = columns[first:first + 256]
        lanes = block >= 0
        dest[first:first + 256].permute(1, 0, 2)[:, lanes] = rows[:, block[lanes]]
    return dest


_PACKERS = {"panels": _pack_panels, "strips": _pack_strips,
            "paired strips": lambda dest, weight: _pack_strips(dest, weight, paired=True)}


def _own_kinds(model, modules: list) -> bool:
    """Whether every block, its attention and MLP, and the `_weight_modules` are of the classes
    `reference.model` builds, the linear layers without bias: the C pass does their arithmetic,
    not a replacement's (a bias, another activation)."""
    from reference.model import MLP, Attention, Block, RMSNorm
    kinds = [RMSNorm, nn.Linear, nn.Linear, RMSNorm, nn.Linear, nn.Linear] * len(model.blocks)
    return (all(type(block) is Block and type(block.attn) is Attention and type(block.mlp) is MLP
                for block in model.blocks)
            and list(map(type, modules)) == kinds + [nn.Embedding, RMSNorm]
            and all(getattr(module, "bias", None) is None for module in modules))


def _readable(model, weights: list[Tensor]) -> bool:
    """Whether the weights (`_weight_modules` order) and the RoPE table have the shapes the model's
    config gives and what the C code reads (the embedding, the norms and the table contiguous,
    all float32; the products are packed from any layout): a weight replaced by one the C code
    cannot read is left to the operators."""
    cfg = model.config
    d, qkv_out, attn_out = cfg.d_model, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, cfg.n_heads * cfg.head_dim
    layer_shapes = [(d,), (qkv_out, d), (d, attn_out), (d,), (2 * cfg.d_ff, d), (d, cfg.d_ff)]
    if [tuple(w.shape) for w in weights] != layer_shapes * cfg.n_layers + [(cfg.vocab_size, d), (d,)]:
        return False
    blocks, (embed, final_norm) = weights[:-2], weights[-2:]
    products = [w for i, w in enumerate(blocks) if i % 6 not in (0, 3)] + [embed]
    norms = [w for i, w in enumerate(blocks) if i % 6 in (0, 3)] + [final_norm]
    rope = model._buffers["rope_turns"]
    return (all(w.dtype == torch.float32 and w.is_cpu for w in products) and embed.is_contiguous()
            and all(w.is_contiguous() and w.dtype == torch.float32 and w.is_cpu for w in norms)
            and rope.is_contiguous() and rope.dtype == torch.float32 and rope.is_cpu
            and rope.shape[1:] == (1, cfg.head_dim // 2, 2))
