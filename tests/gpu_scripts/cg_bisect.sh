#!/bin/bash
# Chases the open examples/cg_solver.py timeout with processes sharing one GPU
# (benchmarks/README.md, "Faults"): runs a short solve (20 iterations, one
# repeat, 3 s kernel timeout) under one setting per line and prints each
# setting's exit code and the first errors of every process; the default run's
# optimized HLO of the solve goes to $OUT/cg_solve_after_optimizations.txt when
# OUT is set.
#   tests/gpu_scripts/cg_bisect.sh [PROCESSES] [LABEL...]   (default 2, every label)
# Labels: default pdl-off pdl-on pdl-on-conn32 cmdbuf-off cmdbuf-serialize
#         signatures-off mps-off timeout-30s grid-1024 grid-256
# (PDL is off by default where processes share a GPU; pdl-on forces it,
# pdl-on-conn32 also gives every MPS client 32 hardware queues instead of 4.)
# CG_BISECT_TIMEOUT: seconds one setting may take (default 120).
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
p=${1:-2}
shift || true
labels=${*:-default pdl-off pdl-on pdl-on-conn32 cmdbuf-off cmdbuf-serialize signatures-off mps-off timeout-30s grid-1024 grid-256}
run() {  # label, env..., -- args...
  local label=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local s=$(date +%s)
  out=$(env JAXLL_TIMEOUT_MS=3000 "${envs[@]}" timeout "${CG_BISECT_TIMEOUT:-120}" \
        python3 "$here/examples/cg_solver.py" --processes "$p" --iters 20 --repeats 1 \
        --collective jaxll "$@" 2>&1)
  local rc=$?
  echo "$label: rc=$rc $(( $(date +%s) - s )) s"
  echo "$out" | grep -o "rank [0-9]* waited more than [0-9]* ms for rank [0-9]*[a-z ]*(block [0-9]*, epoch [0-9]*)\|made different calls[^.]*" | sort | uniq -c | head -8 | sed 's/^/    /'
  echo "$out" | grep "iterations/s" | sed 's/^/    /'
  if [ $rc -ne 0 ] && [ -n "${OUT:-}" ]; then echo "$out" | tail -60 > "$OUT/cg_$label.log"; fi
}
for label in $labels; do
  case $label in
    default)
      dumpdir=$(mktemp -d)
      run default "XLA_FLAGS=--xla_dump_to=$dumpdir --xla_dump_hlo_as_text" -- --grid 4096
      if [ -n "${OUT:-}" ]; then
        f=$(ls "$dumpdir"/*jit_solve*after_optimizations.txt 2>/dev/null | head -1)
        [ -n "$f" ] && cp "$f" "$OUT/cg_solve_after_optimizations.txt"
      fi
      rm -rf "$dumpdir";;
    pdl-off) run "$label" JAXLL_PDL=0 -- --grid 4096;;
    pdl-on) run "$label" JAXLL_PDL=1 -- --grid 4096;;
    pdl-on-conn32) run "$label" JAXLL_PDL=1 CUDA_DEVICE_MAX_CONNECTIONS=32 -- --grid 4096;;
    cmdbuf-off) run "$label" "XLA_FLAGS=--xla_gpu_enable_command_buffer=" -- --grid 4096;;
    cmdbuf-serialize) run "$label" "XLA_FLAGS=--xla_gpu_command_buffer_scheduling_mode=SERIALIZE" -- --grid 4096;;
    signatures-off) run "$label" JAXLL_SIGNATURES=0 -- --grid 4096;;
    mps-off) run "$label" -- --grid 4096 --mps off;;
    timeout-30s) run "$label" JAXLL_TIMEOUT_MS=30000 -- --grid 4096;;
    grid-1024) run "$label" -- --grid 1024;;
    grid-256) run "$label" -- --grid 256;;
    *) echo "unknown label $label";;
  esac
done
