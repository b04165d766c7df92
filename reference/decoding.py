"""Autoregressive decoding: the naive loop (chapter 01) and the KV-cached loop (chapter 02)."""
from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from reference import threads
from reference.cpu import backend_for
from reference.device import device_of


@dataclass
class DecodeStats:
    """Work and time spent by one generation; filled in place by `generate`.

    projected_positions: token positions pushed through the Q/K/V projections, summed over calls.
    attention_cells: query x key score cells computed, for one (layer, head) pair.
    prefill_seconds: time of the first forward (the one that yields the first new token).
    step_seconds: time of every later forward, one entry per further token.
    """
    projected_positions: int = 0
    attention_cells: int = 0
    model_calls: int = 0
    prefill_seconds: float = 0.0
    step_seconds: list[float] = field(default_factory=list)

    def record(self, n_queries: int, n_keys: int, seconds: float) -> None:
        self.projected_positions += n_queries
        self.attention_cells += n_queries * n_keys
        if self.model_calls == 0:
            self.prefill_seconds = seconds
        else:
            self.step_seconds.append(seconds)
        self.model_calls += 1


def naive_work(prompt_len: int, n_new: int) -> tuple[int, int]:
    """(projected_positions, attention_cells) of the naive loop, in closed form.

    Step i runs the model over L = prompt_len + i positions: L projections, L * L score cells.
    """
    def squares(m: int) -> int:  # 1^2 + ... + m^2
        return m * (m + 1) * (2 * m + 1) // 6
    projected = n_new * prompt_len + n_new * (n_new - 1) // 2
    cells = squares(prompt_len + n_new - 1) - squares(prompt_len - 1)
    return projected, cells


def filtered_probs(logits: Tensor, temperature: float = 0.0, top_k: int | None = None,
                   top_p: float | None = None) -> Tensor:
    """The distribution a token is drawn from: logits [..., vocab] -> probabilities [..., vocab].

    Temperature 0 is greedy: all the mass on the argmax (the first one on a tie). Otherwise the
    logits are divided by the temperature, top_k keeps the k largest, and top_p keeps the
    smallest prefix (by probability) whose mass reaches top_p; the rest is renormalised.
    """
    if temperature == 0.0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        drop = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        probs = probs.scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_next(logits: Tensor, temperature: float = 0.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> int:
    """Pick the next token id from logits [vocab]: greedy at temperature 0, else sampled."""
    if temperature == 0.0:
        return int(logits.argmax())
    probs = filtered_probs(logits.cpu(), temperature, top_k, top_p)   # the generator lives on the CPU
    return int(torch.multinomial(probs, 1, generator=generator))


def check_request(model, prompt_ids: list[int], max_new_tokens: int) -> None:
    """Raise ValueError with a one-line reason when a request cannot be served."""
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty: give at least one token")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    window = model.config.max_seq_len
    if len(prompt_ids) + max_new_tokens > window:
        raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) "
                         f"exceeds the context window of {window} tokens")
    bad = [t for t in prompt_ids if not 0 <= t < model.config.vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary (size {model.config.vocab_size})")


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise ValueError with a one-line reason for sampling settings that make no sense."""
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be an integer >= 1 (or None for no limit), got {top_k}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] (or None for no limit), got {top_p}")


def stream(model, prompt_ids: list[int], max_new_tokens: int, *, use_cache: bool = True,
           temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
           seed: int | None = None, stop_ids: list[int] | None = None,
           stats: DecodeStats | None = None, backend: str = "auto") -> Iterator[int]:
    """Yield new token ids one at a time (see `generate` for the arguments)."""
    check_request(model, prompt_ids, max_new_tokens)
    check_sampling(temperature, top_k, top_p)
    model = backend_for(model, backend)
    generator = torch.Generator()
    if seed is None:
        generator.seed()  # nondeterministic
    else:
        generator.manual_seed(seed)
    stats = stats if stats is not None else DecodeStats()
    stop = set(stop_ids or ())
    tokens = list(prompt_ids)
    device = device_of(model)
    cache = model.new_cache(batch=1, max_len=len(tokens) + max_new_tokens) if use_cache else None
    for step in range(max_new_tokens):
        if cache is None:
            feed = tokens                       # naive: the whole sequence, every step
        else:
            feed = tokens if step == 0 else tokens[-1:]   # prefill once, then one position
        threads.adapt()   # a load that arrived since the last look is met within a second
        start = time.perf_counter()
        logits = model(torch.tensor([feed], device=device), cache=cache)
        stats.record(len(feed), len(tokens), time.perf_counter() - start)
        token = sample_next(logits[0, -1], temperature, top_k, top_p, generator)
        if token in stop:
            return
        tokens.append(token)
        yield token


def generate(model, prompt_ids: list[int], max_new_tokens: int, *, use_cache: bool = True,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             seed: int | None = None, stop_ids: list[int] | None = None,
             stats: DecodeStats | None = None, backend: str = "auto") -> list[int]:
    """Generate up to max_new_tokens after prompt_ids; returns the new token ids only.

    use_cache=False re-runs the model over the whole sequence at every step (chapter 01);
    use_cache=True prefills a preallocated KV cache once, then decodes one position per step.
    Greedy at temperature 0; otherwise sampled (top_k / top_p filters), reproducible with seed.
    Generation ends early when the model picks a token in stop_ids; that token is not returned
    (so decoding the result gives the reply without its end-of-turn marker).
    `stats`, if given, is filled with work counters and timings.
    backend: "auto" runs the model through the fast CPU path where it can serve it
    (`reference.cpu.CpuModel`: a float32 model on the CPU without hooks), "cpu" insists on it,
    "torch" runs the plain model as written (reference/model.py).
    """
    return list(stream(model, prompt_ids, max_new_tokens, use_cache=use_cache,
                       temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                       stop_ids=stop_ids, stats=stats, backend=backend))
