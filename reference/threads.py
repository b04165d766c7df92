"""How many CPU threads to decode with, chosen from the cores that are actually free, again and
again while the work runs.

Decode is a chain of small matrix-vector products, each split over torch's OpenMP threads with a
barrier at its end. When another process holds one of the cores, the thread that shares that
core runs only in the scheduler's time slices, and every barrier waits for it (a step can take
tens of times longer than at one thread fewer). The remedy is to use the cores that are free, and to notice when that
changes:

- `configure` sets threads = the cores free right now (idle time of the CPUs this process may
  run on, sampled from /proc/stat over a short window), so no thread queues behind another
  process from the start;
- `adapt` re-checks while the work runs, at most once a second and without sleeping: the busy time
  of the allowed CPUs since its last look, minus this process's own CPU time, is the load others
  put on them. `generate` and the engine's step call it, so a load that arrives after the model is
  loaded is met within a second.

OpenMP's wait policy is left to libgomp's default (spin a while, then sleep), or to the user's
OMP_WAIT_POLICY. An earlier version set OMP_WAIT_POLICY=PASSIVE on import, so that a late load
would cost its share of the CPU instead of a collapse; `python -m reference.bench threads`
measures what that costs every quiet step and what re-choosing the threads gives instead
(reference/bench/results/README.md): the default with `adapt` ran quiet steps faster than PASSIVE
and kept most of its quiet speed under a load that arrived after loading.
"""
from __future__ import annotations

import os
import sys
import time

import torch


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


def wait_policy() -> str:
    """The OpenMP wait policy in this process's environment, for reports."""
    return os.environ.get("OMP_WAIT_POLICY", "libgomp default (spin, then sleep)")


def configure(threads: int | None = None, *, adapt: bool = False) -> int:
    """Set torch's thread count to `threads`, or to `choose_threads()` when None; returns it.

    A count given here is kept: `adapt` leaves it alone, unless `adapt=True` hands it over as
    if this module had chosen it. So is one set by anyone else with `torch.set_num_threads`
    after this call."""
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    n = threads if threads is not None else choose_threads()
    torch.set_num_threads(n)
    _governor.reset(chosen=None if threads is not None and not adapt else n)
    return n


class _Governor:
    """State of `adapt`: the last look at the CPUs and the thread count it chose (None: not ours
    to change)."""

    def __init__(self):
        self.chosen: int | None = None
        self.last: tuple[float, float, dict[int, tuple[int, int]]] | None = None
        self.automatic = True   # no count configured yet: the first `adapt` configures

    def reset(self, chosen: int | None) -> None:
        self.chosen, self.last, self.automatic = chosen, None, False

    def look(self) -> tuple[float, float, dict[int, tuple[int, int]]]:
        """(wall seconds, this process's CPU seconds, /proc/stat ticks) now."""
        own = os.times()
        return time.monotonic(), own.user + own.system, _cpu_times()


_governor = _Governor()
_STARTUP_THREADS = torch.get_num_threads()   # torch's own count, before any choice
ADAPT_EVERY_S = 1.0


def adapt(every_s: float = ADAPT_EVERY_S) -> int | None:
    """Re-choose torch's threads from the load other processes put on the allowed CPUs since the
    last look (at most once per `every_s` seconds; one read of /proc/stat, no sleep).

    Acts only on a count `configure` chose itself, and only while nobody changed it since. The
    first call in a process where nothing configured the threads yet (the Python API: `generate`,
    `LLM`) configures them, unless torch's count is no longer the one it had when this module was
    imported (someone fixed it). Returns the thread count set, or None when it changed nothing."""
    gov = _governor
    if gov.automatic:
        gov.automatic = False
        return configure() if torch.get_num_threads() == _STARTUP_THREADS else None
    if gov.chosen is None or torch.get_num_threads() != gov.chosen:
        gov.chosen = None
        return None
    now = time.monotonic()
    if gov.last is not None and now - gov.last[0] < every_s:
        return None
    try:
        look = gov.look()
    except OSError:
        return None
    previous, gov.last = gov.last, look
    if previous is None:
        return None
    cpus = allowed_cpus()
    busy = 0.0
    for cpu in cpus:
        if cpu in previous[2] and cpu in look[2]:
            total = look[2][cpu][1] - previous[2][cpu][1]
            idle = look[2][cpu][0] - previous[2][cpu][0]
            busy += (total - idle) / total if total > 0 else 0.0
    own = (look[1] - previous[1]) / max(look[0] - previous[0], 1e-9)
    others = max(0.0, busy - own)
    allowed = len(cpus)
    quota = cpu_quota()
    if quota is not None:
        allowed = max(1, min(allowed, int(quota)))
    n = threads_for(len(cpus) - others, allowed)
    if n != gov.chosen:
        torch.set_num_threads(n)
        gov.chosen = n
        return n
    return None
