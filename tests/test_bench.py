"""The decode benchmark's pieces: the floor streams exactly the step's weights, bytes are
counted right, batched decode agrees with batch 1, the competing load never outlives its block."""
import subprocess
import sys

import pytest
from torch.nn import functional as F

from reference import measure
from reference.decoding import generate
from reference.model import build_tiny


def test_floor_reads_every_weight_matrix_once(monkeypatch):
    model = build_tiny(0)
    seen = []
    real_linear = F.linear
    monkeypatch.setattr(measure.F, "linear", lambda x, w: seen.append(w) or real_linear(x, w))
    measure.floor_step(model, measure.floor_inputs(model, batch=2, context=7))
    matrices = [p for p in model.parameters() if p.dim() == 2]
    assert len(seen) == len(matrices)
    assert {id(w) for w in seen} == {id(p) for p in matrices}  # the model's own tensors, same layout
    assert sum(w.numel() * w.element_size() for w in seen) + \
        sum(p.numel() * p.element_size() for p in model.parameters() if p.dim() == 1) == model.weight_bytes()


def test_step_bytes_counts_weights_and_each_sequences_kv():
    model = build_tiny(0)
    cfg = model.config
    kv_one = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 100 * 4
    assert measure.step_bytes(model, 100) == model.weight_bytes() + kv_one
    assert measure.step_bytes(model, 100, batch=4) == model.weight_bytes() + 4 * kv_one


def test_batched_decode_matches_batch_one_greedy():
    model = build_tiny(1)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    times, tokens = measure.batched_decode(model, prompt, batch=3, n_steps=10)
    assert len(times) == 10 and all(t > 0 for t in times)
    expected = generate(model, prompt, 11)
    for row in tokens.tolist():
        assert row == expected


def test_competing_load_runs_inside_and_is_killed_after():
    with pytest.raises(RuntimeError):
        with measure.competing_load(processes=2, max_seconds=60) as procs:
            assert all(p.poll() is None for p in procs)  # busy while the block runs
            raise RuntimeError("the benchmark failed")
    assert all(p.returncode is not None for p in procs)  # killed and reaped anyway


def test_busy_loop_ends_by_itself():
    proc = subprocess.run([sys.executable, "-c", measure.BUSY_LOOP, "0.2"], timeout=60)
    assert proc.returncode == 0


def test_copy_bandwidth_is_positive_and_finite():
    bw = measure.copy_bandwidth(n_bytes=8 << 20, repeats=2)
    assert 1e8 < bw < 1e13


@pytest.mark.slow
def test_bench_decode_prints_every_section():
    out = subprocess.run([sys.executable, "-m", "reference.bench", "decode", "--tokens", "4",
                          "--naive-max", "4", "--batch", "2", "--batch-tokens", "3", "--repeats", "1",
                          "--under-load"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    for column in ("step/floor", "of copy", "cached/HF", "tok/s (all seqs)", "threads chosen under load"):
        assert column in out.stdout, out.stdout
