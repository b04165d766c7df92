"""Thread choice from free cores, and the OpenMP wait policy set before torch is imported."""
import os
import subprocess
import sys

import pytest

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


def test_importing_reference_first_sets_a_passive_wait_policy():
    code = ("import reference, os, torch; print(os.environ['OMP_WAIT_POLICY'])")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.stdout.strip() == "PASSIVE", out.stderr
    env["OMP_WAIT_POLICY"] = "ACTIVE"  # the user's choice wins
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.stdout.strip() == "ACTIVE", out.stderr


@pytest.mark.parametrize("text, expected", [("max 100000", None), ("150000 100000", 1.5),
                                            ("200000 100000\n", 2.0)])
def test_cpu_quota_reads_cgroup_v2(tmp_path, text, expected):
    path = tmp_path / "cpu.max"
    path.write_text(text)
    assert cpu_quota(str(path)) == expected
    assert cpu_quota(str(tmp_path / "missing")) is None
