"""Chapter 11's ladder: one workload served by each technique of the course in turn, with the
counters that say what each step removed.

    rows = composition_ladder(model, tokenizer, prompts, max_tokens, max_num_seqs=4)

Rows, in order (each adds one technique to the row before it):

- ``naive``: `reference.decoding.generate(use_cache=False)`, one request at a time;
- ``cached``: the same loop with a KV cache (chapter 2);
- ``batched``: the engine with static batches of up to max_num_seqs requests (chapters 4, 9);
- ``prefix cache``: the same, sharing full prompt blocks of the paged pool (chapter 8);
- ``continuous``: iteration-level scheduling refills a slot as soon as a request ends (chapter 9);
- ``speculative``: the continuous engine with a drafter (chapter 10), when the engine has one.

Every row decodes greedily with a fixed length per request (EOS ignored) so all rows must return
the same tokens; `composition_ladder` checks that. Counters per row: model calls (each one reads
every weight once), positions fed through the model, slot-steps left idle in a batch, prompt
tokens whose K/V came from the prefix cache.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from reference.bench.measure import timed
from reference.decoding import DecodeStats, generate, naive_work


@dataclass
class Row:
    """One technique's run of the workload. seconds: wall time; new_tokens: generated tokens;
    model_calls: forwards (engine steps); positions_fed: token positions run through the model;
    idle_slots: batch slots that were empty in a step (max_num_seqs per step, engine rows only);
    prefix_reused: prompt tokens served from the prefix cache; extra: drafter counters."""
    name: str
    seconds: float
    new_tokens: int
    model_calls: int
    positions_fed: int
    idle_slots: int | None = None
    prefix_reused: int = 0
    outputs: list[list[int]] = field(default_factory=list, repr=False)
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds

    @property
    def calls_per_token(self) -> float:
        """Full passes over the weights per generated token."""
        return self.model_calls / self.new_tokens


def loop_row(name: str, model, prompts: list[list[int]], max_tokens: list[int], *, use_cache: bool,
             measure: int | None = None) -> Row:
    """Serve the requests one at a time with reference.decoding.generate.

    measure: time only the first `measure` requests and scale the time to all of them by their
    share of the work (positions fed), for the naive loop, whose full run would take minutes.
    The counters are always those of the whole workload (closed form for the requests not run).
    """
    chosen = range(len(prompts) if measure is None else min(measure, len(prompts)))
    outputs, positions, calls, run_positions = [], 0, 0, 0
    seconds = 0.0
    for i in chosen:
        stats = DecodeStats()
        took, out = timed(lambda: generate(model, prompts[i], max_tokens[i], use_cache=use_cache, stats=stats))
        outputs.append(out)
        seconds += took
        run_positions += stats.projected_positions
    for prompt, n in zip(prompts, max_tokens):
        positions += naive_work(len(prompt), n)[0] if not use_cache else len(prompt) + n - 1
        calls += n
    if len(outputs) < len(prompts):
        seconds *= positions / run_positions
    return Row(name, seconds, sum(max_tokens), calls, positions, outputs=outputs,
               extra={"measured_requests": len(outputs)})


def engine_row(name: str, model, tokenizer, prompts: list[list[int]], max_tokens: list[int],
               **knobs) -> Row:
    """Serve the requests with a fresh reference.engine.LLM built with `knobs`."""
    from reference.engine import LLM, SamplingParams

    llm = LLM(model, tokenizer=tokenizer, **knobs)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens]
    seconds, outs = timed(lambda: llm.generate(prompts, params))
    errors = [o.error for o in outs if o.finish_reason == "error"]
    if errors:
        raise RuntimeError(f"the engine refused a request: {errors[0]}")
    stats = llm.engine.stats
    slots = llm.engine.scheduler.max_num_seqs
    extra = {k: v for k, v in stats.items() if k.startswith(("spec", "draft", "accept", "proposed"))}
    return Row(name, seconds, sum(len(o.token_ids) for o in outs), stats["steps"], stats["tokens_fed"],
               idle_slots=stats["steps"] * slots - stats["sequences_stepped"],
               prefix_reused=sum(getattr(o, "num_cached_tokens", 0) for o in outs),
               outputs=[list(o.token_ids) for o in outs], extra=extra)


def engine_has_speculation() -> bool:
    """Whether this engine takes LLM(..., speculative=..., num_speculative_tokens=...)."""
    from reference.engine.llm import LLMEngine
    return "speculative" in inspect.signature(LLMEngine.__init__).parameters


def composition_ladder(model, tokenizer, prompts: list[list[int]], max_tokens: list[int], *,
                       max_num_seqs: int = 4, block_size: int = 16, naive_measure: int | None = None,
                       speculative: str | None = "prompt_lookup", num_speculative_tokens: int = 4
                       ) -> list[Row]:
    """Run every row of the ladder on one workload; raises if any row's tokens differ from the
    cached loop's (greedy decoding must not depend on how the work was scheduled)."""
    if len(prompts) != len(max_tokens) or not prompts:
        raise ValueError("give one max_tokens per prompt, and at least one prompt")
    longest = max(len(p) + n for p, n in zip(prompts, max_tokens))
    # every slot holding the longest request, plus room for a prompt parked in the prefix cache
    blocks = max_num_seqs * -(-longest // block_size) + -(-max(map(len, prompts)) // block_size) + 1
    pool = {"block_size": block_size, "max_num_seqs": max_num_seqs, "num_blocks": blocks}
    rows = [loop_row("naive", model, prompts, max_tokens, use_cache=False, measure=naive_measure),
            loop_row("cached", model, prompts, max_tokens, use_cache=True)]
    rows.append(engine_row("batched", model, tokenizer, prompts, max_tokens, scheduling="static",
                           enable_prefix_caching=False, **pool))
    rows.append(engine_row("prefix cache", model, tokenizer, prompts, max_tokens, scheduling="static",
                           enable_prefix_caching=True, **pool))
    rows.append(engine_row("continuous", model, tokenizer, prompts, max_tokens,
                           scheduling="continuous", enable_prefix_caching=True, **pool))
    if speculative is not None and engine_has_speculation():
        rows.append(engine_row("speculative", model, tokenizer, prompts, max_tokens,
                               scheduling="continuous", enable_prefix_caching=True,
                               speculative=speculative, num_speculative_tokens=num_speculative_tokens,
                               **pool))
    expected = rows[1].outputs
    for row in rows:
        if row.outputs != expected[:len(row.outputs)]:
            raise RuntimeError(f"the {row.name} row returned different tokens from the cached loop")
    return rows


def removed(previous: Row, row: Row) -> str:
    """What `row`'s technique took away relative to `previous`, from the counters, in words."""
    if row.name == "cached":
        return f"{previous.positions_fed - row.positions_fed:,} recomputed positions"
    if row.name == "batched":
        return (f"{previous.model_calls - row.model_calls:,} passes over the weights "
                f"({previous.calls_per_token:.2f} → {row.calls_per_token:.2f} per token)")
    if row.name == "prefix cache":
        return f"{row.prefix_reused - previous.prefix_reused:,} duplicated prefix positions"
    if row.name == "continuous":
        return f"{(previous.idle_slots or 0) - (row.idle_slots or 0):,} idle slot-steps"
    if row.name == "speculative":
        return f"{previous.model_calls - row.model_calls:,} target passes"
    return "(the baseline)"


# Why a removal did not show up as time saved, per row, in terms of this run's counters
# ({saved}: prompt positions the prefix cache saved; {steps}: model calls; {fed}, {fed_before}:
# positions fed by this row and the one before).
WHY_NOT_FASTER = {
    "batched": ("a step over several sequences costs more than a step over one when the processor is "
                "busy computing rather than waiting for weights, and each engine step also pays for "
                "its Python bookkeeping"),
    "prefix cache": ("the {saved:,} positions it saved were all prompt positions, fed in the first "
                     "steps; the decode steps, most of the {steps} steps, did the same work as before"),
    "continuous": ("fewer steps are not less time when the steps get longer: a request admitted "
                   "mid-flight adds its whole prompt to a decode step, and with this few requests other "
                   "work on the machine moves times of this size"),
    "speculative": ("each verification feeds the draft as well as the newest token ({fed:,} positions "
                    "fed against {fed_before:,}); where a step's cost grows with the positions it feeds, "
                    "as on a CPU, the passes saved did not pay for the longer passes"),
}


def _why_not_faster(previous: Row, row: Row) -> str:
    """Why a removal did not show up as time saved (WHY_NOT_FASTER, filled from the counters)."""
    reason = WHY_NOT_FASTER.get(row.name, "other work on the machine moved the times more than the technique did")
    return reason.format(saved=row.prefix_reused - previous.prefix_reused, steps=row.model_calls,
                         fed=row.positions_fed, fed_before=previous.positions_fed)


def step_sentence(previous: Row, row: Row) -> str:
    """One sentence on `row` against `previous`: the measured time ratio, worded from the data
    (faster, slower or about the same), what the counters say was removed, and a reason when the
    removal did not show up as time saved."""
    from reference.bench.prose import times_phrase

    phrase = times_phrase(row.seconds / previous.seconds)
    than = "as" if phrase == "about as fast" else "than"
    sentence = (f"**{row.name}** removed {removed(previous, row)} and was {phrase} {than} "
                f"**{previous.name}** ({previous.seconds:.1f} s → {row.seconds:.1f} s)")
    if phrase.endswith("faster"):
        return sentence + "."
    return sentence + f": {_why_not_faster(previous, row)}."
