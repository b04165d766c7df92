"""The weights a CPU decode step streams, in memory backed by 2 MiB pages (Linux transparent huge
pages).

Decode at batch 1 reads every weight once a step, so it runs at the speed the memory system
streams them. With 4 KiB pages those 500 MB span 120,000 pages, and the processor's address
translation (TLB) misses on each one it enters; with 2 MiB pages, 250. `reference.cpu.native_step`
packs its copy of the weights into `pieces` of one such buffer, and `bench decode` measures its
copy reference in memory of the same kind.

Linux gives huge pages to an anonymous private mapping that asks for them (`madvise`), when
`/sys/kernel/mm/transparent_hugepage/enabled` says "always" or "madvise" (the usual default);
elsewhere, or where it cannot find 2 MiB of contiguous memory, the same mapping is backed by
ordinary pages: nothing changes but the speed. `REFERENCE_HUGE_PAGES=0` asks for ordinary memory.
"""
from __future__ import annotations

import mmap

import torch

from reference.switch import Switch

HUGE_PAGE = 2 << 20
_switch = Switch("REFERENCE_HUGE_PAGES")


def enabled() -> bool:
    return _switch.enabled()


def set_enabled(on: bool) -> bool:
    """Move weights at load (True) or not; returns the previous setting."""
    return _switch.set_enabled(on)


def supported() -> bool:
    """Whether this Python can ask the kernel for huge pages (Linux: mmap.MADV_HUGEPAGE)."""
    return hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MAP_PRIVATE")


def huge_buffer(n_bytes: int) -> torch.Tensor:
    """n_bytes of zeroed uint8 CPU memory starting on a 2 MiB boundary, in a private anonymous
    mapping advised to use huge pages (ordinary pages where the system has none). The tensor
    keeps the mapping alive."""
    if not supported():
        raise RuntimeError("huge pages need Linux (mmap.MADV_HUGEPAGE)")
    mapping = mmap.mmap(-1, n_bytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(mapping, dtype=torch.uint8)
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start:start + n_bytes]


def pieces(n_bytes: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(one buffer, uint8 pieces of it of these sizes, each starting on a 64-byte boundary): on
    huge pages where they are switched on and supported, else in ordinary memory."""
    starts = [0]
    for size in n_bytes:
        starts.append(starts[-1] + -(-size // 64) * 64)
    buffer = (huge_buffer(starts[-1]) if enabled() and supported()
              else torch.empty(starts[-1], dtype=torch.uint8))
    return buffer, [buffer[start:start + size] for start, size in zip(starts, n_bytes)]


def on_huge_pages(tensor: torch.Tensor) -> bool:
    """Whether the memory of `tensor` lies in a mapping advised to use huge pages (Linux's
    /proc/self/smaps: its VmFlags hold "hg")."""
    address = tensor.data_ptr()
    try:
        with open("/proc/self/smaps") as smaps:
            inside = False
            for line in smaps:
                head = line.split(" ", 1)[0]
                if "-" in head and ":" not in head:
                    low, high = (int(a, 16) for a in head.split("-"))
                    inside = low <= address < high
                elif inside and line.startswith("VmFlags:"):
                    return "hg" in line.split()[1:]
    except OSError:
        return False
    return False
