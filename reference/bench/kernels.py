"""`python -m reference.bench kernels`: our Triton kernels against PyTorch's.

On a CUDA GPU: flash attention forward vs `F.scaled_dot_product_attention` (TFLOP/s, causal
and not, fp16/bf16, D = 64/128, N = 512 ... 16384), softmax vs `torch.softmax` (GB/s), and
split-K decode attention vs SDPA with one query (GB/s of K/V read), and paged decode
attention vs that contiguous decode on the same K/V. Each row also checks the
two results against each other. On a CPU: the analytic HBM traffic of naive vs flash attention
and a correctness run of each kernel in Triton's interpreter (timings there mean nothing: they
need a GPU).

    python -m reference.bench kernels [--quick] [--json PATH]
    python -m reference.bench kernels --targets [--slice K/N] [--json PATH]   (targets.py: no GPU needed)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

from reference.bench.measure import provenance, timed

SEQ_LENS = [512, 1024, 2048, 4096, 8192, 16384]
TOKENS_PER_ROW = 16384          # batch * N kept constant, so every row does comparable work
MODEL_WIDTH = 2048              # heads * D: 32 heads of 64 or 16 of 128


def gpu_time_ms(fn) -> float:
    """Median milliseconds of fn() (CUDA-event timed, L2 flushed) with triton.testing.do_bench."""
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def bench_flash(seq_lens: list[int]) -> list[dict]:
    from reference.kernels import flash_attention
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for head_dim in (64, 128):
            for causal in (False, True):
                for n in seq_lens:
                    batch, heads = max(1, TOKENS_PER_ROW // n), MODEL_WIDTH // head_dim
                    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=dtype) for _ in range(3))
                    ours = flash_attention(q, k, v, causal=causal)
                    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    flops = 4 * batch * heads * n * n * head_dim * (0.5 if causal else 1.0)
                    ms_ours = gpu_time_ms(lambda: flash_attention(q, k, v, causal=causal))
                    ms_sdpa = gpu_time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                    rows.append({"kernel": "flash", "dtype": str(dtype).split(".")[1], "D": head_dim,
                                 "causal": causal, "N": n, "batch": batch, "heads": heads,
                                 "ms": ms_ours, "ms_torch": ms_sdpa,
                                 "tflops": flops / ms_ours / 1e9, "tflops_torch": flops / ms_sdpa / 1e9,
                                 "max_abs_diff": (ours.float() - theirs.float()).abs().max().item()})
                    print_row(rows[-1])
    return rows


def bench_softmax(seq_lens: list[int]) -> list[dict]:
    from reference.kernels import softmax
    rows = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for n in seq_lens:
            x = torch.randn(4096, n, device="cuda", dtype=dtype)
            moved = 2 * x.numel() * x.element_size()                # one read, one write
            ms_ours = gpu_time_ms(lambda: softmax(x))
            ms_torch = gpu_time_ms(lambda: torch.softmax(x, dim=-1))
            rows.append({"kernel": "softmax", "dtype": str(dtype).split(".")[1], "rows": 4096, "N": n,
                         "ms": ms_ours, "ms_torch": ms_torch, "gbps": moved / ms_ours / 1e6,
                         "gbps_torch": moved / ms_torch / 1e6,
                         "max_abs_diff": (softmax(x).float() - torch.softmax(x, -1).float()).abs().max().item()})
            print_row(rows[-1])
    return rows


def bench_decode(seq_lens: list[int]) -> list[dict]:
    """One query per sequence, batch 8, 32 query heads on 8 K/V heads, D = 128, fp16."""
    from reference.kernels import decode_attention
    rows = []
    for n in seq_lens + [2 * seq_lens[-1]]:
        q = torch.randn(8, 32, 128, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(8, 8, n, 128, device="cuda", dtype=torch.float16) for _ in range(2))
        moved = 2 * k.numel() * k.element_size()                    # K and V read once
        sdpa = lambda: F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)
        ms_ours = gpu_time_ms(lambda: decode_attention(q, k, v))
        ms_sdpa = gpu_time_ms(sdpa)
        rows.append({"kernel": "decode", "dtype": "float16", "D": 128, "N": n, "batch": 8, "heads": "32/8",
                     "ms": ms_ours, "ms_torch": ms_sdpa, "gbps": moved / ms_ours / 1e6,
                     "gbps_torch": moved / ms_sdpa / 1e6,
                     "max_abs_diff": (decode_attention(q, k, v).float() - sdpa()[:, :, 0].float()).abs().max().item()})
        print_row(rows[-1])
    return rows


def bench_paged(seq_lens: list[int], block_size: int = 16) -> list[dict]:
    """Paged vs contiguous decode on the same K/V (bench_decode's shapes): the pool holds each
    sequence's keys in shuffled blocks of `block_size` tokens. Times the kernels alone
    (check_values=False: no host sync)."""
    from reference.kernels import decode_attention, paged_decode_attention
    rows = []
    for n in seq_lens + [2 * seq_lens[-1]]:
        batch, n_kv_heads, head_dim = 8, 8, 128
        q = torch.randn(batch, 32, head_dim, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(batch, n_kv_heads, n, head_dim, device="cuda", dtype=torch.float16) for _ in range(2))
        blocks_per_seq = -(-n // block_size)
        tables = torch.randperm(batch * blocks_per_seq, device="cuda").view(batch, blocks_per_seq)
        pools = []
        for x in (k, v):
            pool = torch.zeros(batch * blocks_per_seq * block_size, n_kv_heads, head_dim, device="cuda",
                               dtype=torch.float16)
            positions = torch.arange(n, device="cuda")
            slots = tables[:, positions // block_size] * block_size + positions % block_size       # [B, N]
            pool[slots] = x.transpose(1, 2)
            pools.append(pool.view(-1, block_size, n_kv_heads, head_dim))
        tables, lens = tables.int(), torch.full((batch,), n, dtype=torch.int32, device="cuda")
        paged = lambda: paged_decode_attention(q, *pools, tables, lens, check_values=False)
        moved = 2 * k.numel() * k.element_size()                    # K and V read once
        ms_paged, ms_contiguous = gpu_time_ms(paged), gpu_time_ms(lambda: decode_attention(q, k, v))
        rows.append({"kernel": "paged", "dtype": "float16", "D": head_dim, "N": n, "batch": batch, "heads": "32/8",
                     "block_size": block_size, "versus": "contiguous", "ms": ms_paged, "ms_contiguous": ms_contiguous,
                     "gbps": moved / ms_paged / 1e6, "gbps_contiguous": moved / ms_contiguous / 1e6,
                     "max_abs_diff": (paged().float() - decode_attention(q, k, v).float()).abs().max().item()})
        print_row(rows[-1])
    return rows


def print_row(row: dict) -> None:
    peer = row.get("versus", "torch")            # the other side of the ratio: PyTorch, or contiguous decode
    shape = " ".join(f"{key}={row[key]}" for key in ("dtype", "D", "causal", "N") if key in row)
    rate = (f"{row['tflops']:7.1f} vs {row[f'tflops_{peer}']:7.1f} TFLOP/s" if "tflops" in row
            else f"{row['gbps']:7.0f} vs {row[f'gbps_{peer}']:7.0f} GB/s")
    print(f"{row['kernel']:8} {shape:42} {row['ms']:9.3f} ms vs {row[f'ms_{peer}']:9.3f} ms "
          f"({row['ms'] / row[f'ms_{peer}']:5.2f}x {peer}'s time)  {rate}  "
          f"max|diff| {row['max_abs_diff']:.1e}",
          flush=True)


def hbm_table(block_m: int = 128) -> list[dict]:
    """Analytic bytes of one head's attention forward, fp16, D = 64: naive vs flash."""
    from reference.kernels.flash_attention import hbm_bytes
    rows = []
    print(f"HBM traffic of one attention head, fp16, D=64, flash query tiles of {block_m} rows (analytic):")
    print(f"{'N':>7} {'naive MiB':>11} {'flash MiB':>10} {'naive/flash':>12}")
    for n in SEQ_LENS:
        counts = hbm_bytes(n, n, 64, element_bytes=2, block_m=block_m)
        rows.append({"N": n, **counts})
        print(f"{n:>7} {counts['naive'] / 2**20:11.1f} {counts['flash'] / 2**20:10.1f} "
              f"{counts['naive'] / counts['flash']:11.1f}x")
    return rows


def interpreter_check() -> list[dict]:
    """Each kernel once on small random inputs vs float64, run in Triton's interpreter."""
    from reference.kernels import decode_attention, flash_attention, paged_decode_attention, softmax, store_kv
    from reference.kernels.torch_reference import naive_attention
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 3, n, 64, generator=gen) for n in (40, 70, 70))
    x = torch.randn(8, 1000, generator=gen) * 10
    table = torch.randperm(6, generator=gen)[:5]                 # 70 keys in 5 shuffled blocks of 16
    positions = torch.arange(70)
    slots = table[positions // 16] * 16 + positions % 16
    k_pool, v_pool = torch.full((6, 16, 3, 64), float("nan")), torch.full((6, 16, 3, 64), float("nan"))

    def paged():
        store_kv(k[0].transpose(0, 1), v[0].transpose(0, 1), k_pool, v_pool, slots)
        return paged_decode_attention(q[:, :, 0], k_pool, v_pool, table[None].int(), torch.tensor([70], dtype=torch.int32))
    cases = {
        "softmax [8, 1000]": (lambda: softmax(x), torch.softmax(x.double(), -1)),
        "flash causal Nq=40 Nk=70 D=64": (lambda: flash_attention(q, k, v, causal=True),
                                          naive_attention(q.double(), k.double(), v.double(), True)[0]),
        "decode N=70 D=64, 3 splits": (lambda: decode_attention(q[:, :, 0], k, v, num_splits=3),
                                       naive_attention(q.double()[:, :, :1], k.double(), v.double())[0][:, :, 0]),
        "store_kv + paged N=70, 5 blocks": (paged, naive_attention(q.double()[:, :, :1], k.double(),
                                                                           v.double())[0][:, :, 0]),
    }
    rows = []
    for name, (run, reference) in cases.items():
        seconds, out = timed(run)
        error = ((out.double() - reference).abs().max() / reference.abs().max()).item()
        rows.append({"case": name, "max_rel_error": error, "interpreter_seconds": seconds})
        print(f"  {name:34} max relative error {error:.1e}   ({seconds:.2f} s in the interpreter)")
    return rows


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m reference.bench kernels", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 1024 and 4096 only")
    parser.add_argument("--json", metavar="PATH", help="also write the rows and their provenance as JSON")
    parser.add_argument("--targets", action="store_true",
                        help="compile every kernel for a T4, an A100 and an H100 and print the matrix (no GPU needed)")
    parser.add_argument("--slice", metavar="K/N", help="with --targets: the K-th of N slices of the matrix")
    parser.add_argument("--interpreter-check", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.targets:
        from reference.bench import targets
        targets.main(args.slice, args.json)
        return
    if args.interpreter_check:                      # the child process started below
        print(json.dumps(interpreter_check()))
        return
    result = {"provenance": provenance("python -m reference.bench kernels", argv,
                                       device="cuda" if torch.cuda.is_available() else "cpu")}
    seq_lens = [1024, 4096] if args.quick else SEQ_LENS
    if torch.cuda.is_available():
        print(f"{result['provenance']['gpu']}, torch {torch.__version__}, triton {result['provenance'].get('triton')}\n")
        result["flash"] = bench_flash(seq_lens)
        result["softmax"] = bench_softmax(seq_lens)
        result["decode"] = bench_decode(seq_lens)
        result["paged"] = bench_paged(seq_lens)
    else:
        print("No CUDA GPU here: kernel timings need a GPU, so this run prints the analytic traffic and "
              "checks the kernels in Triton's interpreter.\n")
        result["hbm_bytes"] = hbm_table()
        print("\nInterpreter correctness run (TRITON_INTERPRET=1, float32, vs float64):")
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        child = subprocess.run([sys.executable, "-m", "reference.bench.kernels", "--interpreter-check"],
                               env=env, capture_output=True, text=True, check=True)
        lines = child.stdout.rstrip().splitlines()
        print("\n".join(lines[:-1]))
        result["interpreter"] = json.loads(lines[-1])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
