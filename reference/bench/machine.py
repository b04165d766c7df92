"""This machine's own roofline, measured: copy bandwidth, matmul FLOP/s, and where the real
model's prefill and decode steps land against them.

Every figure is the median of repeated runs (robust to a neighbour stealing the CPU for one
run). Thread count: whatever torch is set to when called (reported in the result). The machine
measurements also run on a GPU (`device="cuda"`), where each run is synchronised before timing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.bench.measure import copy_bandwidth, median_seconds
from reference.calculators.roofline import ForwardCost, forward_cost


@dataclass(frozen=True)
class MachineRoofline:
    """Measured ceilings: copy_bandwidth in bytes/s (read + write counted), matmul_flops in FLOP/s."""
    copy_bandwidth: float
    matmul_flops: float
    copy_bytes: int        # size of the copied tensor (each copy reads and writes it)
    matmul_size: int       # the square size whose median was fastest
    threads: int
    device: str = "cpu"
    matmul_dtype: str = "float32"

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the two roofs meet."""
        return self.matmul_flops / self.copy_bandwidth


def matmul_flops(sizes: tuple[int, ...] = (256, 512, 1024), seconds: float = 1.0, device: str = "cpu",
                 dtype: torch.dtype = torch.float32) -> tuple[float, int]:
    """(FLOP/s, size) of the fastest median square matmul among `sizes` (2 n^3 FLOPs each)."""
    if not sizes or min(sizes) < 1 or seconds <= 0:
        raise ValueError(f"need positive sizes and seconds > 0, got {sizes}, {seconds}")
    gen = torch.Generator().manual_seed(0)
    best = (0.0, sizes[0])
    for n in sizes:
        a, b = (torch.randn(n, n, generator=gen).to(device, dtype) for _ in range(2))
        out = torch.empty(n, n, device=device, dtype=dtype)
        rate = 2 * n**3 / median_seconds(lambda: torch.mm(a, b, out=out), budget=seconds / len(sizes),
                                         device=device)
        best = max(best, (rate, n))
    return best


def measure_machine(seconds: float = 2.0, device: str = "cpu",
                    dtype: torch.dtype = torch.float32) -> MachineRoofline:
    """Copy bandwidth and `dtype` matmul FLOP/s of this machine (or of a GPU, device="cuda"),
    about `seconds` in total. GPUs get larger tensors: their caches and peaks are larger."""
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    on_gpu = torch.device(device).type == "cuda"
    n_bytes = (1 << 30) if on_gpu else (128 << 20)
    sizes = (2048, 4096, 8192) if on_gpu else (256, 512, 1024)
    bandwidth = copy_bandwidth(n_bytes, seconds / 2, device)
    flops, size = matmul_flops(sizes, seconds / 2, device, dtype)
    return MachineRoofline(bandwidth, flops, n_bytes, size, torch.get_num_threads(), str(device),
                           str(dtype).removeprefix("torch."))


@dataclass(frozen=True)
class ModelPoint:
    """One measured forward of the real model: its analytic cost and its median time."""
    label: str
    batch: int
    new_tokens: int
    context: int
    seconds: float
    cost: ForwardCost

    @property
    def achieved_flops(self) -> float:
        return self.cost.flops / self.seconds

    @property
    def achieved_bandwidth(self) -> float:
        return self.cost.bytes / self.seconds


def _fill_cache(cache, model, batch: int, context: int, gen: torch.Generator) -> None:
    """Put `context` random positions into every layer (decode timing does not depend on values)."""
    cfg = model.config
    for layer in range(cfg.n_layers):
        k, v = (torch.randn(batch, cfg.n_kv_heads, context, cfg.head_dim, generator=gen)
                .to(cache.k.device, cache.k.dtype) for _ in range(2))
        cache.append(layer, k, v)


def measure_model_points(model, *, prompt_len: int = 128, batches: tuple[int, ...] = (1, 4, 16),
                         context: int = 128, seconds: float = 1.0) -> list[ModelPoint]:
    """Time a prefill of `prompt_len` tokens (batch 1) and one decode step at each batch size
    after `context` cached positions; pair each with `forward_cost` (float32 weights and cache).

    Uses only the public model API: model(ids, cache=cache) and model.new_cache(batch, max_len).
    """
    if prompt_len < 1 or context < 1 or not batches or min(batches) < 1:
        raise ValueError("prompt_len, context and every batch size must be >= 1")
    cfg, gen = model.config, torch.Generator().manual_seed(0)
    dtype, device = next(model.parameters()).dtype, next(model.parameters()).device
    prompt = torch.randint(0, cfg.vocab_size, (1, prompt_len), generator=gen).to(device)

    def prefill():
        model(prompt, cache=model.new_cache(1, prompt_len))

    seconds_each = seconds / (1 + len(batches))
    points = [ModelPoint(f"prefill {prompt_len} tok", 1, prompt_len, 0,
                         median_seconds(prefill, budget=seconds_each, device=device),
                         forward_cost(cfg, batch=1, new_tokens=prompt_len, weight_dtype=dtype))]
    for batch in batches:
        cache = model.new_cache(batch, context + 1)
        _fill_cache(cache, model, batch, context, gen)
        token = torch.randint(0, cfg.vocab_size, (batch, 1), generator=gen).to(device)

        def step():
            model(token, cache=cache)
            cache.truncate(context)

        points.append(ModelPoint(f"decode batch {batch}", batch, 1, context,
                                 median_seconds(step, budget=seconds_each, device=device),
                                 forward_cost(cfg, batch=batch, new_tokens=1, context=context,
                                              weight_dtype=dtype)))
    return points
