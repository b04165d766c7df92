"""`python -m reference.bench decode`: greedy generation on SmolLM2-135M-Instruct, side by side.

    python -m reference.bench decode [--tokens 32 128 512] [--naive-max 128] [--batch 4 16]
                                     [--threads N] [--repeats 3] [--under-load]

At batch 1: the naive loop (chapter 01), our KV-cached loop (chapter 02) and Hugging Face
`generate` on the same weights and thread count; beside each row, the step's floor and this
machine's copy bandwidth, so step / floor and "of copy bandwidth" compare numbers taken
together. Batched rows decode `--batch` copies of the prompt at once: the weights are read once
per step for all of them. `--under-load` then starts a busy-loop process and reports our
tokens/s under that load with the threads left to `generate` (whose `threads.adapt` looks again
once a second: the Python API's path) and chosen again up front (a new command line's), and HF's.

The *floor* of a decode step is the time of the matrix products it cannot avoid: every weight
matrix of the model (and the cached K/V) streamed through the same matmuls, back to back, with
nothing else in between. A step cannot be faster than its floor on the same machine, so
step time / floor measures everything else a step spends (Python, small ops, allocations). A
batch-1 step that runs natively (reference/cpu/native_step.py) is timed against the native floor:
the same reads, split over the threads with the same barriers, in one call.
"""
from __future__ import annotations

import argparse
import statistics
from typing import NamedTuple

import torch
from torch import Tensor

from reference.bench import measure
from reference.bench.hf_peer import load_hf_peer
from reference.cpu import backend_for, cpu_linear, native_gemv, native_step
from reference.cpu.cpu_linear import linear
from reference.decoding import DecodeStats, generate
from reference.model import load_model
from reference import threads as thread_choice
from reference.threads import choose_threads, configure, wait_policy

PROMPT = "Explain in a few sentences why the sky is blue."


def time_ours(model, ids: list[int], n: int, use_cache: bool) -> tuple[float, list[int], DecodeStats]:
    stats = DecodeStats()
    seconds, out = measure.timed(lambda: generate(model, ids, n, use_cache=use_cache, stats=stats))
    return seconds, out, stats


@torch.inference_mode()
def time_hf(hf, ids: list[int], n: int) -> tuple[float, list[int]]:
    inputs = torch.tensor([ids])
    seconds, out = measure.timed(lambda: hf.generate(
        inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=n, min_new_tokens=n,
        do_sample=False, pad_token_id=hf.config.eos_token_id))
    return seconds, out[0, len(ids):].tolist()


