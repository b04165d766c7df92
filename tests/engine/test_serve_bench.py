"""The serving benchmark's pieces: a seeded workload, percentiles as numpy computes them, summary
statistics from their definitions, a table with every row, arrivals honoured, and an end-to-end
run on the tiny model."""
import json
import math
import random
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest

from reference.bench.serve import CACHED, CONTINUOUS, ENGINE_CONFIGS, STATIC, run_engine
from reference.calculators.batching_sim import percentile
from reference.bench.workload import (SHORT_SYSTEM_PROMPT, SYSTEM_PROMPT, BenchRequest, RequestTiming,
                                      add_ratios, chat_prompt_ids, format_table, make_workload,
                                      prefix_hit_bound, summarize)
from reference.tokenizer import ByteTokenizer


def byte_workload(seed, n=24, max_tokens=64):
    return make_workload(ByteTokenizer(), n, max_tokens, seed, system_prompt=SHORT_SYSTEM_PROMPT)


def test_workload_is_reproducible_from_its_seed():
    assert byte_workload(3) == byte_workload(3)
    other = byte_workload(4)
    assert [r.prompt_ids for r in other] != [r.prompt_ids for r in byte_workload(3)]
    assert [r.max_tokens for r in other] != [r.max_tokens for r in byte_workload(3)]


def test_workload_shares_the_system_prompt_and_mixes_lengths():
    requests = byte_workload(0, n=32, max_tokens=64)
    shared = chat_prompt_ids(ByteTokenizer(), SHORT_SYSTEM_PROMPT, "")[:len(SHORT_SYSTEM_PROMPT)]
    assert all(r.prompt_ids[:len(shared)] == shared for r in requests)
    user_lengths = {len(r.prompt_ids) - len(shared) for r in requests}
    assert len(user_lengths) > 8                                   # mixed prompt lengths
    outputs = [r.max_tokens for r in requests]
    assert all(8 <= n <= 64 for n in outputs) and 64 in outputs    # capped Pareto: some hit the cap
    assert np.median(outputs) < np.mean(outputs)                   # and the tail is long


def test_poisson_offsets_start_at_zero_and_scale_with_the_rate():
    requests = byte_workload(1, n=200)
    offsets = [r.arrival_units for r in requests]
    assert offsets[0] == 0 and all(b > a for a, b in zip(offsets, offsets[1:]))
    gaps = np.diff(offsets)
    assert 0.8 < gaps.mean() < 1.25                                 # exponential gaps of mean 1
    assert requests[5].arrival_s(None) == 0.0
    assert requests[5].arrival_s(4.0) == pytest.approx(offsets[5] / 4.0)


@pytest.mark.slow
def test_real_model_prompts_use_the_chat_template():
    from reference.weights import gguf_path, read_gguf
    from reference.tokenizer import Tokenizer
    tok = Tokenizer.from_gguf(read_gguf(gguf_path()))
    requests = make_workload(tok, 4, 16, 0)
    text = tok.decode(requests[0].prompt_ids)
    assert text.startswith("<|im_start|>system\n" + SYSTEM_PROMPT + "<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_prefix_hit_bound_counts_full_blocks_shared_with_earlier_prompts():
    system = list(range(100, 110))                               # 10 shared tokens: 2 full blocks of 4
    prompts = [system + [1, 2, 3], system + [4, 5, 6, 7, 8], system[:9] + [9], [7] * 8]
    requests = [BenchRequest(i, ids, 4, float(i)) for i, ids in enumerate(prompts)]
    # full blocks: 3, 3, 2, 2; shared with an earlier prompt: 0, 2, 2, 0
    assert prefix_hit_bound(requests, block_size=4) == pytest.approx(4 / 10)
    assert prefix_hit_bound(requests[::-1], block_size=4) == pytest.approx(4 / 10)  # arrival order, not list order
    assert prefix_hit_bound(requests[:1], block_size=4) == 0.0


@pytest.mark.parametrize("n", [1, 2, 7, 100])
def test_percentile_matches_numpy(n):
    rng = random.Random(n)
    values = [rng.expovariate(1.0) for _ in range(n)]
    for q in (0, 1, 50, 90, 99, 100, rng.uniform(0, 100)):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-12)
    assert math.isnan(percentile([], 50))


