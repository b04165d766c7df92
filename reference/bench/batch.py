"""`python -m reference.bench batch`: our engine against transformers' own batching, same requests.

    python -m reference.bench batch [--requests 16] [--tokens 48] [--seed 0] [--threads N]
                                    [--model smollm2-135m|tiny] [--rounds 3] [--json PATH] [--profile]

Every request arrives at once and generates exactly `--tokens` greedy tokens (end-of-turn
ignored), so each row does the same work. Rows, side by side in one process on the same float32
weights and threads:

- HF `generate`, one request after another (the one-at-a-time peer);
- HF `generate_batch`: transformers' continuous batching, paged attention through SDPA
  (since transformers 5.23 a model's plain `sdpa` attention runs paged there; the old
  `"paged|sdpa"` spelling is deprecated), all requests handed over at once;
- our engine (`reference.engine.LLM`) with every request in flight, without and with its prefix
  cache (the prompts share a system message, as a served chat application's do).

Each row runs `--rounds` times, the rows taking turns, and its median run counts: on a shared
machine whose speed drifts by tens of percent within minutes, a single run of each row measured
the drift as much as the rows (the engine's row once ran 1.4x slower than its profiled rerun a
minute later).

Columns: output tokens/s (all requests' tokens over the wall time of the call), the ratio to each
HF row, and how many replies equal HF's sequential greedy reply token for token. For the tiny
model, which transformers cannot load, the peer rows are our own batch-1 loop.

`--profile` then serves the same requests once more through the engine (no prefix cache) under
`torch.profiler` and prints where its wall time went, by kind of work (`FAMILIES`).
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from reference.device import resolve_device
from reference.bench.measure import provenance, timed
from reference.bench.workload import SHORT_SYSTEM_PROMPT, SYSTEM_PROMPT, make_workload

HF_SEQUENTIAL, HF_BATCH = "HF generate, sequential", "HF generate_batch"
OURS_SEQUENTIAL = "ours, sequential (peer stand-in)"
SHORT = {HF_SEQUENTIAL: "HF seq", HF_BATCH: "HF batch", OURS_SEQUENTIAL: "seq"}   # column headers


@torch.inference_mode()
def hf_sequential(hf, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Each prompt through transformers' greedy `generate`, exactly n new tokens."""
    outs = []
    for ids in prompts:
        inputs = torch.tensor([ids], device=hf.device)
        out = hf.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=hf.config.eos_token_id)
        outs.append(out[0, len(ids):].tolist())
    return outs


def hf_batch(hf, prompts: list[list[int]], n: int) -> list[list[int]]:
    """All prompts through transformers' continuous batching (`generate_batch`), greedy, n tokens
    each (no end-of-sequence token, so none stops early)."""
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=None,
                              pad_token_id=hf.config.eos_token_id)
    outs = hf.generate_batch([list(p) for p in prompts], generation_config=config, warmup=False)
    by_index = sorted(outs.values(), key=lambda o: int(o.request_id.rsplit("_", 1)[1]))
    return [list(o.generated_tokens) for o in by_index]


def ours_engine(model, tokenizer, prompts: list[list[int]], n: int, prefix_caching: bool,
                attention: str = "torch") -> list[list[int]]:
    from reference.engine import LLM, SamplingParams

    llm = LLM(model, tokenizer=tokenizer, max_num_seqs=len(prompts), enable_prefix_caching=prefix_caching,
              attention=attention)
    outs = llm.generate(prompts, SamplingParams(max_tokens=n, ignore_eos=True))
    return [o.token_ids for o in outs]


def ours_sequential(model, prompts: list[list[int]], n: int) -> list[list[int]]:
    from reference.decoding import generate

    return [generate(model, ids, n) for ids in prompts]


