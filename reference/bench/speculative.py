"""Speculative decoding benchmark (chapter 10), side by side in one process.

    python -m reference.bench speculative [--tokens 128] [--k 4] [--skip-layers 24]
                                          [--repeats 3] [--threads N] [--json PATH] [--no-hf]

Greedy decoding on SmolLM2-135M-Instruct, two chat tasks: (a) input-grounded (correct the spelling
of a given passage: the reply copies long spans of the prompt) and (b) open-ended (a story).
For each task: plain KV-cached decoding (`reference.decoding.generate`), then speculative decoding
with each drafter; tokens/s (new tokens / wall time of the call, prefill included, median of
--repeats interleaved runs), the ratio to plain decoding, measured alpha, tokens per target pass
and whether the output equals plain decoding's token for token (it must); beside them the peer,
transformers' `generate` on the same weights, plain and with its own prompt lookup
(`prompt_lookup_num_tokens=k`). Then the engine at
batch 1 and batch 8 (8 copies of the grounded task), without and with prompt-lookup drafts: where
speculation stops paying, since a bigger batch already shares each weight read among sequences.
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from reference.cpu import backend_for
from reference.bench.hf_peer import load_hf_peer
from reference.bench.measure import timed
from reference.decoding import generate
from reference.drafters import PromptLookupDrafter, layer_skip_drafter
from reference.engine import LLM, SamplingParams
from reference.model import load_model
from reference.speculative import speculative_generate
from reference.threads import configure

PASSAGE = ("The lighthouse stood on a rocky iland at the edge of the bay. Every nigth its lamp turned "
           "slowly, sending a beam of light acros the dark water so that ships coud find their way "
           "home. The keeper climbed the stairs twice a day to clean the glass and wind the clockwork, "
           "and in winter he often stayed awake untill dawn, listening to the storm and wathcing for "
           "boats in trouble.")

TASKS = {
    "grounded": "Correct the spelling mistakes in this paragraph and write out the corrected "
                "paragraph:\n\n" + PASSAGE,
    "open": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def drafters(model, skip_layers: int) -> dict:
    return {"prompt lookup": PromptLookupDrafter(max_ngram=3),
            f"layer skip ({skip_layers}/{model.config.n_layers})": layer_skip_drafter(model, skip_layers)}


@torch.inference_mode()
def hf_generate(hf, ids: list[int], n: int, stop: list[int], lookup: int | None) -> tuple[float, list[int]]:
    """(seconds, new tokens without the stop token) of transformers' greedy `generate`, plain or
    with its own prompt lookup (`prompt_lookup_num_tokens`)."""
    inputs = torch.tensor([ids])
    extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    seconds, out = timed(lambda: hf.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=n,
                                             do_sample=False, eos_token_id=list(stop), pad_token_id=stop[0],
                                             **extra))
    new = out[0, len(ids):].tolist()
    return seconds, new[:-1] if new and new[-1] in stop else new


def run_task(model, tok, prompt: str, args, hf=None) -> list[dict]:
    """Rows for one task: plain decoding first, then one per drafter, then the HF peer's plain
    and prompt-lookup `generate` (ratios to HF's plain run)."""
    ids, stop = tok.chat_ids(prompt), tok.stop_ids
    plain_times, spec_runs = [], {name: [] for name in drafters(model, args.skip_layers)}
    hf_runs = {"HF generate": [], "HF prompt lookup": []} if hf is not None else {}
    for _ in range(args.repeats):  # interleaved, so that a burst of load hits every row
        seconds, plain = timed(lambda: generate(model, ids, args.tokens, stop_ids=stop))
        plain_times.append(seconds)
        for name, drafter in drafters(model, args.skip_layers).items():
            spec_runs[name].append(speculative_generate(model, drafter, ids, args.tokens, k=args.k, stop_ids=stop))
        for name in hf_runs:
            hf_runs[name].append(hf_generate(hf, ids, args.tokens, stop, args.k if "lookup" in name else None))
    plain_speed = len(plain) / statistics.median(plain_times)
    rows = [dict(drafter="none (plain decoding)", tokens=len(plain), tok_s=plain_speed, ratio=1.0,
                 alpha=None, tokens_per_pass=1.0, same=True, prompt_tokens=len(ids))]
    for name, runs in spec_runs.items():
        out, st = runs[0]
        speed = st.new_tokens / statistics.median(s.seconds for _, s in runs)
        rows.append(dict(drafter=name, tokens=st.new_tokens, tok_s=speed, ratio=speed / plain_speed,
                         alpha=st.alpha_hat, tokens_per_pass=st.tokens_per_pass,
                         draft_share=st.draft_seconds / st.seconds, same=all(o == plain for o, _ in runs),
                         prompt_tokens=len(ids)))
    if hf_runs:
        hf_plain = len(hf_runs["HF generate"][0][1]) / statistics.median(t for t, _ in hf_runs["HF generate"])
        for name, runs in hf_runs.items():
            speed = len(runs[0][1]) / statistics.median(t for t, _ in runs)
            rows.append(dict(drafter=name, tokens=len(runs[0][1]), tok_s=speed, ratio=speed / hf_plain,
                             alpha=None, tokens_per_pass=None, same=all(out == plain for _, out in runs),
                             prompt_tokens=len(ids)))
    return rows


def engine_rows(model, tok, prompt: str, args, batches=(1, 8)) -> list[dict]:
    """Engine throughput at each batch size without and with prompt-lookup drafts (greedy)."""
    ids, rows = tok.chat_ids(prompt), []
    for batch in batches:
        outputs = {}
        for speculative in (None, "prompt_lookup"):
            llm = LLM(model, tokenizer=tok, max_num_seqs=batch, max_num_batched_tokens=max(512, batch * (args.k + 1)),
                      speculative=speculative, num_speculative_tokens=args.k)
            seconds, outs = timed(lambda: llm.generate([ids] * batch, SamplingParams(max_tokens=args.tokens)))
            outputs[speculative] = [o.token_ids for o in outs]
            stats = llm.engine.stats
            rows.append(dict(batch=batch, drafter=speculative or "none", steps=stats["steps"],
                             tokens=sum(len(o.token_ids) for o in outs), seconds=seconds,
                             tok_s=sum(len(o.token_ids) for o in outs) / seconds,
                             same=outputs[speculative] == outputs[None]))
        rows[-1]["ratio"] = rows[-1]["tok_s"] / rows[-2]["tok_s"]
    return rows


def print_table(results: dict) -> None:
    header = (f"{'task':<9} {'drafter':<22} {'new':>4} {'tok/s':>7} {'vs plain':>9} "
              f"{'alpha':>6} {'tok/pass':>9} {'of promise':>11} {'draft time':>11} {'same':>5}")
    print(header + "\n" + "-" * len(header))
    for task, rows in results.items():
        for r in rows:
            alpha = f"{r['alpha']:6.2f}" if r["alpha"] is not None else f"{'-':>6}"
            share = f"{r['draft_share']:11.0%}" if "draft_share" in r else f"{'-':>11}"
            per_pass = f"{r['tokens_per_pass']:9.2f}" if r["tokens_per_pass"] is not None else f"{'-':>9}"
            promise = (f"{r['ratio'] / r['tokens_per_pass']:11.0%}" if r["tokens_per_pass"] and r["alpha"] is not None
                       else f"{'-':>11}")
            print(f"{task:<9} {r['drafter']:<22} {r['tokens']:>4} {r['tok_s']:7.1f} {r['ratio']:8.2f}x "
                  f"{alpha} {per_pass} {promise} {share} {'yes' if r['same'] else 'NO':>5}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m reference.bench speculative",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per run (fewer if the reply ends)")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per target pass")
    parser.add_argument("--skip-layers", type=int, default=24, help="layers the layer-skip drafter keeps")
    parser.add_argument("--repeats", type=int, default=3, help="runs per row (median)")
    parser.add_argument("--threads", type=int, default=None, help="default: the cores free now")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers peer rows")
    args = parser.parse_args(argv)
    threads = configure(args.threads)
    model, tok = load_model("smollm2-135m")
    model = backend_for(model)   # the fast CPU path where it serves, drafts and engine included
    generate(model, tok.chat_ids("Hi"), 4)  # warm-up: allocator, thread pool
    print(f"threads: {threads}   backend: {type(model).__name__}   k: {args.k}   greedy, up to {args.tokens} new tokens, "
          f"median of {args.repeats}\n")
    hf = None if args.no_hf else load_hf_peer()
    results = {task: run_task(model, tok, prompt, args, hf) for task, prompt in TASKS.items()}
    print_table(results)
    print("\nalpha = accepted / checked drafts; tok/pass = new tokens / target forward passes; "
          "of promise = (vs plain) / (tok/pass), the share of the passes' saving that reached the wall clock; "
          "draft time = share of the wall time spent drafting; same = output equals our plain decoding's; "
          "HF rows: transformers' generate on the same weights, 'vs plain' against HF's own plain run.")
    engine = engine_rows(model, tok, TASKS["grounded"], args)
    print(f"\nengine, grounded task: {'batch':>5} {'drafter':<14} {'steps':>6} {'tok/s':>7} {'vs none':>8} {'same':>5}")
    for r in engine:
        ratio = f"{r['ratio']:7.2f}x" if "ratio" in r else f"{'-':>8}"
        print(f"{'':22}{r['batch']:>5} {r['drafter']:<14} {r['steps']:>6} {r['tok_s']:7.1f} {ratio} "
              f"{'yes' if r['same'] else 'NO':>5}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(threads=threads, k=args.k, tokens=args.tokens, repeats=args.repeats,
                           tasks=TASKS, results=results, engine=engine), f, indent=1)
