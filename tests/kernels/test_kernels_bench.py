"""`python -m reference.bench kernels` on a machine without a GPU: analytic bytes + interpreter check."""
import json

import pytest
import torch

from reference.bench.__main__ import main as bench_main


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the command runs the full timed benchmark")
def test_cpu_bench_reports_bytes_and_interpreter_errors(tmp_path, capsys):
    path = tmp_path / "kernels.json"
    bench_main(["kernels", "--json", str(path)])
    printed = capsys.readouterr().out
    assert "timings need a GPU" in printed
    result = json.loads(path.read_text())
    assert [row["N"] for row in result["hbm_bytes"]] == [512, 1024, 2048, 4096, 8192, 16384]
    assert all(row["naive"] > row["flash"] for row in result["hbm_bytes"])
    assert len(result["interpreter"]) == 4
    assert all(row["max_rel_error"] < 1e-5 for row in result["interpreter"]), result["interpreter"]
    assert "gpu" not in result["provenance"]