def runners(model, tokenizer, hf, attention: str = "torch") -> dict:
    """Row name -> fn(prompts, n) -> replies, peers first."""
    if hf is not None:
        peers = {HF_SEQUENTIAL: lambda p, n: hf_sequential(hf, p, n), HF_BATCH: lambda p, n: hf_batch(hf, p, n)}
    else:
        peers = {OURS_SEQUENTIAL: lambda p, n: ours_sequential(model, p, n)}
    return {**peers,
            "ours: engine": lambda p, n: ours_engine(model, tokenizer, p, n, False, attention),
            "ours: engine + prefix cache": lambda p, n: ours_engine(model, tokenizer, p, n, True, attention)}


def measure(model, tokenizer, hf, prompts: list[list[int]], n: int, attention: str = "torch",
            rounds: int = 1) -> list[dict]:
    """Each row run `rounds` times, the rows taking turns (after a short warm-up of each), so that
    a busy minute on a shared machine falls on every row alike; a row's time is its median run.
    Rows with tok/s, the spread of their runs and their replies."""
    runs = runners(model, tokenizer, hf, attention)
    for run in runs.values():
        run(prompts[:2], 2)                                  # warm-up: thread pool, allocator, kernels
    seconds, replies = {name: [] for name in runs}, {}
    for round_ in range(rounds):
        for name, run in runs.items():
            took, replies[name] = timed(lambda: run(prompts, n), model.device)
            seconds[name].append(took)
            tokens = sum(map(len, replies[name]))
            print(f"  round {round_ + 1}/{rounds}: {name:32} {tokens / took:8.1f} tok/s", flush=True)
    rows = []
    for name in runs:
        tokens = sum(map(len, replies[name]))
        rows.append(dict(config=name, seconds=statistics.median(seconds[name]), runs=seconds[name],
                         tokens=tokens, tok_s=tokens / statistics.median(seconds[name]), replies=replies[name]))
    reference = rows[0]["replies"]
    for row in rows:
        row["same_as_first"] = sum(a == b for a, b in zip(row["replies"], reference))
        row["ratios"] = {peer["config"]: row["tok_s"] / peer["tok_s"] for peer in rows[:-2]}
    return rows


NATIVE_ATTENTION = "native::paged_decode_attention"   # the profiler's name for the C decode attention
# Kind of work -> operator names (torch.profiler keys) whose self time counts for it.
FAMILIES = {
    "weight matmuls": ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::bmm"),
    "attention (SDPA)": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                         "aten::_scaled_dot_product_efficient_attention", "aten::scaled_dot_product_attention"),
    "attention (native, in the pool)": (NATIVE_ATTENTION,),
    "K/V gather and store": ("aten::index_select", "aten::index_copy_", "aten::index", "aten::_index_put_impl_"),
    "element-wise (norms, RoPE, SiLU, residuals)": (
        "aten::mul", "aten::mul_", "aten::add", "aten::pow", "aten::mean", "aten::sum", "aten::silu",
        "aten::rsqrt", "aten::flip", "aten::where", "aten::_fused_rms_norm", "aten::cat", "aten::neg",
        "aten::fill_", "aten::copy_"),
}


