"""A small virtual-rank run for compute-sanitizer (memcheck, racecheck, synccheck).

  compute-sanitizer --tool memcheck python3 tests/gpu_scripts/sanitizer_run.py [CALLS]

Drives the kernels through the native stress checker only (JAX's GPU backend is
never started, so the sanitizer sees jaxll's kernels alone): N = 2, 3, 4
virtual ranks on CUDA device 0, f32 and bf16, mixed sizes including unaligned
and multi-block ones. Exits non-zero on any mismatch or recorded timeout.
"""
import sys

import numpy as np

from jaxll import algorithms
from jaxll._ext import ext

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 40
bad = 0
for n in (2, 3, 4):
  comm = ext.create_comm([[0] * n], True, 64 * 1024, 5000)
  counts = [int(c) for c in np.random.default_rng(n).integers(1, 12_000, size=calls)]
  for dtype in ("float32", "bfloat16"):
    res = ext.virtual_stress(comm, algorithms.SPECS["oneshot_ll"].code,
                             algorithms.DTYPE_CODES[dtype], algorithms.OP_CODES["sum"],
                             counts, n, 5)
    print(n, dtype, res, flush=True)
    bad += res["mismatches"] + (1 if res["error"] else 0)
  ext.free_comm(comm)
print("SANITIZER_RUN", "FAILED" if bad else "OK", flush=True)
sys.exit(1 if bad else 0)
