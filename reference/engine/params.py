"""What a request asks for (`SamplingParams`) and what it gets back (`RequestOutput`), vLLM-shaped."""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """How to pick tokens for one request.

    temperature 0 is greedy; top_k = -1 and top_p = 1.0 switch those filters off; max_tokens new
    tokens at most; seed makes the request's sampling reproducible whatever else is in the batch;
    ignore_eos keeps going past end-of-text; stop: strings that end the reply (not included).
    """
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    seed: int | None = None
    ignore_eos: bool = False
    stop: str | list[str] | None = None

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ValueError / TypeError with a one-line reason for settings that make no sense."""
        def is_number(x):
            return isinstance(x, (int, float)) and not isinstance(x, bool)

        def is_int(x):
            return isinstance(x, int) and not isinstance(x, bool)

        if not (is_number(self.temperature) and math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not (is_number(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not (is_int(self.top_k) and (self.top_k == -1 or self.top_k >= 1)):
            raise ValueError(f"top_k must be -1 (no limit) or an integer >= 1, got {self.top_k!r}")
        if not is_int(self.max_tokens):
            raise TypeError(f"max_tokens must be an int, got {type(self.max_tokens).__name__}")
        if self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.seed is not None and not is_int(self.seed):
            raise TypeError(f"seed must be an int or None, got {type(self.seed).__name__}")
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        if stops is not None and not (isinstance(stops, (list, tuple))
                                      and all(isinstance(s, str) and s for s in stops)):
            raise TypeError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")

    @property
    def filters(self) -> tuple[float, int | None, float | None]:
        """(temperature, top_k, top_p) in reference.decoding's convention: None = no filter."""
        return self.temperature, None if self.top_k == -1 else self.top_k, None if self.top_p == 1.0 else self.top_p

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


@dataclass
class RequestMetrics:
    """Times in seconds on time.perf_counter()'s clock. ttft: arrival -> first token; tpot: mean
    time per output token after the first (0.0 for a one-token reply)."""
    arrival_time: float
    first_token_time: float | None = None
    finish_time: float | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    def tpot(self, n_tokens: int) -> float | None:
        if self.finish_time is None or self.first_token_time is None:
            return None
        return (self.finish_time - self.first_token_time) / (n_tokens - 1) if n_tokens > 1 else 0.0


@dataclass
class RequestOutput:
    """One request's result so far. finish_reason: None while running, "stop" (end-of-text token or
    a stop string), "length" (max_tokens, the context window or a full pool), "error" (the request
    was rejected; `error` says why), "abort"."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None
    metrics: RequestMetrics
    error: str | None = None
    num_cached_tokens: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def ttft(self) -> float | None:
        return self.metrics.ttft

    @property
    def tpot(self) -> float | None:
        return self.metrics.tpot(len(self.token_ids))
