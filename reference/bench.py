"""Benchmarks, run side by side in one process so that ratios are meaningful.

    python -m reference.bench decode [--tokens 32 128 512] [--naive-max 128] [--threads N]
    python -m reference.bench kernels [--quick] [--json PATH]     (reference/kernels/bench.py)

`decode` times greedy generation at batch 1 on SmolLM2-135M-Instruct three ways: the naive loop
(chapter 01), our KV-cached loop (chapter 02) and Hugging Face `generate` on the same weights
and thread count. It also measures this machine's copy bandwidth and reports the bandwidth a
cached decode step achieves: bytes it must read (weights + KV cache) / time per token.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from reference.decoding import DecodeStats, generate
from reference.model import gguf_path, load_model

PROMPT = "Explain in a few sentences why the sky is blue."


def copy_bandwidth(n_bytes: int = 512 << 20, repeats: int = 5) -> float:
    """Best observed bytes/s of a large tensor copy (counts the read and the write)."""
    src = torch.ones(n_bytes // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * n_bytes / best


def load_hf_peer(dtype: torch.dtype = torch.float32):
    """transformers' Llama on the same GGUF file (dequantized to `dtype`)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    path = gguf_path()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                dtype=dtype).eval()


def time_ours(model, ids: list[int], n: int, use_cache: bool) -> tuple[float, list[int], DecodeStats]:
    stats = DecodeStats()
    start = time.perf_counter()
    out = generate(model, ids, n, use_cache=use_cache, stats=stats)
    return time.perf_counter() - start, out, stats


@torch.inference_mode()
def time_hf(hf, ids: list[int], n: int) -> tuple[float, list[int]]:
    inputs = torch.tensor([ids])
    start = time.perf_counter()
    out = hf.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=n,
                      min_new_tokens=n, do_sample=False, pad_token_id=hf.config.eos_token_id)
    return time.perf_counter() - start, out[0, len(ids):].tolist()


def agreement(ours: list[int], theirs: list[int]) -> str:
    """'yes' when the token lists are equal, else where they first differ."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return f"until {i}"
    return "yes" if len(ours) == len(theirs) else f"until {min(len(ours), len(theirs))}"


def kv_bytes_read_per_step(model, context: int) -> int:
    """K and V bytes one decode step reads at a given context length (all layers, fp32)."""
    cfg = model.config
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * context * 4


def bench_decode(token_counts: list[int], naive_max: int) -> None:
    model, tok = load_model("smollm2-135m")
    hf = load_hf_peer()
    ids = tok.chat_ids(PROMPT)
    bandwidth = copy_bandwidth()
    weights = model.weight_bytes()
    print(f"threads: {torch.get_num_threads()}   prompt: {len(ids)} tokens   "
          f"weights: {weights / 2**20:.0f} MiB fp32   copy bandwidth: {bandwidth / 1e9:.1f} GB/s\n")
    time_ours(model, ids, 4, True), time_hf(hf, ids, 4)  # warm-up: allocator, thread pool
    header = (f"{'new':>5} {'naive tok/s':>12} {'cached tok/s':>13} {'HF tok/s':>9} "
              f"{'cached/naive':>13} {'cached/HF':>10} {'same as HF':>12} "
              f"{'ms/token':>9} {'GB/s':>6} {'of copy':>8}")
    print(header)
    print("-" * len(header))
    for n in token_counts:
        naive = time_ours(model, ids, n, False)[0] if n <= naive_max else None
        cached_s, cached_out, stats = time_ours(model, ids, n, True)
        hf_s, hf_out = time_hf(hf, ids, n)
        step = sum(stats.step_seconds) / max(len(stats.step_seconds), 1)
        bytes_per_step = weights + kv_bytes_read_per_step(model, len(ids) + n // 2)
        achieved = bytes_per_step / step
        naive_cell = f"{n / naive:12.1f}" if naive else f"{'(skipped)':>12}"
        ratio_naive = f"{naive / cached_s:12.1f}x" if naive else f"{'-':>13}"
        print(f"{n:>5} {naive_cell} {n / cached_s:13.1f} {n / hf_s:9.1f} {ratio_naive} "
              f"{hf_s / cached_s:9.2f}x {agreement(cached_out, hf_out):>12} {step * 1e3:9.1f} "
              f"{achieved / 1e9:6.1f} {achieved / bandwidth:8.0%}")
    print("\ntok/s = new tokens / wall time of the whole call (prefill included); ms/token and "
          "GB/s are for one cached decode step (bytes = weights + K/V read at mid-generation).")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["kernels"]:  # chapters 05-07: the Triton kernels have their own options
        from reference.kernels.bench import main as bench_kernels
        return bench_kernels(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m reference.bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    dec = sub.add_parser("decode", help="naive vs cached vs HF generate, batch 1")
    dec.add_argument("--tokens", type=int, nargs="+", default=[32, 128, 512])
    dec.add_argument("--naive-max", type=int, default=128,
                     help="skip the naive loop above this many new tokens (its cost grows as N^2)")
    dec.add_argument("--threads", type=int, default=None)
    sub.add_parser("kernels", help="Triton kernels vs PyTorch (see python -m reference.bench kernels --help)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    bench_decode(args.tokens, args.naive_max)


if __name__ == "__main__":
    main()
