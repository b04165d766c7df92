"""Command line: `python -m reference generate "prompt" [--max-new-tokens N] [--chat] [--threads N]`
and `python -m reference serve [--port 8000]` (reference/engine/server.py).

Streams the reply as it is decoded and ends with a tokens/s line. A request that cannot be
served (empty prompt, negative N, prompt longer than the context window, sampling settings out
of range) gets one line on stderr and exit code 2. Threads default to the cores free right now
(reference/threads.py).
"""
from __future__ import annotations

import argparse
import sys
import time

from reference.decoding import DecodeStats, check_request, check_sampling, stream
from reference.device import DEVICE_CHOICES
from reference.threads import configure


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


class OneLineParser(argparse.ArgumentParser):
    """Report a bad argument as one line (the usage stays available with --help)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m reference", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    gen = sub.add_parser("generate", help="generate text from a prompt with SmolLM2-135M-Instruct")
    gen.add_argument("prompt")
    gen.add_argument("--max-new-tokens", type=non_negative, default=128)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--no-cache", action="store_true", help="the naive loop of chapter 01")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens (k >= 1)")
    gen.add_argument("--top-p", type=float, default=None, help="nucleus sampling, 0 < p <= 1")
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--threads", type=positive, default=None, help="CPU threads (default: the cores free now)")
    gen.add_argument("--backend", default="auto", choices=["auto", "cpu", "torch"],
                     help="cpu: the fast CPU path (reference/cpu); torch: the plain model; auto: cpu where it serves")
    gen.add_argument("--model", default="smollm2-135m", choices=["smollm2-135m", "tiny"])
    gen.add_argument("--device", default="auto", choices=DEVICE_CHOICES,
                     help="auto (default): CUDA when this torch sees a GPU, else the CPU")
    add_serve_parser(sub)
    return parser.parse_args(argv)


def add_serve_parser(sub) -> None:
    """`serve`: the OpenAI-shaped HTTP server over the engine, with the engine's knobs."""
    serve = sub.add_parser("serve", help="serve the engine over HTTP with the OpenAI API shape")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=positive, default=8000)
    serve.add_argument("--model", default="smollm2-135m", choices=["smollm2-135m", "tiny"])
    serve.add_argument("--block-size", type=positive, default=16, help="tokens per K/V block")
    serve.add_argument("--num-blocks", type=positive, default=None, help="K/V pool size in blocks")
    serve.add_argument("--max-num-seqs", type=positive, default=32, help="most requests per step")
    serve.add_argument("--max-num-batched-tokens", type=positive, default=512,
                       help="token budget of one step (prefill chunks + decodes)")
    serve.add_argument("--no-prefix-caching", action="store_true")
    serve.add_argument("--scheduling", default="continuous", choices=["continuous", "static"])
    serve.add_argument("--attention", default="torch", choices=["torch", "triton"])
    serve.add_argument("--device", default="auto", choices=DEVICE_CHOICES,
                       help="auto (default): CUDA when this torch sees a GPU, else the CPU")
    serve.add_argument("--threads", type=positive, default=None, help="CPU threads (default: the cores free now)")
    serve.add_argument("--backend", default="auto", choices=["auto", "cpu", "torch"],
                       help="cpu: the fast CPU path (reference/cpu); torch: the plain model; auto: cpu where it serves")


def run_generate(args: argparse.Namespace) -> None:
    if not args.prompt.strip():
        raise ValueError("the prompt is empty")
    check_sampling(args.temperature, args.top_k, args.top_p)
    from reference.model import load_model

    threads = configure(args.threads)
    model, tok = load_model(args.model, device=args.device)
    ids = tok.chat_ids(args.prompt) if args.chat else tok.encode(args.prompt)
    check_request(model, ids, args.max_new_tokens)
    stats, new, shown = DecodeStats(), [], ""
    start = time.perf_counter()
    for token in stream(model, ids, args.max_new_tokens, use_cache=not args.no_cache,
                        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        seed=args.seed, stop_ids=tok.stop_ids, stats=stats, backend=args.backend):
        new.append(token)
        text = tok.decode(new)
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            print(text[len(shown):], end="", flush=True)
            shown = text
    seconds = time.perf_counter() - start
    decode = sum(stats.step_seconds)
    print(f"\n[{len(ids)} prompt tokens, {len(new)} new tokens in {seconds:.2f} s: "
          f"prefill {stats.prefill_seconds * 1e3:.0f} ms, decode "
          f"{len(stats.step_seconds) / decode if decode else 0:.1f} tokens/s, "
          f"{'naive' if args.no_cache else 'KV cache'}, {model.device}, {threads} thread{'s' * (threads > 1)}]",
          file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "serve":
            from reference.engine.server import serve
            serve(args)
        else:
            run_generate(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
