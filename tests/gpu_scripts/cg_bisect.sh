#!/bin/bash
# Chases the open examples/cg_solver.py timeout with processes sharing one GPU
# (benchmarks/README.md, "Faults"): runs a short solve (20 iterations, one
# repeat, 3 s kernel timeout) under one setting per line and prints each
# setting's exit code and the first error of every process; the default run's
# optimized HLO of the solve goes to $OUT/cg_solve_after_optimizations.txt when
# OUT is set.
#   tests/gpu_scripts/cg_bisect.sh [PROCESSES]     (default 2)
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
p=${1:-2}
run() {  # label, env..., -- args...
  local label=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local s=$(date +%s)
  out=$(env JAXLL_TIMEOUT_MS=3000 "${envs[@]}" timeout 120 python3 "$here/examples/cg_solver.py" \
        --processes "$p" --iters 20 --repeats 1 "$@" 2>&1)
  local rc=$?
  echo "$label: rc=$rc $(( $(date +%s) - s )) s"
  echo "$out" | grep -o "rank [0-9]* waited more than [0-9]* ms for rank [0-9]*[a-z ]*(block [0-9]*, epoch [0-9]*)\|made different calls[^.]*" | sort -u | head -6 | sed 's/^/    /'
  echo "$out" | grep "iterations/s" | sed 's/^/    /'
}
dumpdir=$(mktemp -d)
run "default" "XLA_FLAGS=--xla_dump_to=$dumpdir --xla_dump_hlo_as_text" -- --grid 4096
if [ -n "${OUT:-}" ]; then
  f=$(ls "$dumpdir"/*jit_solve*after_optimizations.txt 2>/dev/null | head -1)
  [ -n "$f" ] && cp "$f" "$OUT/cg_solve_after_optimizations.txt"
fi
rm -rf "$dumpdir"
run "JAXLL_PDL=0" JAXLL_PDL=0 -- --grid 4096
run "command buffers off" "XLA_FLAGS=--xla_gpu_enable_command_buffer=" -- --grid 4096
run "JAXLL_SIGNATURES=0" JAXLL_SIGNATURES=0 -- --grid 4096
run "grid 1024 (halo call 4x smaller)" -- --grid 1024
run "grid 256" -- --grid 256
