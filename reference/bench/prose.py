"""Sentences the book builds from its own measurements and files, so that the prose stays true.

A chapter measured on a busy machine can see anything: a step that got faster, a speed-up below
one. The book never types the direction of a measured effect; it asks these functions, which word
the sentence from the numbers (and are tested on every outcome).
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

SAME_WITHIN = 0.10  # ratios within 10% of 1 are reported as "about the same"


def times_phrase(ratio: float, more: str = "slower", less: str = "faster") -> str:
    """'3.2× slower' for ratio 3.2, '2.0× faster' for 0.5, 'about as fast' near 1.

    `ratio` is (new / old) of a time: above 1 the new thing took longer.
    """
    if not ratio > 0:
        raise ValueError(f"a ratio of times must be > 0, got {ratio}")
    if abs(ratio - 1) <= SAME_WITHIN:
        return "about as fast"
    return f"{ratio:.1f}× {more}" if ratio > 1 else f"{1 / ratio:.1f}× {less}"


def naive_growth_paragraph(short_len: int, long_len: int, short_ms: float, long_ms: float,
                           cached_first_ms: float, cached_last_ms: float) -> str:
    """Chapter 01's reading of its timing: naive step time at two lengths, cached steps early/late.

    Growth is claimed only when the longer input really took longer (by more than 10%); the
    cached loop is called flat only when its late steps stayed within 25% of its early ones.
    """
    slope = (long_ms - short_ms) / (long_len - short_len)
    ratio = long_ms / short_ms
    naive = (f"a naive step over {short_len} positions took about {short_ms:.0f} ms and one over "
             f"{long_len} positions {long_ms:.0f} ms")
    if ratio > 1 + SAME_WITHIN:
        naive += (f": {ratio:.1f} times as long, roughly {slope:.2f} ms more for every extra "
                  "position. Each token costs more than the one before, so the *total* time "
                  "grows quadratically with the answer length.")
    else:
        naive += (f": {times_phrase(ratio)}, so this run did not show the growth the counts "
                  "predict (other work on the machine can hide it at these lengths; the counts "
                  "above still grow quadratically).")
    drift = cached_last_ms / cached_first_ms
    if abs(drift - 1) <= 0.25:
        cached = (f"The cached loop stayed nearly flat, at about {cached_first_ms:.0f} ms per "
                  f"token early and {cached_last_ms:.0f} ms late.")
    else:
        cached = (f"The cached loop went from about {cached_first_ms:.0f} ms per token early to "
                  f"{cached_last_ms:.0f} ms late ({times_phrase(drift)}); with so little work per "
                  "step, other jobs on the machine move it more than its length does.")
    return f"{naive} {cached}"


def speedup_phrase(slow_seconds: float, fast_seconds: float) -> str:
    """'a speed-up of 3.1×' when fast_seconds is shorter, else 'a slow-down of 1.2×' or 'no
    measurable difference' (within 10%)."""
    ratio = slow_seconds / fast_seconds
    if abs(ratio - 1) <= SAME_WITHIN:
        return "no measurable difference"
    return f"a speed-up of {ratio:.1f}×" if ratio > 1 else f"a slow-down of {1 / ratio:.1f}×"



def eviction_paragraph(rows: list[dict], n_tokens: int, full_kib: float) -> str:
    """Chapter 03's reading of `reference.eviction.evaluate_eviction`'s rows.

    Compares, at the smallest and the largest budget, the window alone with sinks + window,
    H2O with sinks + window (by Δ NLL, budget by budget), and real positions with positions
    within the cache. A difference within 5 points of agreement (or 0.02 nats) is "about
    the same"; every direction comes from the numbers.
    """
    by = {(r["policy"], r["budget"]): r for r in rows}
    budgets = sorted({r["budget"] for r in rows})
    low, high = budgets[0], budgets[-1]

    def step(r):
        d = r["first_divergence"]
        return "never left it" if d is None else f"left it at step {d}"

    def compare(a: float, b: float, tol: float, up: str, down: str) -> str:
        return "about the same" if abs(a - b) <= tol else (up if a > b else down)

    w, s = by[("window", low)], by[("sinks + window", low)]
    effect = compare(s["agreement"], w["agreement"], 0.05, "raised", "lowered")
    first = (f"With {low} tokens kept, the window alone chose the full cache's token at "
             f"{w['agreement']:.0%} of the {n_tokens} steps ({step(w)}); the same budget "
             f"spent on sinks + window agreed at {s['agreement']:.0%} ({step(s)})")
    first += (": keeping the first tokens " + effect + " the agreement"
              if effect != "about the same" else ", about the same")
    wh, sh = by[("window", high)], by[("sinks + window", high)]
    first += (f". At {high} tokens the two agreed at {wh['agreement']:.0%} and "
              f"{sh['agreement']:.0%}.")
    better = [b for b in budgets
              if by[("H2O", b)]["delta_nll"] < by[("sinks + window", b)]["delta_nll"] - 0.02]
    worse = [b for b in budgets
             if by[("H2O", b)]["delta_nll"] > by[("sinks + window", b)]["delta_nll"] + 0.02]
    h2o = (f"H2O's heavy hitters raised the reference's NLL less than sinks + window at "
           f"{len(better)} of {len(budgets)} budgets and more at {len(worse)} "
           f"(differences within 0.02 nats counted as ties).")
    gap = max(abs(by[("sinks + window, cache positions", b)]["agreement"]
                  - by[("sinks + window", b)]["agreement"]) for b in budgets)
    positions = (f"Positions within the cache and real positions differed by at most "
                 f"{gap:.0%} of the steps at any budget.")
    kept = by[("sinks + window", low)]["kept_bytes"] / 1024
    memory = (f"The smallest budget held {kept:,.0f} KiB of K and V, against "
              f"{full_kib:,.0f} KiB for the full cache at the last step.")
    return " ".join([first, h2o, positions, memory])



