"""The decode benchmark's pieces: the floor streams exactly the step's weights, bytes are
counted right, batched decode agrees with batch 1, the competing load never outlives its block."""
import contextlib
import json
import subprocess
import sys

import pytest
import torch

from reference.cpu import native_gemv
from reference.bench import decode, measure
from reference.decoding import generate
from reference.model import build_tiny
from reference.threads import configure as configure_threads
from devices import DEVICES


def test_floor_reads_every_weight_matrix_once(monkeypatch):
    model = build_tiny(0)
    seen = []
    real_linear = decode.linear      # reference.cpu.cpu_linear.linear, as the model's layers use it
    monkeypatch.setattr(decode, "linear", lambda x, w: seen.append(w) or real_linear(x, w))
    decode.floor_step(model, decode.floor_inputs(model, batch=2, context=7))
    matrices = [p for p in model.parameters() if p.dim() == 2]
    assert len(seen) == len(matrices)
    assert {id(w) for w in seen} == {id(p) for p in matrices}  # the model's own tensors, same layout
    assert sum(w.numel() * w.element_size() for w in seen) + \
        sum(p.numel() * p.element_size() for p in model.parameters() if p.dim() == 1) == model.weight_bytes()


def test_step_bytes_counts_weights_and_each_sequences_kv():
    model = build_tiny(0)
    cfg = model.config
    kv_one = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 100 * 4
    assert decode.step_bytes(model, 100) == model.weight_bytes() + kv_one
    assert decode.step_bytes(model, 100, batch=4) == model.weight_bytes() + 4 * kv_one


def test_batched_decode_matches_batch_one_greedy():
    model = build_tiny(1)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    times, tokens = decode.batched_decode(model, prompt, batch=3, n_steps=10)
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
    bw = measure.copy_bandwidth(n_bytes=8 << 20, seconds=0.1)
    assert 1e8 < bw < 1e13


@pytest.mark.slow
def test_bench_decode_prints_every_section(real_model, hf_peer, capsys):
    """In this process on the session's models (the bench's entry point and model loading are
    the CLI's, tested with the other benchmarks); the thread count it sets is put back."""
    before = torch.get_num_threads()
    try:
        decode.main(["--tokens", "4", "--naive-max", "4", "--batch", "2", "--batch-tokens", "3",
                     "--repeats", "1", "--under-load"], loaded=(*real_model, hf_peer))
    finally:
        configure_threads(before)
    out = capsys.readouterr().out
    for column in ("step/floor", "of copy", "cached/HF", "tok/s (all seqs)", "threads left to adapt", "chosen again"):
        assert column in out, out
    if native_gemv.available():
        assert "batch-1 steps: native step" in out and "through torch's operators" in out


def test_agreement_names_where_the_texts_part_and_why():
    assert decode.agreement([1, 2, 3], [1, 2, 3]) == "yes"
    assert decode.agreement([1, 2, 3], [1, 5, 3]) == "until 1"
    assert decode.agreement([1, 0, 3], [1, 5, 3], stop_ids=[0]) == "to end 1"   # HF made to go on
    assert decode.agreement([1, 2], [1, 2, 3]) == "until 2"


def test_pass_benchmark_times_every_implementation_and_predicts_from_the_roofline():
    from reference.model import ModelConfig
    from reference.bench.passes import measure_passes, predicted_seconds, ratio_to_one
    from reference.bench.machine import MachineRoofline

    machine = MachineRoofline(copy_bandwidth=10e9, matmul_flops=100e9, copy_bytes=1, matmul_size=1, threads=1)
    model = build_tiny(0)
    rows, used = measure_passes(model, context=8, positions=(1, 3), repeats=1, machine=machine)
    assert used is machine and [r.positions for r in rows] == [1, 3]
    assert all(s > 0 for r in rows for s in r.seconds.values()) and "ours" in rows[0].seconds
    assert ratio_to_one(rows, "ours")[1] == 1.0
    # Below the ridge (10 FLOP/byte here) a pass costs one read of the weights, whatever T is.
    one, five, many = (predicted_seconds(ModelConfig(), torch.float32, machine, t, 128)[0] for t in (1, 5, 64))
    assert five / one < 1.05 and many / one > 2


def test_batch_benchmark_rows_on_the_tiny_model():
    from reference.bench.batch import format_table, measure
    from reference.bench.workload import SHORT_SYSTEM_PROMPT, make_workload
    from reference.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    prompts = [r.prompt_ids for r in make_workload(tok, 3, 5, 0, system_prompt=SHORT_SYSTEM_PROMPT)]
    rows = measure(build_tiny(0), tok, None, prompts, 5, rounds=3)
    assert [r["config"] for r in rows] == ["ours, sequential (peer stand-in)", "ours: engine", "ours: engine + prefix cache"]
    assert all(r["tokens"] == 15 and r["same_as_first"] == 3 and r["tok_s"] > 0 for r in rows)
    assert all(len(r["runs"]) == 3 and r["seconds"] == sorted(r["runs"])[1] for r in rows)   # the median run
    assert rows[2]["ratios"]["ours, sequential (peer stand-in)"] == rows[2]["tok_s"] / rows[0]["tok_s"]
    assert "3 / 3" in format_table(rows, 3)