def agreement(ours: list[int], theirs: list[int], stop_ids: list[int] = ()) -> str:
    """'yes' when the token lists are equal, 'to end N' when they are equal until our N-th token
    is an end-of-turn token (HF, made to generate exactly n tokens with `min_new_tokens`, may not
    pick one, so it continues elsewhere), else 'until N', where they first differ."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return f"to end {i}" if a in stop_ids else f"until {i}"
    return "yes" if len(ours) == len(theirs) else f"until {min(len(ours), len(theirs))}"


class PairedRun(NamedTuple):
    """One run of a row and what was measured beside it: its median step, a floor sample taken
    right after it, and the copy bandwidth around it (the mean of a copy before and one after)."""
    step_s: float
    floor_s: float
    copy_bandwidth: float


def paired_run(model, run, batch: int, context: int) -> PairedRun:
    """Time one run (`run()` returns its step seconds) between two copies, then a floor sample."""
    before = copy_sample()
    step_s = statistics.median(run())
    floor_s = floor_sample(model, batch, context)
    return PairedRun(step_s, floor_s, (before + copy_sample()) / 2)


def floor_columns(model, runs: list[PairedRun], batch: int, context: int) -> str:
    """'step ms, floor ms, step/floor, GB/s, of copy' over runs: medians of the steps and floors,
    and of each run's own ratios (its step over the floor beside it, its bytes/s over the copy
    around it): a shared machine's bandwidth drifts by tens of percent within a minute, so a
    ratio of two medians taken at different moments can be off by as much."""
    bytes_per_step = step_bytes(model, context, batch)
    step_s = statistics.median(r.step_s for r in runs)
    over_floor = statistics.median(r.step_s / r.floor_s for r in runs)
    of_copy = statistics.median(bytes_per_step / r.step_s / r.copy_bandwidth for r in runs)
    return (f"{step_s * 1e3:8.1f} {statistics.median(r.floor_s for r in runs) * 1e3:9.1f} "
            f"{over_floor:10.2f}x {bytes_per_step / step_s / 1e9:6.1f} {of_copy:8.0%}")


def copy_sample() -> float:
    """One copy-bandwidth measurement (bytes/s, ~0.2 s); rows take two per run (`paired_run`)."""
    return measure.copy_bandwidth(seconds=0.2)


def floor_sample(model, batch: int, context: int) -> float:
    """One floor measurement (median of 3); rows take one right after each run (`paired_run`),
    so that the floor and the steps it is compared with see the same load. A batch-1 step that runs
    natively has the native floor: the same reads in one call (`native_step.stream_weights`)."""
    if batch == 1 and native_step.runs(model):
        cache = model.new_cache(batch=1, max_len=context)
        cache.filled(context)
        return measure.median_seconds(lambda: native_step.stream_weights(model, cache), 3)
    inputs = floor_inputs(model, batch, context)
    return measure.median_seconds(lambda: floor_step(model, inputs), 3)


FLOOR_HEADER = f"{'step ms':>8} {'floor ms':>9} {'step/floor':>11} {'GB/s':>6} {'of copy':>8}"


def batch1_rows(model, hf, ids: list[int], stop_ids: list[int], token_counts: list[int],
                naive_max: int, repeats: int) -> dict[int, float]:
    """Print the batch-1 table; return our cached tokens/s per token count."""
    header = (f"{'new':>5} {'naive tok/s':>12} {'cached tok/s':>13} {'HF tok/s':>9} "
              f"{'cached/HF':>10} {'same as HF':>11} {FLOOR_HEADER}")
    print(header + "\n" + "-" * len(header))
    speeds = {}
    for n in token_counts:
        naive = time_ours(model, ids, n, False)[0] if n <= naive_max else None
        cached, outputs, theirs, runs = [], [], [], []
        context = len(ids) + n // 2                  # mid-generation, for the floor and the bytes

        def ours() -> list[float]:                   # one generation; its step times
            seconds, out, stats = time_ours(model, ids, n, True)
            cached.append(seconds)
            outputs.append(out)
            return stats.step_seconds

        for _ in range(repeats):  # interleaved, so a burst of load hits every column
            runs.append(paired_run(model, ours, 1, context))
            hf_seconds, hf_out = time_hf(hf, ids, n)
            theirs.append(hf_seconds)
        cached_s, hf_s = statistics.median(cached), statistics.median(theirs)
        speeds[n] = n / cached_s
        naive_cell = f"{n / naive:12.1f}" if naive else f"{'(skipped)':>12}"
        floors_cells = floor_columns(model, runs, 1, context)
        print(f"{n:>5} {naive_cell} {n / cached_s:13.1f} {n / hf_s:9.1f} {hf_s / cached_s:9.2f}x "
              f"{agreement(outputs[-1], hf_out, stop_ids):>11} {floors_cells}", flush=True)
    return speeds


def operators_row(model, ids: list[int], n: int, repeats: int) -> None:
    """Where batch-1 steps run natively: the same generation through the model's torch operators
    (`native_step` switched off), interleaved with native runs; one line, step times side by side."""
    native, operators = [], []
    for _ in range(repeats):
        for steps, on in ((native, True), (operators, False)):
            previous = native_step.set_enabled(on)
            try:
                steps.extend(time_ours(model, ids, n, True)[2].step_seconds)
            finally:
                native_step.set_enabled(previous)
    native_s, operators_s = statistics.median(native), statistics.median(operators)
    print(f"the same {n}-token generations through torch's operators (REFERENCE_NATIVE_STEP=0), "
          f"interleaved: step {operators_s * 1e3:.1f} ms against {native_s * 1e3:.1f} ms natively "
          f"({operators_s / native_s:.2f}x)", flush=True)


def batched_rows(model, ids: list[int], batches: list[int], n: int, repeats: int) -> None:
    """Print tokens/s and achieved bandwidth of batched greedy decode."""
    header = f"{'batch':>5} {'new':>5} {'tok/s (all seqs)':>17} {FLOOR_HEADER}"
    print(header + "\n" + "-" * len(header))
    context = len(ids) + n // 2
    for batch in batches:
        runs = [paired_run(model, lambda: batched_decode(model, ids, batch, n)[0], batch, context)
                for _ in range(repeats)]
        step_s = statistics.median(r.step_s for r in runs)
        print(f"{batch:>5} {n:>5} {batch / step_s:17.1f} {floor_columns(model, runs, batch, context)}",
              flush=True)


def under_load_rows(model, hf, ids: list[int], n: int, quiet_speed: float, repeats: int) -> None:
    """Start a busy loop and compare tokens/s with the quiet run: threads left to `adapt` (what
    `generate` does through the Python API: the count chosen when quiet, looked at again once a
    second), then chosen again up front (what a new command line does)."""
    before = torch.get_num_threads()
    with measure.competing_load(processes=1):
        thread_choice.configure(before, adapt=True)     # the quiet count, still `adapt`'s to change
        followed = statistics.median(time_ours(model, ids, n, True)[0] for _ in range(repeats))
        adapted = torch.get_num_threads()
        chosen = choose_threads()
        torch.set_num_threads(chosen)
        ours = statistics.median(time_ours(model, ids, n, True)[0] for _ in range(repeats))
        theirs = statistics.median(time_hf(hf, ids, n)[0] for _ in range(repeats))
    thread_choice.configure(before)
    print(f"under a busy loop started after loading: threads left to adapt: {adapted}, ours "
          f"{n / followed:.1f} tok/s ({n / followed / quiet_speed:.0%} of our {quiet_speed:.1f} tok/s "
          f"without the extra load);  chosen again: {chosen}, ours {n / ours:.1f} tok/s "
          f"({n / ours / quiet_speed:.0%});  HF {n / theirs:.1f} tok/s", flush=True)


def step_path_note(model) -> str:
    """How a batch-1 step runs: natively in one call (reference/cpu/native_step.c), or through the
    model's operators with the one-row path the race chose, the file it lives in, and why the
    native code is missing when it is."""
    if native_step.runs(model):
        return "native step (reference/cpu/native_step.c, on a packed copy of the weights)"
    missing = "" if native_gemv.available() else f"; native code {native_gemv.describe()}"
    return f"torch operators, one-row products {cpu_linear.one_row_path()} (reference/cpu/cpu_linear.py{missing})"


def run(args: argparse.Namespace, loaded: tuple | None = None) -> None:
    """The benchmark; ``loaded``: (model, tokenizer, HF peer) already loaded (a test session's),
    else both models are loaded here."""
    threads = configure(args.threads)
    model, tok, hf = loaded or (*load_model("smollm2-135m"), load_hf_peer())
    fast = backend_for(model)   # what `generate` runs by default (reference.cpu)
    ids = tok.chat_ids(PROMPT)
    print(f"threads: {threads} ({'--threads' if args.threads else 'free cores'}), OpenMP wait "
          f"policy: {wait_policy()}   backend: {type(fast).__name__}, batch-1 steps: "
          f"{step_path_note(model)}   prompt: {len(ids)} "
          f"tokens   weights: "
          f"{model.weight_bytes() / 2**20:.0f} MiB {str(model.embed.weight.dtype).removeprefix('torch.')}\n")
    time_ours(model, ids, 4, True), time_hf(hf, ids, 4)  # warm-up: allocator, thread pool
    speeds = batch1_rows(model, hf, ids, tok.stop_ids, args.tokens, args.naive_max, args.repeats)
    if native_step.runs(model):
        operators_row(model, ids, args.tokens[0], args.repeats)
    if args.batch:
        print()
        batched_rows(fast, ids, args.batch, args.batch_tokens, args.repeats)
    if args.under_load:
        print()
        under_load_rows(model, hf, ids, args.tokens[0], speeds[args.tokens[0]], args.repeats)
    if native_step.packed_bytes(model):
        print(f"\nthe native step's packed copy of the weights: {native_step.packed_bytes(model) / 2**20:.0f} MiB "
              "beside the model's parameters (and oneDNN's packed copy for the prefill)")
    print("\ntok/s = new tokens / wall time of the whole call (prefill included), median of "
          "--repeats runs; step ms = median decode step; floor = the same matmuls alone; "
          "GB/s = bytes a step must read (weights + K/V at mid-generation) / step time; "
          "step/floor and 'of copy' = medians of each run's own ratio (its median step against a floor "
          "timed right after it, its GB/s against copies of 128 MiB timed just before and after it); 'same as HF': "
          "'to end N' = equal until our N-th token ends the turn (HF is made to go on).")



def kv_bytes_read(model, context: int, batch: int = 1) -> int:
    """K and V bytes one decode step reads at a given context length (all layers)."""
    cfg = model.config
    item = model.embed.weight.element_size()
    return 2 * cfg.n_layers * batch * cfg.n_kv_heads * cfg.head_dim * context * item


def step_bytes(model, context: int, batch: int = 1) -> int:
    """Bytes a decode step must read: every weight once, plus each sequence's K/V."""
    return model.weight_bytes() + kv_bytes_read(model, context, batch)


@torch.inference_mode()
def floor_inputs(model, batch: int, context: int, seed: int = 0) -> dict:
    """Activations and a K/V prefix shaped as in a decode step at `context` tokens."""
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    dtype = model.embed.weight.dtype
    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)
    return {"x": rand(batch, 1, cfg.d_model), "h": rand(batch, 1, cfg.d_ff),
            "o": rand(batch, 1, cfg.n_heads * cfg.head_dim),
            "q": rand(batch, cfg.n_kv_heads, cfg.group_size, cfg.head_dim),
            "k": rand(batch, cfg.n_kv_heads, context, cfg.head_dim),
            "v": rand(batch, cfg.n_kv_heads, context, cfg.head_dim)}


