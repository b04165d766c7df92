"""Command line: `python -m reference generate "prompt" [--max-new-tokens N] [--chat] [--threads N]`.

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
    gen.add_argument("--model", default="smollm2-135m", choices=["smollm2-135m", "tiny"])
    return parser.parse_args(argv)


def run_generate(args: argparse.Namespace) -> None:
    if not args.prompt.strip():
        raise ValueError("the prompt is empty")
    check_sampling(args.temperature, args.top_k, args.top_p)
    from reference.model import load_model

    threads = configure(args.threads)
    model, tok = load_model(args.model)
    ids = tok.chat_ids(args.prompt) if args.chat else tok.encode(args.prompt)
    check_request(model, ids, args.max_new_tokens)
    stats, new, shown = DecodeStats(), [], ""
    start = time.perf_counter()
    for token in stream(model, ids, args.max_new_tokens, use_cache=not args.no_cache,
                        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        seed=args.seed, stop_ids=tok.stop_ids, stats=stats):
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
          f"{'naive' if args.no_cache else 'KV cache'}, {threads} thread{'s' * (threads > 1)}]",
          file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run_generate(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
