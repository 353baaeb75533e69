#!/usr/bin/env bash
# The fixed-cost measurements of docs/performance.md in one run on a GPU
# machine: builds this tree (and, with BASE=/path/to/another/tree, that tree
# side by side as a baseline, timed with its own benchmarks/fixed_cost.py), then
#   1. "fc": benchmarks/fixed_cost.py (kernel minus graph floor, N = 1/2/4/8,
#      8 B and 4 KiB, and the one-GPU-mesh jitted step against the empty call),
#      this tree with programmatic dependent launch on and off;
#   2. "bench": jaxll.tools.bench, virtual ranks and 2 / 8 jax.distributed
#      processes sharing the GPU (MPS), 4 KiB, steady state;
#   3. "regress": large messages on virtual ranks (64 KiB .. 64 MiB, N = 2 and
#      8, f32);
#   4. "sweep": a virtual-rank sweep 8 B .. 64 MiB, N = 2/4/8, f32 + bf16 (input
#      for benchmarks/tune_auto.py).
# Results in OUT (default /tmp/fixed_cost_out); STEPS picks steps (default all:
# "fc bench regress sweep").
#
#   BASE=/path/to/baseline/tree benchmarks/fixed_cost_run.sh [OUT]
#   STEPS=sweep benchmarks/fixed_cost_run.sh [OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/fixed_cost_out}}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 XLA_PYTHON_CLIENT_PREALLOCATE=false
export CUDA_DEVICE_MAX_CONNECTIONS=32 JAXLL_CUDA_ARCHITECTURES=${JAXLL_CUDA_ARCHITECTURES:-90-real}
LOG=$OUT/log.txt
STEPS=" ${STEPS:-fc bench regress sweep} "
step() { [[ "$STEPS" == *" $1 "* ]]; }
pip_install() { python3 -m pip install -q --no-build-isolation --no-deps --target "$2" "$1"; }
if [ -z "${SKIP_BUILD:-}" ]; then  # SKIP_BUILD=1: /tmp/fc_new (and /tmp/fc_base) are built
  if [ -n "${BASE:-}" ]; then pip_install "$BASE" /tmp/fc_base > "$OUT/build_base.log" 2>&1 & fi
  pip_install . /tmp/fc_new > "$OUT/build_new.log" 2>&1 || { tail -30 "$OUT/build_new.log"; exit 1; }
  wait
fi
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } >> "$LOG"
if step fc && [ -n "${BASE:-}" ]; then
  PYTHONPATH=/tmp/fc_base timeout 300 python3 "$BASE/benchmarks/fixed_cost.py" --label baseline \
    --pdl 1 --json "$OUT/fc_baseline.json" >> "$LOG" 2>&1
fi
step fc && PYTHONPATH=/tmp/fc_new timeout 400 python3 benchmarks/fixed_cost.py --label this --pdl 1 0 \
  --json "$OUT/fc_this.json" >> "$LOG" 2>&1
step bench && PYTHONPATH=/tmp/fc_new timeout 400 python3 -P -m jaxll.tools.bench --mode virtual processes \
  --ranks 2 8 --procs 2 8 --sizes 4K --algorithms oneshot_ll oneshot_sentinel --reps 9 \
  --json "$OUT/bench_4k.json" >> "$LOG" 2>&1
step regress && PYTHONPATH=/tmp/fc_new timeout 300 python3 -P -m jaxll.tools.bench --mode virtual \
  --ranks 2 8 --no-sol --reps 5 --sizes 64K 1M 16M 64M \
  --algorithms oneshot_ll oneshot_sentinel twoshot_ll twoshot_sentinel \
  --json "$OUT/regress.json" >> "$LOG" 2>&1
step sweep && PYTHONPATH=/tmp/fc_new timeout 500 python3 -P -m jaxll.tools.bench --mode virtual --ranks 2 4 8 \
  --dtypes float32 bfloat16 --no-sol --reps 5 \
  --sizes 8 32 128 512 2K 8K 32K 128K 512K 2M 8M 32M 64M --json "$OUT/sweep.json" >> "$LOG" 2>&1
echo "steps done:$STEPS" >> "$LOG"
