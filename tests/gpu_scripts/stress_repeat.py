"""Runs the N=8 mixed-algorithm stress of test_gpu_virtual.py
(test_stress_hundred_thousand_calls_mixing_algorithms) several times per
setting, each run in a fresh process (settings are read when a workspace is
built), and prints one line per run: the setting, the error if any (its first
line says which wait gave up: "... for rank R" on the data path, "... for rank R
to start its call" on the call signatures) and the time. For chasing the
intermittent N=8 timeout (benchmarks/README.md, "Faults").

  python tests/gpu_scripts/stress_repeat.py [RUNS_PER_SETTING] [SECONDS]
"""
import json
import os
import subprocess
import sys
import time

CHILD = r'''
import json, sys, time, numpy as np, jaxll
from jaxll import testing as jt, algorithms
calls = int(sys.argv[1])
rng = np.random.default_rng(5)
small = rng.integers(1, 2048, size=calls - calls // 10)
large = rng.integers(2048, 200_000, size=calls // 10)
counts = rng.permutation(np.concatenate([small, large]))
t = time.time()
res = jt.stress(8, counts, algorithm=list(algorithms.KERNELS), seed=5, max_delay_us=10,
                config=jaxll.WorkspaceConfig(timeout_ms=3000))
print(json.dumps({"error": res["error"][:300], "mismatches": res["mismatches"],
                  "seconds": round(time.time() - t, 1)}))
'''
SETTINGS = [("default", {}), ("JAXLL_SIGNATURES=0", {"JAXLL_SIGNATURES": "0"}),
            ("JAXLL_PDL=0", {"JAXLL_PDL": "0"})]


def main():
  runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
  deadline = time.time() + (float(sys.argv[2]) if len(sys.argv) > 2 else 1e9)
  env = dict(os.environ, CUDA_DEVICE_MAX_CONNECTIONS="32")
  for i in range(runs):
    for name, extra in SETTINGS:
      if time.time() > deadline:
        print("out of time", flush=True)
        return
      r = subprocess.run([sys.executable, "-c", CHILD, "100000"], capture_output=True,
                         text=True, env=dict(env, **extra), timeout=300, cwd="/")
      lines = r.stdout.strip().splitlines()
      print(name, lines[-1] if lines else r.stderr[-400:], flush=True)


if __name__ == "__main__":
  main()