def test_engine_profile_splits_the_wall_time_by_kind_of_work():
    from reference.bench.batch import FAMILIES, format_profile, profile_engine
    from reference.tokenizer import ByteTokenizer

    split = profile_engine(build_tiny(0), ByteTokenizer(), [[1, 2, 3, 4, 5], [6, 7, 8]], 4)
    assert list(split) == [*FAMILIES, "other operators", "outside operators"]
    assert split["weight matmuls"] > 0 and split["attention (SDPA)"] > 0 and min(split.values()) >= 0
    assert "weight matmuls" in format_profile(split) and "%" in format_profile(split)


@pytest.mark.parametrize("device", DEVICES)
def test_batch_benchmark_command_on_a_device_writes_its_provenance(tmp_path, capsys, device):
    import json

    from reference.bench.batch import main

    path = tmp_path / "batch.json"
    main(["--model", "tiny", "--requests", "2", "--tokens", "3", "--device", device, "--json", str(path)])
    saved = json.loads(path.read_text())
    info = saved["provenance"]
    assert info["device"].startswith(device) and "--device" in info["command"] and info["torch"]
    assert ("gpu" in info and info["cuda"]) if device == "cuda" else "gpu" not in info
    assert [r["config"] for r in saved["rows"]][-1] == "ours: engine + prefix cache"
    assert "ours: engine" in capsys.readouterr().out


def test_interleaved_medians_alternate_the_candidates_after_one_warm_up_each():
    calls = []
    medians = measure.interleaved_medians({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3)
    assert calls == ["a", "b"] * 4  # the warm-up round, then three timed rounds in turn
    assert set(medians) == {"a", "b"} and all(0 <= s < 1 for s in medians.values())
    with pytest.raises(ValueError):
        measure.interleaved_medians({"a": lambda: None}, 0)


def test_threads_benchmark_runs_each_policy_in_a_clean_environment(monkeypatch, capsys):
    """Each child gets exactly its policy's OpenMP variables (none inherited), and every policy
    gets a row with each scenario's step."""
    from reference.bench import threads as bench_threads

    seen, real_run = [], subprocess.run

    def fake_run(cmd, **kwargs):
        if bench_threads.CHILD not in cmd:
            return real_run(cmd, **kwargs)
        env = kwargs["env"]
        seen.append(({k: env[k] for k in bench_threads.OPENMP_VARIABLES if k in env}, cmd[-1]))
        row = {"threads": 2, "step_ms": 20.0, "tok_s": 40.0, "of_copy": 0.5, "hf_tok_s": 20.0,
               "after_step_ms": 25.0, "after_threads": 1, "after_hf_tok_s": 18.0,
               "fixed_step_ms": 40.0}
        return subprocess.CompletedProcess(cmd, 0, stdout="noise\n" + json.dumps(row) + "\n")

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("GOMP_SPINCOUNT", "7")
    monkeypatch.setattr(bench_threads.subprocess, "run", fake_run)
    monkeypatch.setattr(bench_threads.measure, "competing_load",
                        lambda processes: contextlib.nullcontext())
    bench_threads.main(["--tokens", "4", "--repeats", "1"])
    out = capsys.readouterr().out
    assert [policy for policy, _ in seen[::2]] == list(bench_threads.POLICIES.values())
    assert [scenario for _, scenario in seen] == ["quiet", "load before"] * len(bench_threads.POLICIES)
    for name in bench_threads.POLICIES:
        assert f"{name:<16}   2      20.0" in out
    assert "80%" in out and "50%" in out   # kept under load (20/25) and with threads fixed (20/40)


def test_save_replaces_a_commands_section_of_the_results_page(tmp_path):
    """`--save` writes a run's output under its provenance into its command's section: a second
    run replaces that section and leaves the others; progress bars (carriage returns) are dropped."""
    from reference.bench.__main__ import save
    page = tmp_path / "README.md"
    page.write_text("# Measured results\n\nintro\n<!-- new sections go above this line -->\nolder runs\n")
    save("decode", ["--tokens", "8"], "table one\nloading\r 50%\rdone\n", page)
    save("passes", [], "passes table\n", page)
    save("decode", ["--tokens", "16"], "table two\n", page)
    text = page.read_text()
    assert text.startswith("# Measured results\n\nintro\n")
    assert text.count("<!-- bench decode -->") == 1 and "table one" not in text and "table two" in text
    assert "python -m reference.bench decode --tokens 16" in text and torch.__version__ in text
    assert "passes table" in text and "50%" not in text
    assert text.index("<!-- bench decode -->") < text.index("<!-- bench passes -->")   # in place
    assert text.index("<!-- bench passes -->") < text.index("older runs")
