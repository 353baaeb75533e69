"""A small virtual-rank run for compute-sanitizer (memcheck, racecheck, synccheck).

  compute-sanitizer --tool memcheck python tests/gpu_scripts/sanitizer_run.py

Runs the stress checker (kernels only, no XLA) for N = 2, 3, 4 with a few
hundred calls of mixed sizes, including unaligned and multi-block ones, and
exits non-zero on any mismatch.
"""
import os
import sys

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import numpy as np  # noqa: E402

import jaxll.testing as jt  # noqa: E402

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 60
bad = 0
for n in (2, 3, 4):
  counts = np.random.default_rng(n).integers(1, 9000, size=calls)
  for dtype in ("float32", "bfloat16"):
    res = jt.stress(n, counts, dtype=dtype, seed=n, max_delay_us=5)
    print(n, dtype, res, flush=True)
    bad += res["mismatches"] + (1 if res["error"] else 0)
print("SANITIZER_RUN", "FAILED" if bad else "OK")
sys.exit(1 if bad else 0)