NEAR_ROOFLINE = 1.25  # a pass within 25% of the roofline's prediction "rode along" on its weight read


def pass_cost_sentence(positions: int, ratio: float, predicted: float,
                       plain_ratio: float | None = None) -> str:
    """Chapter 04's reading of a T-position pass: `ratio` = its measured time over a 1-position
    pass's, `predicted` = the roofline's ratio, `plain_ratio` = the same through plain F.linear.

    The pass is called nearly free only when it stayed within 25% of the prediction; F.linear is
    blamed for re-packing only when it was more than 10% slower than the packed path.
    """
    if not (ratio > 0 and predicted > 0):
        raise ValueError(f"ratios must be > 0, got {ratio} and {predicted}")
    head = (f"a pass over {positions} positions cost {ratio:.2f}× a one-position pass, where the "
            f"roofline predicts {predicted:.2f}×")
    if ratio <= predicted * NEAR_ROOFLINE:
        head += ": the extra positions rode along on the same read of the weights."
    else:
        head += (f": on this machine they are not free, and every step that feeds {positions} "
                 "positions pays that factor.")
    if plain_ratio is None:
        return head
    if plain_ratio > ratio * (1 + SAME_WITHIN):
        tail = (f" Through plain `F.linear` the same pass cost {plain_ratio:.2f}×: the BLAS call "
                "re-packs each weight matrix inside every small product, reading it more than once.")
    else:
        tail = (f" Through plain `F.linear` it cost {plain_ratio:.2f}×: this machine's BLAS loses "
                "little on small products, so packing the weights once matters less here.")
    return head + tail


def verification_sentence(pass_ratio: float, speedup: float, tokens_per_pass: float) -> str:
    """Chapter 10's reading of prompt lookup's wall-clock gain: `pass_ratio` = a (k+1)-position
    pass over a one-position step, `speedup` = plain time / speculative time, `tokens_per_pass` =
    the passes' promise. Says how much of the promise reached the clock, and blames the pass cost
    only when the pass was not nearly free (within 25%)."""
    if not (pass_ratio > 0 and speedup > 0 and tokens_per_pass > 0):
        raise ValueError("ratios must be > 0")
    kept = f"the wall clock kept {speedup / tokens_per_pass:.0%} of what the saved passes promise"
    if pass_ratio <= NEAR_ROOFLINE:
        if speedup / tokens_per_pass >= 0.8:
            return f"The extra positions were nearly free here, so {kept}."
        return (f"The extra positions were nearly free here, yet {kept}: the rest went to the work "
                "around the passes (drafting, checking the drafts, other load on the machine).")
    return (f"Here the extra positions were not free, so every drafted token, accepted or not, cost "
            f"time, and {kept}.")

def exercise_list(notebook: str | Path) -> str:
    """A Markdown list of the graded exercises of an exercise notebook, read from the notebook.

    One item per nbgrader solution cell, in order: its grade_id and the first line of the
    docstring of the function or class of that name defined in the cell.
    """
    cells = json.loads(Path(notebook).read_text())["cells"]
    items = []
    for cell in cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if not meta.get("solution"):
            continue
        name = meta["grade_id"]
        doc = ""
        for node in ast.parse("".join(cell["source"])).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                docstring = ast.get_docstring(node)
                doc = docstring.strip().splitlines()[0] if docstring else ""
        items.append(f"- `{name}`: {doc}" if doc else f"- `{name}`")
    if not items:
        raise ValueError(f"{notebook} has no nbgrader solution cells")
    return "\n".join(items)


def agreement_phrase(difference: float, cause: str | None = None) -> str:
    """How two results computed two ways agree, worded from their largest difference.

    'exactly (bit for bit)' when the difference is 0, else 'to within 3.2e-16' (with
    ' (cause)' appended when a `cause` such as 'float rounding' is given). A reader never sees
    "to within 0.0e+00".
    """
    difference = abs(float(difference))
    if difference != difference:
        raise ValueError("the difference is NaN: the two results do not agree at all")
    if difference == 0:
        return "exactly (bit for bit)"
    return f"to within {difference:.1e}" + (f" ({cause})" if cause else "")


def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 thread', '2 threads' (`words` for an irregular plural)."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def bound_phrase(intensity: float, ridge: float) -> str:
    """Which roof a kernel sits under, worded from its intensity and the ridge:
    'compute-bound (858 FLOPs/byte, past the ridge at 295)' or 'memory-bound (8.0 FLOPs/byte,
    below the ridge at 295)'."""
    if not (intensity >= 0 and ridge > 0):
        raise ValueError(f"need intensity >= 0 and ridge > 0, got {intensity} and {ridge}")
    shown = f"{intensity:.0f}" if intensity >= 10 else f"{intensity:.1f}"
    if intensity > ridge:
        return f"compute-bound ({shown} FLOPs/byte, past the ridge at {ridge:.0f})"
    return f"memory-bound ({shown} FLOPs/byte, below the ridge at {ridge:.0f})"


def shortfall_phrase(estimate: float, actual: float) -> str:
    """How far an estimate of a time falls short of (or exceeds) the actual one: '17% short',
    '5% long', or 'within 1%'."""
    if not (estimate > 0 and actual > 0):
        raise ValueError(f"times must be > 0, got {estimate} and {actual}")
    gap = estimate / actual - 1
    if abs(gap) < 0.01:
        return "within 1%"
    return f"{-gap:.0%} short" if gap < 0 else f"{gap:.0%} long"
