"""A small virtual-rank run for compute-sanitizer (memcheck, racecheck, synccheck).

  compute-sanitizer --tool racecheck python3 tests/gpu_scripts/sanitizer_run.py [CALLS] [RANKS]

Drives every kernel through the native stress checker only (JAX's GPU backend
is never started, so the sanitizer sees jaxll's kernels alone): N virtual
ranks on CUDA device 0 for each N in RANKS (comma-separated, default 2,3; the
kernels are compiled separately for 1, 2, 4 and 8 ranks and for any other
count), f32 and bf16, mixed sizes including unaligned ones, on a workspace with
4 KiB of scratch per round so most calls take several rounds. Exits non-zero
on any mismatch or recorded timeout.
"""
import sys

import numpy as np

from jaxll import algorithms
from jaxll._ext import ext

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 12
ranks = [int(r) for r in sys.argv[2].split(",")] if len(sys.argv) > 2 else [2, 3]
bad = 0
for n in ranks:
  comm = ext.create_comm([[0] * n], True, 4096, 20000)
  counts = [int(c) for c in np.random.default_rng(n).integers(1, 6000, size=calls)]
  for name in algorithms.KERNELS:
    for dtype in ("float32", "bfloat16"):
      res = ext.virtual_stress(comm, [algorithms.SPECS[name].code],
                               algorithms.DTYPE_CODES[dtype], algorithms.OP_CODES["sum"],
                               counts, n, 5)
      print(n, name, dtype, res["mismatches"], res["error"] or "no error", flush=True)
      bad += res["mismatches"] + (1 if res["error"] else 0)
  ext.free_comm(comm)
print("SANITIZER_RUN", "FAILED" if bad else "OK", flush=True)
sys.exit(1 if bad else 0)
