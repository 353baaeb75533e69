#!/usr/bin/env bash
# The multi-GPU runs on one host with several GPUs, in steps short
# enough for one 10-minute slot each. Results go to OUT (default
# benchmarks/results/multigpu). Never enables NVLink multicast.
#
#   benchmarks/multigpu.sh tests [OUT]     GPU suite, incl. tests/test_gpu_multigpu.py
#   benchmarks/multigpu.sh bench N [OUT]   jaxll vs psum on the first N GPUs, f32 + bf16
#   benchmarks/multigpu.sh tune [OUT]      auto table from every OUT/local_n*.json
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 XLA_PYTHON_CLIENT_PREALLOCATE=false
step=${1:?usage: benchmarks/multigpu.sh tests|bench N|tune [OUT]}
case "$step" in
  tests)
    OUT=${2:-benchmarks/results/multigpu}; mkdir -p "$OUT"
    .ci/gpu-check -s -rs 2>&1 | tee "$OUT/gpu_suite.txt" ;;
  bench)
    n=${2:?bench needs the GPU count}; OUT=${3:-benchmarks/results/multigpu}; mkdir -p "$OUT"
    PYTHONPATH="${JAXLL_SITE:-/tmp/jaxll-site}${PYTHONPATH:+:$PYTHONPATH}" \
      python3 -m jaxll.tools.bench --mode local --gpus "$n" --dtypes float32 bfloat16 \
      --json "$OUT/local_n$n.json" --plot "$OUT/local_n$n.png" 2>&1 | tee "$OUT/local_n$n.txt" ;;
  tune)
    OUT=${2:-benchmarks/results/multigpu}
    PYTHONPATH="${JAXLL_SITE:-/tmp/jaxll-site}${PYTHONPATH:+:$PYTHONPATH}" \
      python3 benchmarks/tune_auto.py "$OUT"/local_n*.json --from-local --out src/jaxll/tuning/all_reduce.json ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
