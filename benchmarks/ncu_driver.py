"""Runs a few all-reduce kernels on virtual ranks for a profiler to catch.

  ncu --clock-control none --cache-control none -k regex:shot_kernel \
      python benchmarks/ncu_driver.py --ranks 1 oneshot_ll:8 oneshot_sentinel:4096

Each ALGORITHM:BYTES point is run as a CUDA graph of --iters calls replayed
--reps times (jaxll.tools.testing.kernel_time_us); fused:TOKENSxHIDDEN runs the fused
all-reduce + RMSNorm kernel the same way (bf16; jaxll.tools.testing.rmsnorm_kernel_time_us,
kernel name rmsnorm_kernel). ncu serialises kernels, so only --ranks 1 gives
representative per-kernel figures.
"""
import argparse
import os

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

from jaxll.tools import testing as jt  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--ranks", type=int, default=1)
p.add_argument("--iters", type=int, default=4)
p.add_argument("--reps", type=int, default=2)
p.add_argument("points", nargs="+", help="ALGORITHM:BYTES or fused:TOKENSxHIDDEN")
a = p.parse_args()
for pt in a.points:
  algo, size = pt.split(":")
  if algo == "fused":
    tokens, hidden = (int(v) for v in size.lower().split("x"))
    us = jt.rmsnorm_kernel_time_us(a.ranks, tokens, hidden, iters=a.iters, reps=a.reps)
  else:
    us = jt.kernel_time_us(a.ranks, int(size), algorithm=algo, iters=a.iters, reps=a.reps)
  print(pt, [round(u, 2) for u in us], flush=True)