@torch.inference_mode()
def floor_step(model, inputs: dict) -> None:
    """Only the matmuls of one decode step, on the model's own weight tensors (same layout).

    Per block: the fused QKV, the attention scores q K^T and the weighted sum p V over the
    cached prefix (one K/V head per group of query heads), the output projection, the fused
    gate/up and the down projection; then the LM head.
    """
    x, h, o, q, k, v = (inputs[n] for n in ("x", "h", "o", "q", "k", "v"))
    for block in model.blocks:
        linear(x, block.attn.qkv_proj.weight)
        scores = q @ k.transpose(-1, -2)
        scores @ v
        linear(o, block.attn.o_proj.weight)
        linear(x, block.mlp.gate_up_proj.weight)
        linear(h, block.mlp.down_proj.weight)
    linear(x, model.embed.weight)


@torch.inference_mode()
def batched_decode(model, prompt_ids: list[int], batch: int, n_steps: int) -> tuple[list[float], Tensor]:
    """Greedy decode of `batch` copies of the prompt together: (seconds of every decode step,
    token ids [batch, n_steps + 1] including the one picked after the prefill).

    Each step feeds [batch, 1] tokens through the model: one read of the weights serves all
    sequences, while each sequence reads its own K/V.
    """
    cache = model.new_cache(batch=batch, max_len=len(prompt_ids) + n_steps + 1)
    logits = model(torch.tensor([prompt_ids] * batch), cache=cache)
    times, tokens = [], [logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(n_steps):
        seconds, logits = measure.timed(lambda: model(tokens[-1], cache=cache))
        times.append(seconds)
        tokens.append(logits[:, -1].argmax(-1, keepdim=True))
    return times, torch.cat(tokens, dim=1)


def main(argv: list[str] | None = None, loaded: tuple | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m reference.bench decode", description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--naive-max", type=int, default=128,
                        help="skip the naive loop above this many new tokens (its cost grows as N^2)")
    parser.add_argument("--batch", type=int, nargs="*", default=[4, 16],
                        help="batch sizes for batched decode rows (none: skip)")
    parser.add_argument("--batch-tokens", type=int, default=64, help="decode steps per batched row")
    parser.add_argument("--repeats", type=int, default=3, help="runs per row (median)")
    parser.add_argument("--threads", type=int, default=None, help="default: the cores free now")
    parser.add_argument("--under-load", action="store_true",
                        help="also measure with a competing busy-loop process running")
    run(parser.parse_args(argv), loaded)
