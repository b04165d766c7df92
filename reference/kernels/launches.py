"""Every GPU launch configuration of the course's Triton kernels: the rows of the compile matrix.

A `Launch` is one kernel with the arguments and constexprs a launch on a GPU would pass;
`targets.compile_for` builds it for a T4, an A100 or an H100 without one. Pointers are small CPU
tensors of the launch's dtype (the compiler sees only dtype and alignment); sizes are
SmolLM2-135M's (9 query heads on 3 K/V heads) unless a configuration needs others, and lengths
are not multiples of 16 (the general specialisation; a multiple of 16 only widens some loads).

Reference kernels (`reference_launches`), the whole space a GPU launch can take where it is
finite, the extremes where it is not:
- flash attention: every autotune config (after the fp32 pruning) x fp32/fp16/bf16 x
  D in {16, 32, 64, 128} x causal or not.
- softmax: each dtype at the largest block of each num_warps band (2048/4, 8192/8, 16384/16),
  a short row, and the multi-block sweep.
- split-K decode, paged decode: each dtype x head dim (paged: padded to 16 ... 256) x
  query-head groups of up to 16 and up to 64 (BLOCK_H 16 and 64); merge: each dtype x head dim x
  2 and 512 splits (512: what the default split count reaches on an H100); store_kv: each
  dtype x one head of 64 and 32 heads of 256.
Exercise solutions (`solution_launches`, chapters 05-08): the grader's launches, plus one at the
sizes the chapter's GPU discussion uses.
"""
from __future__ import annotations

import importlib
import linecache
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch
import triton

from reference.kernels.flash_attention import GPU_CONFIGS, _prune_configs, dot_options

if TYPE_CHECKING:
    from reference.kernels.targets import CompileReport

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
HEADS, KV_HEADS = 9, 3              # SmolLM2-135M
LENGTH = 1000                       # keys (and queries) per sequence: not a multiple of 16


@dataclass
class Launch:
    """kernel: a short name; config: what varies between its launches; fn: the @triton.jit
    object; args, kwargs: one launch's arguments (kwargs: constexprs, num_warps, num_stages);
    tuned: for one config of an autotuned kernel, the key the autotuner picks a config for."""
    kernel: str
    config: str
    fn: object
    args: tuple
    kwargs: dict = field(default_factory=dict)
    tuned: str | None = None       # autotuned: the autotuner's key, shared by the configs it picks from


def _module(name: str):
    return importlib.import_module(f"reference.kernels.{name}")   # the package re-exports functions by these names


