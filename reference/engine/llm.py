"""The engine's front: `LLMEngine` (add requests, step, collect outputs) and `LLM.generate`.

    from reference.engine import LLM, SamplingParams
    llm = LLM("smollm2-135m", max_num_seqs=16)
    for out in llm.generate(["The capital of France is", "Once upon a time"],
                            SamplingParams(max_tokens=20)):
        print(out.text, out.finish_reason, out.ttft)

One `step()`: the scheduler picks sequences and token counts, the block manager gives them slots,
the runner runs the model once for all of them, each sequence that reached its last token samples
one (with its own generator, so a seeded request gives the same tokens whatever shares its batch),
and finished sequences leave, their blocks freed or kept for the prefix cache.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Sequence as SequenceABC

import torch

from reference import threads
from reference.cpu import backend_for
from reference.engine.params import RequestMetrics, RequestOutput, SamplingParams
from reference.engine.runner import ModelRunner
from reference.engine.sampler import Sampler
from reference.engine.scheduler import Scheduler
from reference.engine.sequence import Sequence, Status
from reference.paging import BlockManager

DEFAULT_KV_CACHE_BYTES = 512 * 2 ** 20


class LLMEngine:
    """Step-level serving API (not thread-safe: drive it from one thread)."""

    def __init__(self, model, tokenizer, *, block_size: int = 16, num_blocks: int | None = None,
                 max_num_seqs: int = 32, max_num_batched_tokens: int = 512,
                 enable_prefix_caching: bool = True, scheduling: str = "continuous",
                 attention: str = "torch", kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES,
                 speculative: str | None = None, num_speculative_tokens: int = 4,
                 speculative_draft_layers: int | None = None, backend: str = "auto"):
        for name, value in (("block_size", block_size), ("max_num_seqs", max_num_seqs),
                            ("max_num_batched_tokens", max_num_batched_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs "
                             f"({max_num_seqs}): every running sequence decodes one token per step")
        model = backend_for(model, backend)   # the fast CPU path where it serves (reference.cpu)
        self.model, self.tokenizer, self.config = model, tokenizer, model.config
        if num_blocks is None:  # a memory budget, but never more than every slot could ever use
            by_memory = kv_cache_bytes // ModelRunner.bytes_per_block(model, block_size)
            num_blocks = max(1, min(by_memory, -(-max_num_seqs * self.config.max_seq_len // block_size)))
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching)
        self.speculator = None
        if speculative is not None:
            from reference.engine.speculation import Speculator
            self.speculator = Speculator(model, speculative, num_speculative_tokens, speculative_draft_layers)
        self.scheduler = Scheduler(self.blocks, max_num_seqs, max_num_batched_tokens, scheduling,
                                   self.speculator.propose if self.speculator else None)
        self.runner = ModelRunner(model, num_blocks, block_size, attention)
        self.sampler = Sampler()
        self.stop_ids = set(getattr(tokenizer, "stop_ids", []))
        self._ids = itertools.count()
        self._sequences: dict[str, Sequence] = {}
        self.counters = {"steps": 0, "tokens_fed": 0, "sequences_stepped": 0, "decode_tokens": 0,
                         "model_seconds": 0.0, "host_seconds": 0.0}

    # ----- requests ------------------------------------------------------------------------
    def add_request(self, prompt, params: SamplingParams | None = None, request_id: str | None = None,
                    arrival_time: float | None = None) -> str:
        """Queue a request (text or token ids); returns its id. Raises ValueError / TypeError
        with a one-line reason when it cannot be served; nothing else is affected."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        params.validate()
        text, ids = self._prompt_ids(prompt)
        window, pool = self.config.max_seq_len, self.blocks.num_blocks * self.blocks.block_size
        if len(ids) >= window:
            raise ValueError(f"prompt has {len(ids)} tokens; the context window is {window} "
                             f"(at least one must be left to generate)")
        if len(ids) + 1 > pool:
            raise ValueError(f"prompt has {len(ids)} tokens; the whole K/V pool holds {pool} "
                             f"({self.blocks.num_blocks} blocks of {self.blocks.block_size})")
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if request_id in self._sequences:
            raise ValueError(f"request id {request_id!r} is already in use")
        seq = Sequence(request_id, text, ids, params, arrival_time)
        self._sequences[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def _prompt_ids(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
            if not ids:
                raise ValueError("the prompt is empty: give at least one token")
            return prompt, ids
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            prompt = prompt["prompt_token_ids"]
        if hasattr(prompt, "tolist"):
            prompt = prompt.tolist()
        if not isinstance(prompt, SequenceABC) or isinstance(prompt, bytes):
            raise TypeError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token")
        vocab = self.config.vocab_size
        for t in prompt:
            if isinstance(t, bool) or not isinstance(t, int):
                raise TypeError(f"token ids must be ints, got {type(t).__name__}: {t!r}")
            if not 0 <= t < vocab:
                raise ValueError(f"token id {t} is outside the vocabulary (size {vocab})")
        return None, list(prompt)

    def abort(self, request_id: str) -> None:
        """Stop a request now (its blocks are freed); unknown or finished ids are ignored."""
        seq = self._sequences.pop(str(request_id), None)
        if seq is not None and seq.status is not Status.FINISHED:
            self.scheduler.release(seq)
            seq.finish("abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ----- one step ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one model step; returns the requests that produced a token or finished in it."""
        threads.adapt()   # the cores other processes left free, looked at once a second
        began, model_before = time.perf_counter(), self.runner.model_seconds
        batch = self.scheduler.schedule()
        finished = list(self.scheduler.finished)
        advanced = []
        if batch:
            self.runner.copy_blocks(self.scheduler.block_copies)
            logits = self.runner.run(batch, self.blocks)
            ending = [seq for seq, n in batch if seq.feeds_to_end(n)]   # the sequences with logits rows
            for seq, n in batch:
                seq.num_computed += n
            now = time.perf_counter()
            for seq, tokens in zip(ending, self._sample(ending, logits)):
                self._emit(seq, tokens, now)
                advanced.append(seq)
                if seq.status is Status.FINISHED:
                    finished.append(seq)
            self._count(batch)
        for seq in finished:
            self.scheduler.release(seq)
            self._sequences.pop(seq.request_id, None)
            seq.text = self._final_text(seq)
        decode = self.tokenizer.decode
        outputs = [seq.output(decode) for seq in dict.fromkeys(advanced + finished)]
        model = self.runner.model_seconds - model_before
        self.counters["model_seconds"] += model
        self.counters["host_seconds"] += time.perf_counter() - began - model
        return outputs

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> list[list[int]]:
        """Each sequence's new tokens from logits [R, vocab] (its rows in order: 1 + len(drafts)).
        Sequences without drafts sample together, from their one row; with drafts, the acceptance
        test picks 1 to len(drafts) + 1 tokens, and the slots of rejected drafts go back to the pool."""
        counts = [1 + len(seq.draft_ids) for seq in seqs]
        if len(counts) == len(logits):                      # no drafts: one row per sequence
            picked = self.sampler(logits, [seq.params for seq in seqs], [seq.generator for seq in seqs])
            return [[token] for token in picked]
        plain = [b for b, seq in enumerate(seqs) if not seq.draft_ids]
        last_rows = [end - 1 for end in itertools.accumulate(counts)]
        picked = iter(self.sampler(logits[[last_rows[b] for b in plain]], [seqs[b].params for b in plain],
                                   [seqs[b].generator for b in plain]))
        tokens = []
        for seq, rows in zip(seqs, logits.split(counts)):
            if seq.draft_ids:
                n_before = seq.num_tokens
                tokens.append(self.speculator.verify(seq, rows))
                seq.num_computed = n_before + len(tokens[-1]) - 1   # last token + accepted drafts hold K/V
                self.blocks.truncate(seq.request_id, seq.num_computed)
            else:
                tokens.append([next(picked)])
        return tokens

    def _emit(self, seq: Sequence, tokens: list[int], now: float) -> None:
        """Append seq's new tokens until one of them finishes it."""
        p = seq.params
        if seq.metrics.first_token_time is None:
            seq.metrics.first_token_time = now
        for token in tokens:
            if token in self.stop_ids and not p.ignore_eos:
                seq.finish("stop")               # the end-of-text token is not part of the reply
                return
            seq.token_ids.append(token)
            if p.stop and any(s in self.tokenizer.decode(seq.output_ids[-64:]) for s in p.stop_strings):
                seq.finish("stop")
                return
            if seq.num_tokens - seq.num_prompt_tokens >= p.max_tokens or seq.num_tokens >= self.config.max_seq_len:
                seq.finish("length")
                return

    def _final_text(self, seq: Sequence) -> str:
        text = self.tokenizer.decode(seq.output_ids)
        cuts = [text.find(s) for s in seq.params.stop_strings if s in text]
        return text[:min(cuts)] if cuts else text

    def _count(self, batch) -> None:
        c = self.counters
        c["steps"] += 1
        c["tokens_fed"] += sum(n for _, n in batch)
        c["sequences_stepped"] += len(batch)
        c["decode_tokens"] += sum(1 for _, n in batch if n == 1)

    @property
    def stats(self) -> dict:
        """steps, preemptions, prefix cache hits / misses (blocks looked up by allocate), hit rate
        (prompt tokens found cached / prompt tokens in full blocks, over every admission, as vLLM
        counts it), mean batch size, slot
        utilisation (mean fraction of the max_num_seqs slots busy in a step); with speculation,
        spec_rounds / spec_proposed / spec_checked / spec_accepted."""
        c, s = self.counters, self.scheduler
        steps = max(c["steps"], 1)
        spec = {} if self.speculator is None else {f"spec_{k}": v for k, v in self.speculator.counters.items()}
        queried = s.prefix_queried_tokens
        return {**c, **spec, "preemptions": s.preemptions, "prefix_hits": self.blocks.prefix_hits,
                "prefix_misses": self.blocks.prefix_misses,
                "prefix_hit_rate": s.prefix_hit_tokens / queried if queried else 0.0,
                "mean_batch_size": c["sequences_stepped"] / steps,
                "slot_utilisation": c["sequences_stepped"] / (steps * s.max_num_seqs),
                "num_blocks": self.blocks.num_blocks}


class LLM:
    """`LLM(model="smollm2-135m" | "tiny" | a reference.model.Llama, tokenizer=..., **engine knobs)`;
    the knobs are `LLMEngine`'s (block_size, num_blocks, max_num_seqs, max_num_batched_tokens,
    enable_prefix_caching, scheduling, attention, kv_cache_bytes, backend = "auto" | "cpu" |
    "torch" (reference.cpu.backend_for), speculative = None |
    "prompt_lookup" | "layer_skip", num_speculative_tokens, speculative_draft_layers).

    device: where a model named by string is loaded: "auto" (CUDA when this torch sees a GPU,
    else the CPU), "cpu", "cuda" or "cuda:N". A model object is served where it is; a device that
    names another place is refused (move the model first: `model.to(device)`)."""

    def __init__(self, model="smollm2-135m", *, tokenizer=None, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "auto", **knobs):
        from reference.device import resolve_device

        if isinstance(model, str):
            from reference.model import load_model
            model, loaded_tokenizer = load_model(model, dtype=dtype, device=resolve_device(device))
            tokenizer = tokenizer or loaded_tokenizer
        elif tokenizer is None:
            raise ValueError("pass tokenizer= with a model object")
        elif device != "auto" and resolve_device(device) != model.device:
            raise ValueError(f"the model is on {model.device}, not {resolve_device(device)}: move it "
                             f"with model.to(...) or leave device='auto' to serve it where it is")
        self.tokenizer = tokenizer
        self.engine = LLMEngine(model, tokenizer, **knobs)

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """Serve every prompt (text or token ids; one or a list) to completion; outputs in prompt
        order. A request that cannot be served comes back with finish_reason "error" and a
        one-line `error`; the others are unaffected."""
        prompts = _as_prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts: give one, or one per prompt")
        results: dict[int, RequestOutput] = {}
        ids: dict[str, int] = {}
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            try:
                ids[self.engine.add_request(prompt, p)] = i
            except (ValueError, TypeError) as error:
                results[i] = _rejected(prompt, error)
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.finished and out.request_id in ids:
                    results[ids[out.request_id]] = out
        return [results[i] for i in range(len(prompts))]


def _as_prompt_list(prompts) -> list:
    """One prompt (a string or a list of ints) or a list of prompts -> a list of prompts."""
    if isinstance(prompts, (str, dict)) or hasattr(prompts, "tolist"):
        return [prompts]
    if not isinstance(prompts, SequenceABC):
        raise TypeError(f"prompts must be a string, a list of token ids, or a list of those; "
                        f"got {type(prompts).__name__}")
    if prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [prompts]
    return list(prompts)


def _rejected(prompt, error: Exception) -> RequestOutput:
    now = time.perf_counter()
    text = prompt if isinstance(prompt, str) else None
    ids = prompt if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) else []
    return RequestOutput("", text, ids, [], "", True, "error", RequestMetrics(now, None, now), error=str(error))
