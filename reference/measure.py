"""Timing helpers for the decode benchmark: copy bandwidth, the decode floor, batched decode,
and a competing CPU load.

The *floor* of a decode step is the time of the matrix products it cannot avoid: every weight
matrix of the model (and the cached K/V) streamed through the same matmuls, back to back, with
nothing else in between. A step cannot be faster than its floor on the same machine, so
step time / floor measures everything else a step spends (Python, small ops, allocations).
"""
from __future__ import annotations

import contextlib
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from reference.cpu_linear import linear


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of `repeats` calls of fn (after one untimed warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_bandwidth(n_bytes: int = 256 << 20, repeats: int = 3) -> float:
    """Best observed bytes/s of a large tensor copy (counts the read and the write)."""
    src = torch.ones(n_bytes // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats + 1):  # the first copy also pays for page faults
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * n_bytes / best


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
        start = time.perf_counter()
        logits = model(tokens[-1], cache=cache)
        times.append(time.perf_counter() - start)
        tokens.append(logits[:, -1].argmax(-1, keepdim=True))
    return times, torch.cat(tokens, dim=1)


BUSY_LOOP = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def competing_load(processes: int = 1, max_seconds: float = 600.0) -> Iterator[list[subprocess.Popen]]:
    """Run `processes` busy-loop processes (one core each) for the duration of the block.

    Each loop also ends by itself after `max_seconds`, so none outlives a benchmark that dies;
    on leaving the block they are killed and reaped.
    """
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(max_seconds)])
             for _ in range(processes)]
    try:
        time.sleep(0.3)  # let the scheduler see them before anyone measures free cores
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def provenance(command: str, argv: list[str], threads: int | None = None, device: str = "cpu") -> dict:
    """What a measured table needs beside it: date (UTC), the command line, the CPU, cores allowed,
    threads, torch / triton / Python versions and, when `device` is a GPU, its name, CUDA and
    driver versions."""
    cpu = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([command, *argv]), "cpu": cpu,
            "cpus_allowed": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "threads": threads, "device": str(device), "torch": torch.__version__,
            "python": platform.python_version()}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info["driver"] = "unknown"
    return info
