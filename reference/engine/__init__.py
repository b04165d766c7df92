"""A small serving engine for the course's model (chapters 08–09), shaped like vLLM's offline API.

    from reference.engine import LLM, SamplingParams

`params` (SamplingParams, RequestOutput), `sequence` (one request's state), `scheduler`
(continuous or static batching, chunked prefill, preemption), `runner` (one model call per step
over the paged pool), `llm` (LLMEngine's step API and LLM.generate), `server` (OpenAI-compatible HTTP).
"""
from reference.engine.llm import LLM, LLMEngine
from reference.engine.params import RequestMetrics, RequestOutput, SamplingParams

__all__ = ["LLM", "LLMEngine", "RequestMetrics", "RequestOutput", "SamplingParams"]
