"""The drawing behind chapters 05 and 07's figures, kept out of the reader's way.

Every function takes numbers the chapter computed in view (with the calculators,
the loops or the recorded benchmark) and only draws them; none computes a
number the prose quotes. Each returns the matplotlib figure (or animation).
"""
from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib import animation

from reference.calculators.fa3_schedule import Span

OP_COLOURS = {"GEMM0": "tab:blue", "softmax": "tab:orange", "GEMM1": "tab:green"}
TILE_KIND_COLOURS = [(0.93, 0.93, 0.93), (0.99, 0.75, 0.35), (0.30, 0.55, 0.80)]


def traffic_figure(lengths, series: dict[str, list[float]], title: str,
                   ylabel: str = "HBM traffic per head (MiB)"):
    """Log-log lines, one per label of `series` (values over `lengths`); a
    label starting with "floor" is drawn dotted grey."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for (label, values), marker in zip(series.items(), "os^v"):
        if label.startswith("floor"):
            ax.loglog(lengths, values, ":", color="grey", label=label)
        else:
            ax.loglog(lengths, values, marker + "-", label=label)
    ax.set_xlabel("sequence length N (= Nq = Nk)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    return fig


def _tile_grid(ax, n_tiles: int, order: list[tuple[int, int]], title: str):
    """Number the (query tile, key tile) cells in the order visited."""
    visit = np.zeros((n_tiles, n_tiles), dtype=int)
    for step, (i, j) in enumerate(order, start=1):
        visit[i, j] = step
    ax.imshow(visit, cmap="Blues", vmin=0, vmax=1.6 * n_tiles ** 2)
    for (i, j), step in np.ndenumerate(visit):
        ax.text(j, i, str(step), ha="center", va="center", fontsize=11)
    ax.set_xticks(range(n_tiles), [f"K{j}" for j in range(n_tiles)])
    ax.set_yticks(range(n_tiles), [f"Q{i}" for i in range(n_tiles)])
    ax.xaxis.set_label_position("top")
    ax.xaxis.tick_top()
    ax.set_xlabel("key/value tile")
    ax.set_title(title, fontsize=11, y=-0.32)


def loop_order_figure(n_tiles: int, lengths, series: dict[str, list[float]],
                      title: str):
    """Two grids numbered in FlashAttention 1's and 2's visiting order, and
    the HBM bytes of each order over `lengths` (log-log, from `series`)."""
    fig = plt.figure(figsize=(10.5, 3.9))
    grids = fig.add_gridspec(1, 3, width_ratios=[1, 1, 1.6], wspace=0.35)
    columns = [(i, j) for j in range(n_tiles) for i in range(n_tiles)]
    rows = [(i, j) for i in range(n_tiles) for j in range(n_tiles)]
    _tile_grid(fig.add_subplot(grids[0]), n_tiles, columns,
               "FA1: K/V tile outside\nQ, O, l, m moved per K/V tile")
    _tile_grid(fig.add_subplot(grids[1]), n_tiles, rows,
               "FA2: Q tile outside\nK, V moved per Q tile")
    ax = fig.add_subplot(grids[2])
    for (label, values), marker in zip(series.items(), "os^v"):
        ax.loglog(lengths, values, marker + "-", label=label)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("HBM MiB per head")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=9)
    return fig


def traversal_animation(steps: list[dict], n: int, tile: int):
    """Chapter 05's animation of the tiled loop: the score grid, the running
    (m, l, o / l) of the query tile and the bytes so far, one frame per
    step of `steps` (records with i, j, m, l, o, flash, plain)."""
    tiles = n // tile
    fig = plt.figure(figsize=(9.6, 5.0))
    ax_grid = fig.add_axes([0.03, 0.17, 0.42, 0.73])
    ax_state = fig.add_axes([0.49, 0.40, 0.50, 0.52])
    ax_bytes = fig.add_axes([0.60, 0.12, 0.36, 0.17])
    untouched, done = np.array((0.93, 0.93, 0.93)), np.array((0.62, 0.78, 0.92))
    absorbed, active = np.array((0.99, 0.85, 0.45)), np.array((0.90, 0.35, 0.10))
    image = ax_grid.imshow(np.ones((n, n, 3)), interpolation="nearest")
    for axis in (ax_grid.xaxis, ax_grid.yaxis):
        axis.set_ticks(np.arange(-0.5, n, tile), labels=[])
        axis.set_ticks(np.arange(-0.5, n, 1), minor=True)
    ax_grid.grid(which="minor", color="white", linewidth=0.5)
    ax_grid.grid(which="major", color="white", linewidth=2.5)
    ax_grid.tick_params(which="both", length=0)
    ax_grid.xaxis.set_label_position("top")
    ax_grid.set_xlabel("keys (K/V tiles) →")
    ax_grid.set_ylabel("← queries (Q tiles)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in (active, absorbed, done)]
    ax_grid.legend(handles, ["tile on chip now", "folded into the running state",
                             "rows finished"], loc="upper center",
                   bbox_to_anchor=(0.5, -0.02), ncol=1, frameon=False)
    ax_state.axis("off")
    table = ax_state.text(0.0, 1.0, "", family="monospace", fontsize=11, va="top")
    last = steps[-1]
    bars = ax_bytes.barh([1, 0], [0, 0], color=["tab:orange", "tab:blue"])
    ax_bytes.set_yticks([1, 0], ["flash", "plain"])
    ax_bytes.set_xlim(0, max(last["plain"], last["flash"]) * 1.05)
    ax_bytes.set_xlabel("HBM bytes so far (fp16)", fontsize=11)
    ax_bytes.axvline(last["flash"], color="tab:orange", lw=0.8, ls=":")
    ax_bytes.axvline(last["plain"], color="tab:blue", lw=0.8, ls=":")

    def draw(frame):
        step = steps[frame]
        i, j = step["i"], step["j"]
        rgb = np.empty((n, n, 3))
        rgb[:] = untouched
        rgb[:i * tile] = done
        rgb[i * tile:(i + 1) * tile, :j * tile] = absorbed
        rgb[i * tile:(i + 1) * tile, j * tile:(j + 1) * tile] = active
        if j == tiles - 1:
            rgb[i * tile:(i + 1) * tile] = done
            rgb[i * tile:(i + 1) * tile, j * tile:] = active
        image.set_data(rgb)
        lines = [f"outer: Q tile {i + 1}/{tiles}   inner: K/V tile {j + 1}/{tiles}", "",
                 f"{'row':>3} {'m':>6} {'l':>6}   o / l so far "
                 f"(d = {step['o'].shape[1]})"]
        for r in range(tile):
            o_text = " ".join(f"{x:+.2f}" for x in step["o"][r].tolist())
            lines.append(f"{i * tile + r:>3} {step['m'][r].item():6.2f} "
                         f"{step['l'][r].item():6.2f}   {o_text}")
        if j == tiles - 1:
            lines += ["", "inner loop done:", "O rows = o / l written to HBM"]
        table.set_text("\n".join(lines))
        bars[0].set_width(step["flash"])
        bars[1].set_width(step["plain"])
        ax_bytes.set_title(f"flash {step['flash']:,} B   plain {step['plain']:,} B",
                           fontsize=11)
        return image, table, *bars

    anim = animation.FuncAnimation(fig, draw, frames=len(steps), interval=700)
    return fig, anim


def causal_tiles_figure(panels: dict[tuple[int, int], np.ndarray],
                        block_m: int, block_n: int):
    """One panel per (Nq, Nk): tile kinds 2 unmasked, 1 masked, 0 skipped."""
    fig, axes = plt.subplots(1, len(panels), figsize=(9, 4.4),
                             gridspec_kw={"width_ratios": [1, 1.6]})
    cmap = matplotlib.colors.ListedColormap(TILE_KIND_COLOURS)
    for ax, ((nq, nk), kinds) in zip(axes, panels.items()):
        ax.imshow(kinds, cmap=cmap, vmin=0, vmax=2, aspect="auto",
                  interpolation="nearest")
        ax.set_title(f"Nq = {nq}, Nk = {nk}\n"
                     f"{100 * (kinds > 0).mean():.0f}% of tiles visited")
        for axis in (ax.xaxis, ax.yaxis):     # tile indices are integers
            axis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel(f"key tile ({block_n} keys)")
        ax.set_ylabel(f"query tile ({block_m} rows)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(c)) for c in (2, 1, 0)]
    fig.legend(handles, ["unmasked", "masked (crosses the diagonal)", "skipped"],
               loc="lower center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def schedule_figure(schedules: dict[str, list[Span]]):
    """One timeline per schedule over a shared time axis: for each warpgroup
    a lane of GEMMs (GEMM0, GEMM1) and a lane of softmaxes, each bar
    labelled with its K/V tile."""
    lanes = {title: sorted({(s.op.warpgroup, s.op.kind == "softmax")
                            for s in spans})
             for title, spans in schedules.items()}
    heights = [len(rows) for rows in lanes.values()]
    fig, axes = plt.subplots(len(schedules), 1, sharex=True,
                             figsize=(9.5, 1.4 + 0.5 * sum(heights)),
                             gridspec_kw={"height_ratios": heights})
    for ax, (title, spans) in zip(axes, schedules.items()):
        rows = lanes[title]
        for span in spans:
            row = rows.index((span.op.warpgroup, span.op.kind == "softmax"))
            ax.barh(row, span.end - span.start, left=span.start, height=0.7,
                    color=OP_COLOURS[span.op.kind], edgecolor="white")
            ax.text((span.start + span.end) / 2, row, str(span.op.iteration),
                    ha="center", va="center", fontsize=9, color="white")
        ax.set_yticks(range(len(rows)),
                      [f"warpgroup {wg} " + ("softmax" if soft else "GEMMs")
                       for wg, soft in rows], fontsize=10)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_title(title, fontsize=11, loc="left")
    axes[-1].set_xlabel("time (one GEMM = 1; numbers: K/V tile)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in OP_COLOURS.values()]
    fig.legend(handles, ["GEMM0: S = Q Kᵀ", "softmax", "GEMM1: O += P V"],
               loc="lower center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def versions_figure(releases, gpu_colours: dict[str, str],
                    measured: dict[str, float]):
    """A timeline of the releases (name, year, gpu, change, (low, high) % of
    peak, source) and their reported utilisation, with `measured` bars
    (label -> % of peak) hatched beside them."""
    fig, (ax_time, ax_util) = plt.subplots(
        2, 1, figsize=(9, 8), gridspec_kw={"height_ratios": [1.2, 1]})
    ax_time.axhline(0, color="grey", lw=1)
    for k, (name, year, gpu, change, _, _) in enumerate(releases):
        up = k % 2 == 0
        ax_time.plot(year, 0, "o", ms=12, color=gpu_colours[gpu])
        ax_time.text(year, 0.25 if up else -0.25, f"{name}\n{gpu}\n{change}",
                     ha="center", va="bottom" if up else "top", fontsize=11,
                     bbox=dict(boxstyle="round", fc="white", ec=gpu_colours[gpu]))
    ax_time.set_ylim(-1.75, 1.75)
    ax_time.set_xlim(2021.2, 2026.8)
    ax_time.set_xticks(range(2022, 2027))
    ax_time.set_yticks([])
    for side in ("left", "right", "top"):
        ax_time.spines[side].set_visible(False)
    ax_time.set_title("Flash Attention versions and the GPU each was built around")
    places = range(len(releases))
    colours = [gpu_colours[r[2]] for r in releases]
    ax_util.bar(places, [r[4][1] for r in releases], color=colours, alpha=0.35)
    ax_util.bar(places, [r[4][0] for r in releases], color=colours)
    extra = [len(releases) + 0.4 + k for k in range(len(measured))]
    ax_util.bar(extra, list(measured.values()), width=0.7, color="tab:blue",
                hatch="//", fill=False, edgecolor="tab:blue")
    labels = [r[0].replace("FlashAttention", "FA") + f"\n{r[2].split()[0]}"
              for r in releases]
    ax_util.set_xticks(list(places) + extra, labels + list(measured))
    ax_util.set_ylabel("forward, % of peak")
    ax_util.set_ylim(0, 100)
    ax_util.set_title("Reported utilisation (light: upper end of a reported "
                      "range)\nhatched: this chapter's benchmark")
    fig.tight_layout()
    return fig


def split_merge_figure(scores, parts, merged):
    """Flash decoding drawn: the query's scores coloured by chunk, each chunk's
    max and state (start, end, m, l, o) from `parts`, and the merged
    (M, L, out) state `merged`."""
    n, splits = len(scores), len(parts)
    chunk = -(-n // splits)
    palette = plt.cm.tab10(np.arange(splits))
    fig, ax = plt.subplots(figsize=(9, 3.9))
    ax.bar(np.arange(n), scores.numpy(), width=0.85,
           color=[palette[min(i // chunk, splits - 1)] for i in range(n)])
    ax.axhline(0, color="grey", lw=0.6)
    top = scores.max().item() + 0.6
    for k, (a, b, m, l, _) in enumerate(parts):
        centre = (a + b - 1) / 2
        ax.axhline(m, xmin=(a + 0.7) / (n + 0.4), xmax=(b + 0.3) / (n + 0.4),
                   color=palette[k], ls="--", lw=1)
        ax.annotate(f"program {k}\nm = {m:.2f}\nl = {l:.2f}", (centre, top),
                    ha="center", va="bottom", fontsize=8,
                    bbox=dict(boxstyle="round", fc="white", ec=palette[k]))
        ax.annotate("", xy=(n / 2 - 0.5, top + 4.2), xytext=(centre, top + 1.9),
                    arrowprops=dict(arrowstyle="->", color=palette[k], lw=1))
    ax.text(n / 2 - 0.5, top + 4.3,
            f"merge: M = max m = {merged[0].item():.2f},  L = sum exp(m - M) l"
            f" = {merged[1].item():.2f},  out = sum exp(m - M) o / L",
            ha="center", va="bottom", fontsize=9,
            bbox=dict(boxstyle="round", fc="lightyellow", ec="black"))
    low, high = scores.min().item(), scores.max().item()
    ax.set_xlim(-0.7, n - 0.3)
    ax.set_ylim(low - 0.5, top + 5.4)
    ax.set_xlabel("cached key position (bars: the query's scores; "
                  "dashed: each chunk's max)")
    ax.set_ylabel("score")
    ax.set_yticks(np.arange(np.floor(low), np.ceil(high) + 1))
    ax.set_title(f"Flash decoding: {n} keys in {splits} chunks, one program "
                 "each, then one merge", fontsize=10)
    fig.tight_layout()
    return fig


def h100_figure(bench: dict):
    """The recorded GPU benchmark: flash forward TFLOP/s (fp16, ours and
    SDPA) and decode GB/s over the length, from reference/bench/results."""
    fig, (ax_f, ax_d) = plt.subplots(1, 2, figsize=(10, 5.2))
    shapes = [(64, False), (64, True), (128, False), (128, True)]
    colours = ["tab:blue", "tab:cyan", "tab:red", "tab:orange"]
    for (d, causal), colour in zip(shapes, colours):
        rows = sorted((r for r in bench["flash"] if r["dtype"] == "float16"
                       and (r["D"], r["causal"]) == (d, causal)),
                      key=lambda r: r["N"])
        lengths = [r["N"] for r in rows]
        ax_f.plot(lengths, [r["tflops"] for r in rows], "o-", color=colour)
        ax_f.plot(lengths, [r["tflops_torch"] for r in rows], "--", color=colour)
    ax_f.set_xscale("log", base=2)
    ax_f.set_xlabel("sequence length N")
    ax_f.set_ylabel("TFLOP/s (forward)")
    ax_f.set_ylim(bottom=0)
    line = matplotlib.lines.Line2D
    handles = [line([], [], color=c, lw=3) for c in colours]
    handles += [line([], [], color="black", ls="-", marker="o"),
                line([], [], color="black", ls="--")]
    ax_f.legend(handles, ["d=64", "d=64, causal", "d=128", "d=128, causal",
                          "ours", "SDPA"], ncol=3, loc="upper center",
                bbox_to_anchor=(0.5, -0.2), frameon=False)
    ax_f.set_title("flash attention, float16")
    rows = sorted(bench["decode"], key=lambda r: r["N"])
    lengths = [r["N"] for r in rows]
    ax_d.plot(lengths, [r["gbps"] for r in rows], "o-", label="ours (split-K)")
    ax_d.plot(lengths, [r["gbps_torch"] for r in rows], "s--",
              label="SDPA, one query")
    ax_d.set_xscale("log", base=2)
    ax_d.set_xlabel("cached keys N")
    ax_d.set_ylabel("GB/s of K and V read")
    ax_d.set_ylim(bottom=0)
    ax_d.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    ax_d.set_title("decode attention, float16")
    prov = bench["provenance"]
    fig.suptitle(f"Measured on {prov['gpu']} ({prov['date'][:10]}), "
                 "not on this machine")
    fig.tight_layout()
    return fig


def ratio_table(rows: list[dict], columns, title: str) -> str:
    """Markdown: one row per N, one column per (label, selector), each cell
    our time / torch's time for the first row the selector picks."""
    lengths = sorted({r["N"] for r in rows})
    lines = [f"**{title}**", "",
             "| N | " + " | ".join(label for label, _ in columns) + " |",
             "| ---: |" + " ---: |" * len(columns)]
    for n in lengths:
        cells = []
        for _, pick in columns:
            match = [r for r in rows if r["N"] == n and pick(r)]
            cells.append(f"{match[0]['ms'] / match[0]['ms_torch']:.2f}×"
                         if match else "")
        lines.append(f"| {n:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
