#!/bin/bash
# Every kernel under the four compute-sanitizer tools (memcheck, racecheck,
# synccheck, initcheck), through tests/gpu_scripts/sanitizer_run.py (no JAX),
# including the error paths. Exits non-zero unless every tool reports 0 errors.
#   tests/gpu_scripts/sanitizers.sh [CALLS] [RANKS]   (defaults 6 and 1,2,3,4,8)
set -u
here=$(cd "$(dirname "$0")" && pwd)
calls=${1:-6}
ranks=${2:-1,2,3,4,8}
status=0
for tool in memcheck racecheck synccheck initcheck; do
  start=$(date +%s)
  out=$(compute-sanitizer --tool "$tool" python3 "$here/sanitizer_run.py" "$calls" "$ranks" 2>&1)
  rc=$?
  summary=$(echo "$out" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY" | tail -1)
  run=$(echo "$out" | grep SANITIZER_RUN | tail -1)
  echo "$tool: rc=$rc; ${summary:-no summary}; ${run:-no run line}; $(( $(date +%s) - start )) s"
  if [ $rc -ne 0 ] || ! echo "$summary" | grep -q " 0 errors\| 0 hazards"; then
    status=1
    echo "$out" | grep -v "^=========     " | tail -40
    # the first reports with their details (access sites, threads, blocks)
    echo "$out" | grep "^=========" | head -80
  fi
done
exit $status