def profile_engine(model, tokenizer, prompts: list[list[int]], n: int) -> dict[str, float]:
    """Serve `prompts` once through the engine under torch.profiler: seconds by kind of work
    (`FAMILIES`; the self time of each operator on the engine's thread, the native decode
    attention recorded as one), "other operators", and "outside operators" (Python: scheduling,
    block tables, sampling), which sum to the wall time."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from reference.cpu import native_attention

    real = native_attention.paged_decode

    def recorded(*args):   # a C call is no operator: name it for the profiler
        with record_function(NATIVE_ATTENTION):
            return real(*args)

    native_attention.paged_decode = recorded
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            seconds, _ = timed(lambda: ours_engine(model, tokenizer, prompts, n, False), model.device)
    finally:
        native_attention.paged_decode = real
    family_of = {name: family for family, names in FAMILIES.items() for name in names}
    split = dict.fromkeys([*FAMILIES, "other operators"], 0.0)
    for event in prof.key_averages():
        split[family_of.get(event.key, "other operators")] += event.self_cpu_time_total / 1e6
    split["outside operators"] = max(0.0, seconds - sum(split.values()))
    return split


def format_profile(split: dict[str, float]) -> str:
    total = sum(split.values())
    return "\n".join(f"{name:<44} {s:7.2f} s {s / total:6.1%}" for name, s in split.items())


def format_table(rows: list[dict], n_requests: int) -> str:
    peers = list(rows[0]["ratios"])
    header = f"{'configuration':<32} {'tok/s':>7}" + "".join(f" {'vs ' + SHORT[p]:>12}" for p in peers) + \
        f" {'same as ' + SHORT[peers[0]]:>15}"
    lines = [header, "-" * len(header)]
    for r in rows:
        cells = "".join(f" {r['ratios'][p]:11.2f}x" for p in peers)
        lines.append(f"{r['config']:<32} {r['tok_s']:7.1f}{cells} {r['same_as_first']:>9} / {n_requests}")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    from reference.model import load_model
    from reference.threads import configure

    parser = argparse.ArgumentParser(prog="python -m reference.bench batch", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=48, help="greedy tokens per request (exactly)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the user messages")
    parser.add_argument("--threads", type=int, default=None, help="default: the cores free now")
    parser.add_argument("--model", choices=["smollm2-135m", "tiny"], default="smollm2-135m")
    parser.add_argument("--device", default="auto", help="auto (CUDA when torch sees a GPU), cpu, cuda or cuda:N")
    parser.add_argument("--attention", default="torch", choices=["torch", "triton"], help="the engine's paged attention")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of every row, taking turns; each row's median counts (default 3)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows and their provenance as JSON")
    parser.add_argument("--profile", action="store_true",
                        help="then profile one more engine run and print where its time went")
    args = parser.parse_args(argv)
    args.device = str(resolve_device(args.device))
    if args.requests < 1 or args.tokens < 1 or args.rounds < 1:
        parser.error("--requests, --tokens and --rounds must be >= 1")
    info = provenance("python -m reference.bench batch", argv, configure(args.threads), args.device)
    model, tokenizer = load_model(args.model, device=args.device)
    hf = None
    if args.model == "smollm2-135m":
        from reference.bench.hf_peer import load_hf_peer
        hf = load_hf_peer(device=args.device)
    system = SYSTEM_PROMPT if args.model == "smollm2-135m" else SHORT_SYSTEM_PROMPT
    prompts = [r.prompt_ids for r in make_workload(tokenizer, args.requests, args.tokens, args.seed,
                                                      system_prompt=system)]
    where = f"{info['gpu']} (CUDA {info['cuda']})" if "gpu" in info else f"{info['cpu']}, {info['threads']} threads"
    print(f"{where}, torch {info['torch']}, attention {args.attention}; {args.requests} chat requests "
          f"({min(map(len, prompts))}-{max(map(len, prompts))} prompt tokens), {args.tokens} greedy tokens each",
          flush=True)
    rows = measure(model, tokenizer, hf, prompts, args.tokens, args.attention, args.rounds)
    print("\n" + format_table(rows, args.requests))
    print(f"\ntok/s = all requests' output tokens / wall time of the call (the median of {args.rounds} "
          "runs, the rows taking turns); vs X = tok/s over row X's; same = replies equal to the first row's, "
          "token for token.")
    print("runs (s): " + "; ".join(f"{r['config']} " + " ".join(f"{t:.1f}" for t in r["runs"]) for r in rows))
    split = None
    if args.profile:
        split = profile_engine(model, tokenizer, prompts, args.tokens)
        print(f"\nwhere the engine's {sum(split.values()):.2f} s went (torch.profiler, self time per operator):\n"
              + format_profile(split))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"provenance": info, "rows": [{k: v for k, v in r.items() if k != "replies"} for r in rows],
                       "engine_profile_seconds": split}, f, indent=1)
        print(f"wrote {args.json}")
