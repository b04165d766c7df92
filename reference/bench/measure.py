"""The measurement toolkit every benchmark and chapter uses: one timer, one bandwidth
measurement, one provenance record, and a competing load.

Timing rules, kept in one place so that two chapters never print two numbers for one machine:
- a warm-up call first (page faults, thread pools, allocator, kernel selection);
- the median of several runs (a neighbour that steals the CPU for one run moves a mean, not a
  median);
- candidates compared with each other run *interleaved*, one call of each per round, so a burst
  of load hits all of them alike and their ratio stays meaningful on a busy machine;
- on a GPU the device is synchronised before the clock stops.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Iterator

import torch

from reference.cpu import huge_pages


def _synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: str | torch.device = "cpu") -> tuple[float, object]:
    """(wall seconds, result) of one call of fn()."""
    start = time.perf_counter()
    result = fn()
    _synchronize(device)
    return time.perf_counter() - start, result


def interleaved_medians(fns: dict[Hashable, Callable[[], object]], rounds: int, *, warmup: bool = True,
                        device: str | torch.device = "cpu") -> dict[Hashable, float]:
    """Median seconds of each fn over `rounds` rounds; a round calls every fn once, in turn."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if warmup:
        for fn in fns.values():
            timed(fn, device)
    times: dict[Hashable, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(timed(fn, device)[0])
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def median_seconds(fn: Callable[[], object], repeats: int = 3, *, budget: float = 0.0,
                   device: str | torch.device = "cpu", max_repeats: int = 50) -> float:
    """Median wall seconds of fn() after a warm-up call: at least `repeats` runs, and more (up to
    `max_repeats`) while the runs so far took less than `budget` seconds."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    timed(fn, device)
    times: list[float] = []
    deadline = time.perf_counter() + budget
    while len(times) < repeats or (time.perf_counter() < deadline and len(times) < max_repeats):
        times.append(timed(fn, device)[0])
    return statistics.median(times)


def copy_bandwidth(n_bytes: int = 128 << 20, seconds: float = 1.0, device: str | torch.device = "cpu") -> float:
    """Bytes/s of `dst.copy_(src)` on float32 tensors of n_bytes each: 2 * n_bytes per copy
    (the read of src and the write of dst, STREAM's convention), median of runs filling about
    `seconds`. On the CPU both live where `load_model` puts the weights: on huge pages
    (reference/cpu/huge_pages.py) unless they are switched off or unsupported, since a copy runs
    7-25% faster there and the weights' streaming is compared with it."""
    if n_bytes < 4 or seconds <= 0:
        raise ValueError(f"need n_bytes >= 4 and seconds > 0, got {n_bytes}, {seconds}")
    n = n_bytes // 4
    if torch.device(device).type == "cpu" and huge_pages.enabled() and huge_pages.supported():
        src, dst = (huge_pages.huge_buffer(4 * n).view(torch.float32) for _ in range(2))
        src.fill_(1.0)
    else:
        src = torch.ones(n, device=device)
        dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / median_seconds(lambda: dst.copy_(src), budget=seconds, device=device)


BUSY_LOOP = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def competing_load(processes: int = 1, max_seconds: float = 600.0) -> Iterator[list[subprocess.Popen]]:
    """Run `processes` busy-loop processes (one core each) for the duration of the block.

    Each loop also ends by itself after `max_seconds`, so none outlives a benchmark that dies;
    on leaving the block they are killed and reaped.
    """
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(max_seconds)])
             for _ in range(processes)]
    try:
        time.sleep(0.3)  # let the scheduler see them before anyone measures free cores
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def provenance(command: str, argv: list[str], threads: int | None = None, device: str = "cpu") -> dict:
    """What a measured table needs beside it: date (UTC), the command line, the CPU, cores allowed,
    threads, torch / triton / Python versions and, when `device` is a GPU, its name, CUDA and
    driver versions."""
    cpu = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([command, *argv]), "cpu": cpu,
            "cpus_allowed": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "threads": threads, "device": str(device), "torch": torch.__version__,
            "python": platform.python_version()}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info["driver"] = "unknown"
    return info