def _empty(*shape: int, dtype=torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def flash_launches() -> list[Launch]:
    kernel = _module("flash_attention")._flash_attention_kernel
    out = []
    for name, dtype in DTYPES.items():
        for head_dim in (16, 32, 64, 128):
            q = _empty(1, HEADS, LENGTH, head_dim, dtype=dtype)
            k = _empty(1, KV_HEADS, LENGTH, head_dim, dtype=dtype)
            args = (q, k, k, q, _empty(1, HEADS, LENGTH), *q.stride(), *k.stride(), *k.stride(), *q.stride(),
                    HEADS, HEADS // KV_HEADS, LENGTH, LENGTH, 0.18)
            for config in _prune_configs(GPU_CONFIGS, {"q_ptr": q}):
                for causal in (False, True):
                    tile = config.kwargs
                    out.append(Launch("flash", f"{name} D={head_dim} {'causal' if causal else 'full':6} "
                                      f"{tile['BLOCK_M']}x{tile['BLOCK_N']} w{config.num_warps} s{config.num_stages}",
                                      kernel, args, {**tile, "CAUSAL": causal, "HEAD_DIM": head_dim,
                                                     **dot_options(dtype, interpreted=False),
                                                     "num_warps": config.num_warps, "num_stages": config.num_stages},
                                      tuned=f"{name} D={head_dim} {'causal' if causal else 'full'}"))
    return out


def softmax_launches() -> list[Launch]:
    softmax = _module("softmax")
    out = []
    for name, dtype in DTYPES.items():
        for n_cols in (100, 2000, 8000, 16000, 50000):
            x = _empty(4, n_cols, dtype=dtype)
            options = softmax.launch_options(n_cols)
            sweep = "1 block" if options["SINGLE_BLOCK"] else "sweep"
            out.append(Launch("softmax", f"{name} N={n_cols} BLOCK={options['BLOCK']} {sweep} w{options['num_warps']}",
                              softmax._softmax_kernel, (x, x, n_cols, n_cols, n_cols), options))
    return out


GROUPS = {16: (HEADS, KV_HEADS), 64: (64, 1)}      # BLOCK_H -> (query heads, K/V heads)


def decode_launches() -> list[Launch]:
    decode = _module("decode_attention")
    out = []
    for name, dtype in DTYPES.items():
        for head_dim in (16, 32, 64, 128):
            for block_h, (heads, kv_heads) in GROUPS.items():
                q, k = _empty(1, heads, head_dim, dtype=dtype), _empty(1, kv_heads, LENGTH, head_dim, dtype=dtype)
                state = _empty(1, heads, 8, head_dim)
                args = (q, k, k, state, state, state, *q.stride(), *k.stride(), *k.stride(),
                        kv_heads, heads // kv_heads, LENGTH, triton.cdiv(LENGTH, 8), 8, 0.18)
                out.append(Launch("decode split", f"{name} D={head_dim} BLOCK_H={block_h}", decode._split_kernel,
                                  args, {"HEAD_DIM": head_dim, "BLOCK_H": block_h, "BLOCK_N": decode.GPU_BLOCK_N,
                                         **dot_options(dtype, interpreted=False)}))
    return out


def merge_launches() -> list[Launch]:
    merge_kernel = _module("decode_attention").merge_kernel
    out = []
    for name, dtype in DTYPES.items():
        for head_dim in (16, 32, 64, 128, 256):
            for splits in (2, 512):
                state, o = _empty(1, HEADS, splits, head_dim), _empty(1, HEADS, head_dim, dtype=dtype)
                out.append(Launch("merge", f"{name} D={head_dim} splits={splits}", merge_kernel,
                                  (state, state, state, o, *o.stride(), HEADS, splits, head_dim),
                                  {"BLOCK_D": head_dim, "BLOCK_S": splits}))
    return out


def paged_launches() -> list[Launch]:
    paged = _module("paged_attention")
    out = []
    for name, dtype in DTYPES.items():
        for block_d in (16, 32, 64, 128, 256):
            for block_h, (heads, kv_heads) in GROUPS.items():
                q, cache = _empty(1, heads, block_d, dtype=dtype), _empty(100, 16, kv_heads, block_d, dtype=dtype)
                table, lens = _empty(1, 63, dtype=torch.int32), _empty(1, dtype=torch.int32)
                state = _empty(1, heads, 8, block_d)
                args = (q, cache, cache, table, lens, state, state, state, *q.stride(), *cache.stride(),
                        *cache.stride(), *table.stride(), lens.stride(0), kv_heads, heads // kv_heads, block_d,
                        16, 8, 0.18)
                out.append(Launch("paged split", f"{name} D={block_d} BLOCK_H={block_h}", paged._paged_split_kernel,
                                  args, {"BLOCK_D": block_d, "BLOCK_H": block_h, "BLOCK_N": paged.GPU_BLOCK_N,
                                         **dot_options(dtype, interpreted=False)}))
    return out


def store_kv_launches() -> list[Launch]:
    paged = _module("paged_attention")
    out = []
    for name, dtype in DTYPES.items():
        for kv_heads, head_dim in ((1, 64), (32, 256)):
            new, cache = _empty(7, kv_heads, head_dim, dtype=dtype), _empty(100, 16, kv_heads, head_dim, dtype=dtype)
            args = (new, new, cache, cache, _empty(7, dtype=torch.int64), *new.stride(), *new.stride(),
                    *cache.stride(), *cache.stride(), head_dim, kv_heads * head_dim, 16)
            block = triton.next_power_of_2(kv_heads * head_dim)
            out.append(Launch("store_kv", f"{name} {kv_heads}x{head_dim} BLOCK={block}", paged._store_kv_kernel,
                              args, {"BLOCK": block}))
    return out


def reference_launches() -> list[Launch]:
    return (flash_launches() + softmax_launches() + decode_launches() + merge_launches() + paged_launches()
            + store_kv_launches())


def all_launches(load_solutions: Callable[[str], dict[str, str]]) -> list[Launch]:
    return reference_launches() + solution_launches(load_solutions)


def groups(launches: list[Launch]) -> list[list[Launch]]:
    """Launches that stand or fall together, in order: an autotuned key's configs, else one launch."""
    out: dict[tuple, list[Launch]] = {}
    for launch in launches:
        out.setdefault((launch.kernel, launch.tuned or launch.config), []).append(launch)
    return list(out.values())


DOT = ("flash", "decode split", "paged split", "ch05 flash_attention_fwd_kernel")   # kernels built on tl.dot
FMA = ("IEEE fp32 products run on the FMA units, operands in registers: fp32 is the course's exactness "
       "path, fp16/bf16 its fast one")
SM75 = ("triton 3.9 keeps tl.dot's operands in registers on sm_75 (no bf16 tensor-core instruction there "
        "at all): nearly every tile spills; a T4 is the free GPU, where running matters more than speed")
# The one place that accepts a spill: (kernel, words of the config, target or "*") -> why. Any other
# spill fails tests/kernels/test_kernel_targets.py.
ACCEPTED_SPILLS = {**{(kernel, "fp32", "*"): FMA for kernel in DOT}, **{(kernel, "", "T4"): SM75 for kernel in DOT}}
# What the matrix found that would not run, or would spill, and is not fixed yet: same keys -> what
# is wrong. The test requires each such row to still fail or spill, so a fix must remove its entry.
OPEN = {
    ("paged split", "D=256", "T4"): "K and V tiles of 64 keys x 256 dims ask 80-128 KiB of a T4's 64 KiB "
                                    "of shared memory (fix: a smaller key tile or a head-dim split at D > 128)",
    ("paged split", "D=256 BLOCK_H=64", "*"): "64 query heads on one K/V head at D = 256: the [64, 256] "
                                              "query tile and its state outgrow registers (spills)",
    **{("decode split", "fp32 D=128 BLOCK_H=64", gpu): "64 query heads on one K/V head, fp32 at D = 128: "
                                                        "96 KiB on a T4, 176 KiB on an A100 (fix: BLOCK_N = 32 "
                                                        "for fp32 when BLOCK_H * D is large)" for gpu in ("T4", "A100")},
    ("decode split", "fp32 D=128 BLOCK_H=16", "T4"): "fp32 K and V tiles of 64 keys x 128 dims ask 72 KiB "
                                                     "of a T4's 64 KiB (fix: BLOCK_N = 32 for fp32 at D = 128)",
    ("paged split", "fp32 D=128", "T4"): "fp32 K and V tiles at D = 128 ask 72-96 KiB of a T4's 64 KiB "
                                         "(fix: a smaller key tile for fp32 at D = 128)",
    **{("merge", f"D={d} splits=512", "*"): "the whole [512, D] fp32 state is loaded at once and spills "
                                            "(fix: loop over the splits in chunks)" for d in (64, 128, 256)},
}


def _match(table: dict, kernel: str, config: str, target: str) -> str | None:
    return next((why for (name, words, where), why in table.items()
                 if name == kernel and words in config and where in ("*", target)), None)


def matrix_problems(rows: list[tuple[Launch, "CompileReport"]]) -> list[str]:
    """What in a compiled matrix would fail on a GPU, one line each (empty: nothing), OPEN aside.

    A launch must compile and fit its target; a spill must be accepted above. An autotuned key
    needs one config that runs (the autotuner skips a config that raises OutOfResources, see
    triton/runtime/autotuner.py) and, unless accepted, one that also does not spill.
    """
    out, tuned = [], {}
    for launch, report in rows:
        if launch.tuned:
            tuned.setdefault((launch.kernel, launch.tuned, report.target), []).append((launch, report))
        elif not _match(OPEN, launch.kernel, launch.config, report.target):
            out += [f"{launch.kernel} {launch.config}: {p}" for p in report.problems()]
            if report.spills and not _match(ACCEPTED_SPILLS, launch.kernel, launch.config, report.target):
                out.append(f"{launch.kernel} {launch.config} on {report.target}: spills {report.spill_stores} B "
                           "per thread (not in launches.ACCEPTED_SPILLS)")
    for (kernel, key, target), candidates in tuned.items():
        runs = [(launch, report) for launch, report in candidates if not report.problems()]
        if not runs:
            out.append(f"{kernel} {key}: no autotune config runs on {target}: "
                       + "; ".join(p for _, r in candidates for p in r.problems()))
        elif all(r.spills for _, r in runs) and not _match(ACCEPTED_SPILLS, kernel, key, target):
            out.append(f"{kernel} {key}: every autotune config that fits {target} spills "
                       "(not in launches.ACCEPTED_SPILLS)")
    return out


def open_rows(rows: list[tuple[Launch, "CompileReport"]]) -> list[tuple[Launch, "CompileReport", str]]:
    """The rows an OPEN entry covers, with its text."""
    return [(launch, report, why) for launch, report in rows
            if (why := _match(OPEN, launch.kernel, launch.config, report.target))]


def kernel_from_source(source: str, name: str, where: str):
    """The kernel `name` that the cell text `source` defines (registered with linecache, so that
    triton can read its source as it reads a file's)."""
    filename = f"<{where}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = {"__name__": where}
    exec(compile(source, filename, "exec"), scope)
    return scope[name]


def solution_launches(load_solutions: Callable[[str], dict[str, str]]) -> list[Launch]:
    """The exercise kernels of chapters 05-08; load_solutions(chapter) -> {grade_id: cell source}
    (autograder.solutions.load_solutions: reference/ does not import the grader)."""
    def kernel(chapter: str, name: str):
        return kernel_from_source(load_solutions(chapter)[name], name, f"{chapter}:{name}")

    out = []
    score_tile = kernel("ch05_flash_attention", "score_tile_kernel")
    for head_dim, block, why in ((16, 16, "grader"), (64, 64, "GPU tile")):
        q, scores = _empty(100, head_dim), _empty(100, 100)
        stats = _empty(100, triton.cdiv(100, block))
        out.append(Launch("ch05 score_tile_kernel", f"{why}: fp32 D={head_dim} {block}x{block}", score_tile,
                          (q, q, scores, stats, stats, q.stride(0), q.stride(0), scores.stride(0),
                           stats.stride(0), 100, 100, head_dim ** -0.5),
                          {"HEAD_DIM": head_dim, "BLOCK_M": block, "BLOCK_N": block}))
    flash = kernel("ch05_flash_attention", "flash_attention_fwd_kernel")
    for head_dim, block, why in ((16, 16, "grader"), (64, 32, "GPU tile")):
        q, k = _empty(HEADS, 100, head_dim), _empty(KV_HEADS, 100, head_dim)
        args = (q, k, k, q, _empty(HEADS, 100), *q.stride()[:2], *k.stride()[:2], *k.stride()[:2], *q.stride()[:2],
                100, 100, HEADS // KV_HEADS, head_dim ** -0.5)
        for causal in (False, True):
            out.append(Launch("ch05 flash_attention_fwd_kernel", f"{why}: fp32 D={head_dim} "
                              f"{'causal' if causal else 'full'} {block}x{block}", flash, args,
                              {"CAUSAL": causal, "HEAD_DIM": head_dim, "BLOCK_M": block, "BLOCK_N": block}))
    softmax = kernel("ch06_online_softmax", "online_softmax_kernel")
    for name in ("fp32", "fp16"):
        for n_cols, block in ((97, 16), (150, 32)):
            x, state = _empty(5, n_cols + 3, dtype=DTYPES[name]), _empty(5, triton.cdiv(n_cols, block))
            out.append(Launch("ch06 online_softmax_kernel", f"grader: {name} BLOCK={block}", softmax,
                              (x, x, state, state, n_cols, n_cols + 3, n_cols + 5), {"BLOCK": block}))
    partial = kernel("ch07_flash_versions", "decode_partial_kernel")
    for head_dim, block_n, why in ((16, 16, "grader"), (32, 16, "grader"), (128, 64, "GPU tile")):
        q, k, state = _empty(1, 4, head_dim), _empty(1, 2, LENGTH, head_dim), _empty(1, 4, 3, head_dim)
        out.append(Launch("ch07 decode_partial_kernel", f"{why}: fp32 D={head_dim} BLOCK_N={block_n}", partial,
                          (q, k, k, state, state, state, 4, 2, LENGTH, triton.cdiv(LENGTH, 3), 3, head_dim ** -0.5),
                          {"HEAD_DIM": head_dim, "BLOCK_N": block_n}))
    paged = kernel("ch08_paged_attention", "paged_decode_kernel")
    for head_dim, block_size, why in ((16, 4, "grader"), (32, 8, "grader"), (128, 16, "GPU tile")):
        q, cache = _empty(3, 6, head_dim), _empty(40, block_size, 2, head_dim)
        tables, lens = _empty(3, 10, dtype=torch.int32), _empty(3, dtype=torch.int32)
        out.append(Launch("ch08 paged_decode_kernel", f"{why}: fp32 D={head_dim} BLOCK_SIZE={block_size}", paged,
                          (q, cache, cache, q, tables, lens, 6, 2, 10, head_dim ** -0.5),
                          {"BLOCK_SIZE": block_size, "HEAD_DIM": head_dim}))
    return out
