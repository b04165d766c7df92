"""The compiler's verdict on a chapter's kernel, printed to fit the book's code column (80 characters).

The numbers come from `reference.kernels.chapter_builds` (triton building for a T4, an A100 and an
H100 without any of them); this module only lays them out and picks the figures a chapter's prose
quotes.
"""
from __future__ import annotations

HEADER = (f"{'configuration':<31} {'GPU':<5} {'shared KiB':>10} {'of':>4} {'regs':>5} "
          f"{'spilled B':>9} {'fits':>5}")


def format_builds(rows: list[dict], drop: str = "") -> str:
    """One line per (launch configuration, GPU) of `chapter_builds.tile_table`; `drop` is the
    common prefix of the configurations (what the chapter's sentence already says)."""
    lines = [HEADER, "-" * len(HEADER)]
    for row in rows:
        config = " ".join(row["config"].replace(drop, "", 1).split())
        shared = f"{row['shared_kib']:g}" if row["compiles"] else "-"
        lines.append(f"{config:<31} {row['target']:<5} {shared:>10} {row['limit_kib']:>4} "
                     f"{row['registers'] if row['compiles'] else '-':>5} "
                     f"{row['spilled_bytes'] if row['compiles'] else '-':>9} "
                     f"{'yes' if row['fits'] else 'NO':>5}")
    return "\n".join(lines)


def build(rows: list[dict], config_words: str, target: str) -> dict:
    """The row of `rows` for `target` whose configuration contains every word of `config_words`."""
    words = set(config_words.split())
    return next(r for r in rows if r["target"] == target and words <= set(r["config"].split()))


def block_h_glue(rows: list[dict], prefix: str, block_h: tuple[int, ...] = (16, 64),
                 gpus: tuple[str, ...] = ("T4", "A100", "H100")) -> dict:
    """The numbers a chapter's prose quotes from a split kernel's builds: per BLOCK_H and GPU,
    ``{prefix}_{h}_{gpu}_kib`` (shared memory) and ``_regs`` (registers per thread), and
    ``{prefix}_t4_64_phrase`` (what the widest group does to a T4's registers)."""
    numbers = {}
    for h in block_h:
        for gpu in gpus:
            row = build(rows, f"BLOCK_H={h}", gpu)
            numbers[f"{prefix}_{h}_{gpu}_kib"] = row["shared_kib"]
            numbers[f"{prefix}_{h}_{gpu}_regs"] = row["registers"]
    spilled = build(rows, f"BLOCK_H={max(block_h)}", "T4")["spilled_bytes"]
    numbers[f"{prefix}_t4_64_phrase"] = (f"spills {spilled:,} bytes per thread" if spilled
                                         else "spills nothing")
    return numbers


def format_ptx(ptx: dict, per_pattern: int = 2) -> str:
    """How many PTX lines the build has, and for each instruction a chapter explains, how many
    lines start with it and the first `per_pattern` of them (cut to the column)."""
    lines = [f"{ptx['config']} for {ptx['target']}: {ptx['lines']} lines of PTX"]
    for pattern, found in ptx["picked"].items():
        lines.append(f"{pattern:<10} {len(found):>4} lines")
        lines += [f"    {' '.join(line.split())[:74]}" for line in found[:per_pattern]]
    return "\n".join(lines)
