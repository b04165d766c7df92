"""What a forward over T new positions costs after a cached prefix, against the roofline.

    python -m reference.bench passes [--context 128] [--positions 1 2 5 8 16] [--repeats 7]
                                     [--threads N] [--no-hf]

A decode step feeds 1 position, a step that verifies k drafts feeds k + 1, a batched step one
per sequence. Each pass reads every weight once, and in float32 does about T/2 FLOPs per weight
byte; below the machine's ridge point the roofline says a T-position pass costs what a 1-position
pass costs. This benchmark times, side by side in one process and interleaved, the real model's
pass over T positions after `--context` cached ones three ways: our model through the fast CPU
path (`reference.cpu.CpuModel`, the default: up to 16 positions in one native call,
reference/cpu/native_step.c, the 1-position pass being a decode step; more through weights packed
once for oneDNN, reference/cpu/cpu_linear.py), the plain model (reference/model.py: `F.linear`),
and Hugging Face transformers on the same weights; beside them the roofline's prediction from this
machine's measured copy bandwidth and matmul FLOP/s (chapter 04).
"""
from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass

import torch

from reference.cpu import backend_for, why_not
from reference.bench.machine import MachineRoofline, measure_machine
from reference.bench.measure import interleaved_medians
from reference.calculators.roofline import forward_cost


@dataclass(frozen=True)
class PassRow:
    """Median seconds of one T-position pass per implementation, and the roofline's prediction."""
    positions: int
    seconds: dict[str, float]          # implementation -> median seconds
    predicted_seconds: float           # max(bytes / bandwidth, FLOPs / matmul FLOP/s)
    intensity: float                   # FLOPs per byte of the pass


def predicted_seconds(cfg, dtype: torch.dtype, machine: MachineRoofline, positions: int,
                      context: int) -> tuple[float, float]:
    """(seconds the roofline allows, FLOPs per byte) for one pass of `positions` after `context`
    of a model with config `cfg` and weights of `dtype`."""
    cost = forward_cost(cfg, batch=1, new_tokens=positions, context=context, weight_dtype=dtype)
    return max(cost.bytes / machine.copy_bandwidth, cost.flops / machine.matmul_flops), cost.intensity


class OursPass:
    """One pass of our model (as `backend` runs it) over T positions after a fixed cached prefix,
    written by position: the next pass overwrites it."""

    def __init__(self, model, prompt: torch.Tensor, backend: str):
        self.model, self.context = backend_for(model, backend), prompt.shape[1]
        self.cache = model.new_cache(1, self.context + 64)
        self.model(prompt, cache=self.cache)

    def __call__(self, ids: torch.Tensor) -> None:
        self.model(ids, positions=torch.arange(self.context, self.context + ids.shape[1]), cache=self.cache)


class HFPass:
    """The same pass through transformers, the pass's tokens cropped off its DynamicCache after each pass."""

    def __init__(self, hf, prompt: torch.Tensor):
        self.hf, self.context = hf, prompt.shape[1]
        with torch.inference_mode():
            self.cache = hf(prompt, use_cache=True).past_key_values

    @torch.inference_mode()
    def __call__(self, ids: torch.Tensor) -> None:
        self.hf(ids, past_key_values=self.cache, use_cache=True)
        self.cache.crop(-ids.shape[1])  # a negative count removes that many tokens (transformers 4.x and 5.x)


def measure_passes(model, hf=None, *, context: int = 128, positions=(1, 2, 5, 8, 16), repeats: int = 7,
                   machine: MachineRoofline | None = None, seed: int = 0) -> tuple[list[PassRow], MachineRoofline]:
    """Time every (implementation, T) `repeats` times, interleaved so that load hits all alike."""
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, context), generator=gen)
    runners = {"ours": OursPass(model, prompt, "auto")}
    if why_not(model) is None:             # "ours" ran the CPU backend: the plain model beside it
        runners["ours, plain model"] = OursPass(model, prompt, "torch")
    if hf is not None:
        runners["HF"] = HFPass(hf, prompt)
    machine = machine or measure_machine(seconds=2.0)
    inputs = {t: torch.randint(0, vocab, (1, t), generator=gen) for t in positions}
    # the warm-up call of each also pays for packing, the allocator and kernel choice
    medians = interleaved_medians({(name, t): functools.partial(run, inputs[t])
                                   for t in positions for name, run in runners.items()}, repeats)
    rows = []
    for t in positions:
        seconds, intensity = predicted_seconds(model.config, model.embed.weight.dtype, machine, t, context)
        rows.append(PassRow(t, {name: medians[name, t] for name in runners}, seconds, intensity))
    return rows, machine


def ratio_to_one(rows: list[PassRow], name: str) -> dict[int, float]:
    """Each row's time for `name` over the 1-position (first) row's."""
    base = rows[0].seconds[name]
    return {row.positions: row.seconds[name] / base for row in rows}


def print_table(rows: list[PassRow], machine: MachineRoofline, context: int) -> None:
    names = list(rows[0].seconds)
    print(f"machine: copy {machine.copy_bandwidth / 1e9:.1f} GB/s, float32 matmul "
          f"{machine.matmul_flops / 1e9:.0f} GFLOP/s, ridge {machine.ridge:.1f} FLOP/byte, "
          f"{machine.threads} threads;  {context} positions cached\n")
    header = f"{'T':>3} {'FLOP/B':>7} {'roofline':>9}" + "".join(f" {name + ' ms':>17} {'x T=1':>6}" for name in names)
    print(header + "\n" + "-" * len(header))
    predicted_base = rows[0].predicted_seconds
    ratios = {name: ratio_to_one(rows, name) for name in names}
    for row in rows:
        cells = "".join(f" {row.seconds[n] * 1e3:17.1f} {ratios[n][row.positions]:5.2f}x" for n in names)
        print(f"{row.positions:>3} {row.intensity:7.1f} {row.predicted_seconds / predicted_base:8.2f}x{cells}")
    print("\nroofline = the predicted time of the pass over the predicted time of a 1-position pass; "
          "x T=1 = the measured time over the same implementation's 1-position pass (medians of "
          "interleaved runs).")


def main(argv: list[str]) -> None:
    from reference.model import load_model
    from reference.threads import configure

    parser = argparse.ArgumentParser(prog="python -m reference.bench passes", description=__doc__.split("\n")[0])
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--positions", type=int, nargs="+", default=[1, 2, 5, 8, 16])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers peer")
    parser.add_argument("--model", default="smollm2-135m", choices=["smollm2-135m", "tiny"])
    args = parser.parse_args(argv)
    if args.context < 1 or min(args.positions) < 1 or args.repeats < 1:
        parser.error("--context, --positions and --repeats must be >= 1")
    threads = configure(args.threads)
    model, _ = load_model(args.model)
    hf = None
    if not args.no_hf and args.model == "smollm2-135m":
        from reference.bench.hf_peer import load_hf_peer
        hf = load_hf_peer()
    positions = sorted(set([1] + args.positions))
    rows, machine = measure_passes(model, hf, context=args.context, positions=positions, repeats=args.repeats)
    print(f"threads: {threads}")
    print_table(rows, machine, args.context)
