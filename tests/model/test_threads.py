"""Thread choice from free cores, at load time and again while the work runs (`adapt`)."""
import os
import subprocess
import sys

import pytest

import torch

from reference import threads
from reference.threads import cpu_quota, free_cores, threads_for


@pytest.mark.parametrize("free, allowed, expected", [
    (2.0, 2, 2), (1.8, 2, 2), (1.74, 2, 1), (1.0, 2, 1), (0.1, 2, 1), (0.0, 2, 1),
    (15.9, 16, 16), (6.5, 16, 6), (3.0, 2, 2)])
def test_threads_follow_the_free_cores(free, allowed, expected):
    assert threads_for(free, allowed) == expected


def write_stat(path, cpus):
    """A /proc/stat with the given (idle, busy) ticks per CPU."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{i} {busy} 0 0 {idle} 0 0 0 0 0 0" for i, (idle, busy) in enumerate(cpus)]
    path.write_text("\n".join(lines) + "\nintr 0\n")


def test_free_cores_reads_idle_time_over_the_window(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    samples = iter([[(0, 0), (0, 0)], [(100, 0), (0, 100)]])  # cpu0 idle, cpu1 busy
    monkeypatch.setattr("reference.threads.allowed_cpus", lambda: [0, 1])
    monkeypatch.setattr("reference.threads.time.sleep", lambda s: write_stat(stat, next(samples)))
    write_stat(stat, next(samples))
    assert free_cores(0.0, path=str(stat)) == pytest.approx(1.0)


def test_free_cores_falls_back_to_the_cpu_count(tmp_path):
    assert free_cores(0.0, path=str(tmp_path / "missing")) == len(os.sched_getaffinity(0))


def test_importing_reference_leaves_the_openmp_wait_policy_to_the_user():
    code = "import reference, os, torch; print(os.environ.get('OMP_WAIT_POLICY', 'unset'))"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.stdout.strip() == "unset", out.stderr


class Machine:
    """A 2-CPU machine whose /proc/stat, clock and process CPU time the test advances."""

    def __init__(self, monkeypatch):
        self.wall, self.own, self.ticks = 0.0, 0.0, {0: [0, 0], 1: [0, 0]}
        monkeypatch.setattr(threads, "allowed_cpus", lambda: [0, 1])
        monkeypatch.setattr(threads, "cpu_quota", lambda: None)
        monkeypatch.setattr(threads._governor, "look", lambda: (
            self.wall, self.own, {c: tuple(t) for c, t in self.ticks.items()}))

    def run(self, seconds: float, ours: float, others: float) -> None:
        """`seconds` pass with `ours` cores used by this process and `others` by other processes."""
        self.wall += seconds
        self.own += ours * seconds
        busy = min(2.0, ours + others)
        for cpu in (0, 1):
            share = min(1.0, max(0.0, busy - cpu))
            self.ticks[cpu][0] += round(100 * seconds * (1 - share))
            self.ticks[cpu][1] += round(100 * seconds)


@pytest.fixture
def two_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "choose_threads", lambda window_s=0.25: 2)
    threads.configure()
    yield Machine(monkeypatch)
    torch.set_num_threads(before)
    threads._governor.reset(None)


def test_adapt_follows_a_load_that_comes_and_goes(two_threads):
    machine = two_threads
    assert threads.adapt(every_s=1.0) is None          # the first look only records
    machine.run(1.0, ours=2.0, others=0.0)             # quiet: our two threads busy
    assert threads.adapt(every_s=1.0) is None and torch.get_num_threads() == 2
    machine.run(1.0, ours=1.1, others=0.9)             # a busy loop arrived
    assert threads.adapt(every_s=1.0) == 1, "another process's core must be left to it"
    machine.run(0.5, ours=1.0, others=1.0)
    assert threads.adapt(every_s=1.0) is None, "looks are rate-limited to one per second"
    machine.run(1.0, ours=1.0, others=0.0)             # the load went away
    assert threads.adapt(every_s=1.0) == 2 and torch.get_num_threads() == 2


def test_adapt_leaves_a_count_someone_chose(two_threads):
    machine = two_threads
    threads.configure(2)                               # --threads 2
    threads.adapt(every_s=1.0)
    machine.run(1.0, ours=1.0, others=1.0)
    assert threads.adapt(every_s=1.0) is None and torch.get_num_threads() == 2
    threads.configure()                                # chosen again by the module ...
    torch.set_num_threads(1)                           # ... then set by the user
    threads.adapt(every_s=1.0)
    machine.run(1.0, ours=1.0, others=0.0)
    assert threads.adapt(every_s=1.0) is None and torch.get_num_threads() == 1


@pytest.mark.parametrize("text, expected", [("max 100000", None), ("150000 100000", 1.5),
                                            ("200000 100000\n", 2.0)])
def test_cpu_quota_reads_cgroup_v2(tmp_path, text, expected):
    path = tmp_path / "cpu.max"
    path.write_text(text)
    assert cpu_quota(str(path)) == expected
    assert cpu_quota(str(tmp_path / "missing")) is None


def test_the_first_adapt_configures_unless_a_count_was_fixed(monkeypatch):
    """Through the Python API (`generate`, `LLM`) nothing calls `configure`: the first `adapt`
    does, from the cores free then, and follows the load from there; a count someone set before
    (torch's no longer the one it started with) is left alone."""
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "choose_threads", lambda window_s=0.25: 1)
    try:
        monkeypatch.setattr(threads._governor, "automatic", True)
        monkeypatch.setattr(threads, "_STARTUP_THREADS", torch.get_num_threads())
        from reference.decoding import generate
        from reference.model import build_tiny
        generate(build_tiny(0), [1, 2, 3], 2)
        assert torch.get_num_threads() == 1 and threads._governor.chosen == 1
        assert not threads._governor.automatic
        monkeypatch.setattr(threads._governor, "automatic", True)
        torch.set_num_threads(3)                       # fixed by the user before the first call
        assert threads.adapt() is None and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
        threads._governor.reset(None)


def test_a_count_handed_to_adapt_is_adapts_to_change(two_threads):
    machine = two_threads
    threads.configure(2, adapt=True)                   # as if the module had chosen 2
    threads.adapt(every_s=1.0)
    machine.run(1.0, ours=1.1, others=0.9)             # a busy loop arrived
    assert threads.adapt(every_s=1.0) == 1
