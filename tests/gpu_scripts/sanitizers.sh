#!/bin/bash
# Every kernel under the four compute-sanitizer tools (memcheck, racecheck,
# synccheck, initcheck), through tests/gpu_scripts/sanitizer_run.py (no JAX),
# including the error paths. Exits non-zero unless every tool reports 0 errors.
#   tests/gpu_scripts/sanitizers.sh [CALLS] [RANKS]   (defaults 6 and 1,2,3,4,8)
# Each tool's run is stopped after JAXLL_SANITIZER_TIMEOUT seconds (default
# 900; 0: no limit) and then counts as failed, with the last lines the run
# printed (which name the kernel and shape it was on): a kernel that never
# finishes under a tool is reported rather than holding the machine.
set -u
here=$(cd "$(dirname "$0")" && pwd)
calls=${1:-6}
ranks=${2:-1,2,3,4,8}
limit=${JAXLL_SANITIZER_TIMEOUT:-900}
case "$limit" in
  ''|*[!0-9]*) echo "JAXLL_SANITIZER_TIMEOUT must be a whole number of seconds, got '$limit'" >&2; exit 2 ;;
esac
status=0
for tool in memcheck racecheck synccheck initcheck; do
  start=$(date +%s)
  # timeout runs the tool in a process group of its own and signals the whole
  # group (compute-sanitizer and the python it runs), KILL 10 s after TERM
  out=$(timeout -k 10 "$limit" compute-sanitizer --tool "$tool" python3 "$here/sanitizer_run.py" "$calls" "$ranks" 2>&1)
  rc=$?
  summary=$(echo "$out" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY" | tail -1)
  run=$(echo "$out" | grep SANITIZER_RUN | tail -1)
  # (124: stopped by TERM; 137 past the limit: by KILL; 137 sooner is another kill)
  if [ "$limit" -gt 0 ] && { [ $rc -eq 124 ] || { [ $rc -eq 137 ] && [ $(( $(date +%s) - start )) -ge "$limit" ]; }; }; then
    summary="timed out after $limit s (JAXLL_SANITIZER_TIMEOUT)"
  fi
  echo "$tool: rc=$rc; ${summary:-no summary}; ${run:-no run line}; $(( $(date +%s) - start )) s"
  if [ $rc -ne 0 ] || ! echo "$summary" | grep -q " 0 errors\| 0 hazards"; then
    status=1
    echo "$out" | grep -v "^=========     " | tail -40
    # the first reports with their details (access sites, threads, blocks)
    echo "$out" | grep "^=========" | head -80
  fi
done
exit $status
