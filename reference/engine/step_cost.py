"""What one engine step costs in time: chapter 04's roofline applied to a ragged batch.

A step feeds each scheduled sequence n new tokens after the c it already has in the pool. On a
GPU it reads the weights once, however many sequences it feeds; it does 2 FLOPs per weight per
token fed, plus attention over the keys each new token sees; and it reads every fed sequence's
K/V. `forward_cost` gives each sequence's FLOPs and K/V bytes; the weights count once. The step
lasts as long as the slower of its arithmetic and its bytes: max(FLOPs / peak, bytes / bandwidth).

`StepClock` counts that time in decode steps: one decode step is a batch-1 decode with an empty
cache, i.e. one read of the weights (chapter 04's decode floor). A step that decodes a few
sequences costs about 1, as chapter 09 counted; a step that carries a long prompt chunk costs
more once its arithmetic outlasts the weight read, past the ridge point (`ridge_tokens`: 155
tokens for SmolLM2-135M in fp16 on an A100). That is the trade-off a scheduler makes between the first
token of a new request (TTFT) and the next token of the running ones (TPOT).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from reference.calculators.hardware import gpu
from reference.calculators.roofline import forward_cost
from reference.model import ModelConfig


@dataclass(frozen=True)
class StepClock:
    """Step times of `model` (a ModelConfig; the defaults are SmolLM2-135M's) with weights and
    K/V in `dtype`, on the GPU called `gpu_name` (`reference.calculators.hardware.GPUS`)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    gpu_name: str = "A100 80GB"
    dtype: str = "fp16"

    def seconds(self, fed: list[tuple[int, int]]) -> float:
        """Seconds of a step that feeds each sequence (new_tokens, tokens already in the pool)."""
        device = gpu(self.gpu_name)
        flops = kv_bytes = 0
        for new_tokens, context in fed:
            cost = forward_cost(self.model, batch=1, new_tokens=new_tokens, context=context,
                                weight_dtype=self.dtype)
            flops, kv_bytes = flops + cost.flops, kv_bytes + cost.kv_bytes
        return max(flops / device.fp16_flops, (self._weight_bytes + kv_bytes) / device.hbm_bandwidth)

    @functools.cached_property
    def _weight_bytes(self) -> int:
        return forward_cost(self.model, batch=1, new_tokens=1, weight_dtype=self.dtype).weight_bytes

    @functools.cached_property   # computed once per clock: `cost` divides every step by it
    def decode_step_seconds(self) -> float:
        """The unit: a batch-1 decode with an empty cache (memory-bound: one weight read)."""
        return self.seconds([(1, 0)])

    @property
    def ridge_tokens(self) -> int:
        """The shortest prompt chunk (alone, empty cache) whose step waits on its arithmetic
        rather than on the weight read: from there on a longer chunk costs more."""
        device, n = gpu(self.gpu_name), 1
        while True:
            cost = forward_cost(self.model, batch=1, new_tokens=n, weight_dtype=self.dtype)
            if cost.flops / device.fp16_flops > cost.bytes / device.hbm_bandwidth:
                return n
            n += 1

    def cost(self, fed: list[tuple[int, int]]) -> float:
        """The step's time in decode steps. A step that feeds nothing (the engine waits for the
        policy to admit something) costs one decode step, the engine's polling period."""
        return self.seconds(fed) / self.decode_step_seconds if fed else 1.0