def test_summarize_follows_the_definitions():
    timings = [RequestTiming(10.0), RequestTiming(11.0), RequestTiming(11.5)]
    for t, (first, finish, n) in zip(timings, [(10.5, 12.5, 5), (12.0, 13.0, 3), (12.0, 12.0, 1)]):
        t.record(n, True, finish)
        t.first_token = first
    row = summarize(timings, start=10.0)
    assert row["output_tokens"] == 9 and row["wall_s"] == pytest.approx(3.0)
    assert row["tok_per_s"] == pytest.approx(3.0)
    ttfts = [500.0, 1000.0, 500.0]
    tpots = [500.0, 500.0]                       # (12.5-10.5)/4 and (13-12)/2; one-token reply has none
    assert row["ttft_p50_ms"] == pytest.approx(np.percentile(ttfts, 50))
    assert row["ttft_p99_ms"] == pytest.approx(np.percentile(ttfts, 99))
    assert row["tpot_p99_ms"] == pytest.approx(np.percentile(tpots, 99))
    with pytest.raises(ValueError, match="finished"):
        summarize([RequestTiming(0.0)], start=0.0)


def test_table_has_every_configuration_row_and_its_ratios():
    rows = []
    for arrival, scale in (("all at once", 1.0), ("poisson", 0.5)):
        for config, speed in (("HF generate, sequential", 10.0), (STATIC, 20.0), (CONTINUOUS, 60.0), (CACHED, 80.0)):
            rows.append({"arrival": arrival, "config": config, "requests": 4, "output_tokens": 100,
                         "wall_s": 1.0, "tok_per_s": speed * scale, "ttft_p50_ms": 1.0, "ttft_p99_ms": 2.0,
                         "tpot_p50_ms": 3.0, "tpot_p99_ms": None, "slot_utilisation": 0.5,
                         "prefix_hit_rate": 0.9 if config == CACHED else 0.0, "preemptions": 0})
    add_ratios(rows, static=STATIC, sequential="HF generate, sequential")
    assert [r["vs_static"] for r in rows[:4]] == [0.5, 1.0, 3.0, 4.0]
    assert [r["vs_sequential"] for r in rows[4:]] == [1.0, 2.0, 6.0, 8.0]
    lines = format_table(rows).splitlines()
    assert len(lines) == 2 + len(rows)
    for line, row in zip(lines[2:], rows):
        assert line.startswith(row["arrival"]) and row["config"] in line
    assert "8.00x" in lines[-1] and "90%" in lines[-1] and lines[-1].split()[-4] == "-"  # None prints "-"


class FakeEngine:
    """Generates one token per step for every request it holds; notes when each was added."""

    def __init__(self):
        self.added, self.running, self.stats = {}, {}, {"preemptions": 0}

    def add_request(self, prompt, params, request_id=None, arrival_time=None):
        self.added[request_id] = (time.perf_counter(), arrival_time)
        self.running[request_id] = [params.max_tokens, 0]
        return request_id

    def has_unfinished(self):
        return bool(self.running)

    def step(self):
        time.sleep(0.002)
        outs = []
        for rid, state in list(self.running.items()):
            state[1] += 1
            done = state[1] == state[0]
            outs.append(SimpleNamespace(request_id=rid, token_ids=[1] * state[1], finished=done,
                                        finish_reason="length" if done else None, error=None))
            if done:
                del self.running[rid]
        return outs


def test_run_engine_adds_each_request_when_its_time_comes(monkeypatch):
    monkeypatch.setitem(sys.modules, "reference.engine",
                        SimpleNamespace(SamplingParams=lambda **kw: SimpleNamespace(**kw)))
    requests = byte_workload(2, n=6, max_tokens=8)
    engine, rate = FakeEngine(), 20.0                     # arrivals spread over about 0.25 s
    start = time.perf_counter()
    summary, stats = run_engine(SimpleNamespace(engine=engine), requests, rate)
    for r in requests:
        added, arrival = engine.added[f"req-{r.index}"]
        assert arrival == pytest.approx(start + r.arrival_s(rate), abs=0.01)
        assert arrival <= added < arrival + 0.05            # never early, at most about a step late
    assert summary["output_tokens"] == sum(r.max_tokens for r in requests)
    assert stats == {"preemptions": 0}


@pytest.mark.slow
def test_quick_tiny_run_prints_and_saves_every_row(tmp_path):
    path = tmp_path / "serve.json"
    out = subprocess.run([sys.executable, "-m", "reference.bench", "serve", "--quick", "--model", "tiny",
                          "--json", str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    saved = json.loads(path.read_text())
    configs = ["ours, sequential", *ENGINE_CONFIGS]
    assert [(r["arrival"], r["config"]) for r in saved["rows"]] == \
        [(a, c) for a in ("all at once", "poisson") for c in configs]
    expected_tokens = sum(r.max_tokens for r in byte_workload(0, n=12, max_tokens=32))
    for row in saved["rows"]:
        assert row["output_tokens"] == expected_tokens and row["requests"] == 12
        assert row["config"] in out.stdout
        assert math.isfinite(row["tok_per_s"]) and row["ttft_p50_ms"] <= row["ttft_p99_ms"]
    for key in ("cpu", "threads", "torch", "date", "command"):
        assert saved["provenance"][key]
    assert "goal >= 3x" in out.stdout
