"""All-gather and reduce-scatter kernels along dimension 1 and the last dimension
against dimension 0, at the same bytes, on virtual ranks (one GPU): kernel time
minus the CUDA-graph floor per call, side by side in one run.

Along dimension 0 a rank's piece is one contiguous run of the gathered result
(the scattered input); along a later dimension it is cut into segments, one
per index of the dimensions before it, N segments apart, which the kernel
reads and writes in place. The shapes (per rank piece of `bytes`):

  dim0   (bytes / itemsize,)                         one segment
  dim1   (4, bytes / itemsize / 4)  gathered along 1  4 segments
  last   (bytes / 256, 256 / itemsize) along 1        segments of 256 bytes

For each (N, bytes, collective, kernel) the three layouts are measured in
--passes interleaved passes of --reps graph replays (--iters calls each), the
median of all samples kept; the graph of empty kernels measured the same way
is the floor.

  python benchmarks/gather_scatter_dims.py --json out.json
"""
from __future__ import annotations

import argparse
import json
import statistics

import jax
import numpy as np

import jaxll
from jaxll.tools import testing as jt

LAYOUTS = ("dim0", "dim1", "last")
LAST_SEGMENT_BYTES = 256


def segment_bytes(layout: str, nbytes: int) -> int:
  """Bytes of one segment of a piece of `nbytes` (0: one segment)."""
  return {"dim0": 0, "dim1": nbytes // 4, "last": LAST_SEGMENT_BYTES}[layout]


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--ranks", type=int, nargs="+", default=[2, 8])
  p.add_argument("--sizes", type=int, nargs="+",
                 default=[4096, 16384, 65536, 262144, 1048576])
  p.add_argument("--collectives", nargs="+", default=["all_gather", "psum_scatter"])
  p.add_argument("--algorithms", nargs="+", default=["oneshot_ll", "oneshot_sentinel"])
  p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
  p.add_argument("--iters", type=int, default=200)
  p.add_argument("--reps", type=int, default=7)
  p.add_argument("--passes", type=int, default=3)
  p.add_argument("--json")
  opts = p.parse_args()
  dev = jax.devices("cuda")[0]
  itemsize = np.dtype(jax.numpy.dtype(opts.dtype)).itemsize
  print(f"# all_gather / psum_scatter along dimensions 0, 1 and last on {dev.device_kind}, "
        f"jax {jax.__version__}, {opts.dtype}, pieces of `bytes` per rank; kernel minus "
        f"graph floor, us (median of {opts.passes} x {opts.reps}); last: segments of "
        f"{LAST_SEGMENT_BYTES} B, dim1: 4 segments")
  print(f"{'N':>2} {'bytes':>8} {'collective':<13} {'kernel':<17} {'dim0':>7} {'dim1':>7} "
        f"{'last':>7} {'dim1/0':>7} {'last/0':>7}")
  rows = []
  for n in opts.ranks:
    for nbytes in opts.sizes:
      for coll in opts.collectives:
        for algorithm in opts.algorithms:
          samples = {k: [] for k in LAYOUTS}
          floor_samples = []
          for _ in range(opts.passes):
            floor_samples += jt.graph_floor_us(n, iters=opts.iters, reps=opts.reps)
            for layout in LAYOUTS:
              samples[layout] += jt.gather_scatter_time_us(
                  n, nbytes, collective=coll, algorithm=algorithm, dtype=opts.dtype,
                  iters=opts.iters, reps=opts.reps,
                  segment_bytes=segment_bytes(layout, nbytes))
          floor = statistics.median(floor_samples)
          above = {k: statistics.median(samples[k]) - floor for k in LAYOUTS}
          ratio = {k: above[k] / above["dim0"] if above["dim0"] > 0 else 0.0 for k in LAYOUTS}
          rows.append({"ranks": n, "bytes": nbytes, "collective": coll, "algorithm": algorithm,
                       "dtype": opts.dtype, "floor_us": floor,
                       **{f"{k}_us": above[k] for k in LAYOUTS},
                       "dim1_over_dim0": ratio["dim1"], "last_over_dim0": ratio["last"],
                       "segment_bytes": {k: segment_bytes(k, nbytes) or nbytes
                                         for k in LAYOUTS}})
          print(f"{n:>2} {nbytes:>8} {coll:<13} {algorithm:<17} {above['dim0']:>7.2f} "
                f"{above['dim1']:>7.2f} {above['last']:>7.2f} {ratio['dim1']:>7.2f} "
                f"{ratio['last']:>7.2f}", flush=True)
  if opts.json:
    with open(opts.json, "w") as f:
      json.dump({"gpu": dev.device_kind, "jax": jax.__version__, "dtype": opts.dtype,
                 "itemsize": itemsize, "rows": rows}, f, indent=1)
  jaxll.check_errors()  # a kernel that gave up makes the figures meaningless


if __name__ == "__main__":
  main()
