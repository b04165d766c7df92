"""How many CPU threads to decode with, chosen from the cores that are actually free.

Decode is a chain of small matrix-vector products, each split over torch's OpenMP threads with a
barrier at its end. When another process holds one of the cores, the thread that shares that
core runs only in the scheduler's time slices, and every barrier waits for it: measured on a
2-core machine with one core taken by a busy loop, a step took 40x longer at 2 threads than at 1.
Two remedies, both applied by `configure`:

- threads = the cores free right now (idle time of the CPUs this process may run on, sampled
  from /proc/stat over a short window), so no thread queues behind another process;
- OpenMP threads sleep instead of spinning when they wait (`OMP_WAIT_POLICY=PASSIVE`), so a load
  that arrives later costs its share of the CPU, not a collapse. It must be in the environment
  before torch is imported (libgomp reads it when it is loaded), and it costs about 10% of a
  step on a quiet machine (woken threads start later); set OMP_WAIT_POLICY=ACTIVE to opt out.

This module imports torch only inside `configure`, so entry points can call `passive_wait()`
before anything imports torch.
"""
from __future__ import annotations

import os
import sys
import time


def allowed_cpus() -> list[int]:
    """CPU ids this process may run on (its affinity mask, else all CPUs)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cpu_quota(path: str = "/sys/fs/cgroup/cpu.max") -> float | None:
    """CPUs' worth of time this container may use (cgroup v2 `cpu.max`), or None when unlimited."""
    try:
        quota, period = open(path).read().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _cpu_times(path: str = "/proc/stat") -> dict[int, tuple[int, int]]:
    """{cpu id: (idle ticks, total ticks)} from /proc/stat (idle includes iowait)."""
    times = {}
    with open(path) as f:
        for line in f:
            name, *fields = line.split()
            if not name.startswith("cpu") or name == "cpu":
                continue
            ticks = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            times[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))
    return times


def free_cores(window_s: float = 0.25, path: str = "/proc/stat") -> float:
    """Idle CPU capacity among the allowed CPUs over `window_s` seconds, in cores (0..len(allowed)).

    Falls back to the number of allowed CPUs where /proc/stat cannot be read.
    """
    cpus = allowed_cpus()
    try:
        before = _cpu_times(path)
        time.sleep(window_s)
        after = _cpu_times(path)
    except OSError:
        return float(len(cpus))
    free = 0.0
    for cpu in cpus:
        if cpu in before and cpu in after:
            idle = after[cpu][0] - before[cpu][0]
            total = after[cpu][1] - before[cpu][1]
            free += idle / total if total > 0 else 1.0
    return free


def threads_for(free: float, n_allowed: int) -> int:
    """Threads to use given `free` idle cores out of `n_allowed`: the whole free cores, at least 1.

    A core counts as free from 75% idle up, so a quiet machine with a little background noise
    still uses all its cores, and a core held by a busy process is left to it.
    """
    return max(1, min(n_allowed, int(free + 0.25)))


def choose_threads(window_s: float = 0.25) -> int:
    """The number of threads to decode with on this machine right now (see `threads_for`),
    never more than a container's CPU quota allows."""
    allowed = len(allowed_cpus())
    quota = cpu_quota()
    if quota is not None:
        allowed = max(1, min(allowed, int(quota)))
    return threads_for(free_cores(window_s), allowed)


def passive_wait() -> bool:
    """Ask OpenMP to let waiting threads sleep (OMP_WAIT_POLICY=PASSIVE) unless the user chose.

    Effective only before torch is imported: returns True when the policy was PASSIVE in time.
    """
    if "torch" in sys.modules:
        return False
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return os.environ["OMP_WAIT_POLICY"].upper() == "PASSIVE"


def wait_policy() -> str:
    """The OpenMP wait policy in this process's environment, for reports."""
    return os.environ.get("OMP_WAIT_POLICY", "libgomp default (spin, then sleep)")


def configure(threads: int | None = None) -> int:
    """Set torch's thread count to `threads`, or to `choose_threads()` when None; returns it."""
    import torch

    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    n = threads if threads is not None else choose_threads()
    torch.set_num_threads(n)
    return n
