"""All-gather and reduce-scatter kernels on virtual ranks (one GPU): kernel time
minus the CUDA-graph floor per call, the LL16 and sentinel kernels against the
barrier baseline, side by side in one run.

For each (N, bytes per rank piece, collective) the three algorithms are
measured in --passes interleaved passes of --reps graph replays (--iters calls
each); the median of all samples is kept, the graph of empty kernels measured
the same way is the floor. The speed of light (on one GPU: 2 L2 round trips +
one remote store; jaxll.tools.bench.sol.probe_sol) is probed in the same run and printed
next to the LL16 kernel's time above the floor.

  python benchmarks/gather_scatter.py --json out.json
"""
from __future__ import annotations

import argparse
import json
import statistics

import jax

import jaxll
from jaxll.tools.bench.sol import probe_sol
from jaxll.tools import testing as jt

ALGORITHMS = ("oneshot_ll", "oneshot_sentinel", "oneshot_barrier")


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
  p.add_argument("--sizes", type=int, nargs="+", default=[8, 256, 4096, 65536])
  p.add_argument("--collectives", nargs="+", default=["all_gather", "psum_scatter"])
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
  p.add_argument("--iters", type=int, default=400)
  p.add_argument("--reps", type=int, default=9)
  p.add_argument("--passes", type=int, default=3)
  p.add_argument("--json")
  opts = p.parse_args()
  dev = jax.devices("cuda")[0]
  rows = []
  sol = probe_sol(dev.local_hardware_id, opts.reps)
  print(f"# all_gather / psum_scatter kernels on {dev.device_kind}, jax {jax.__version__}, "
        f"{opts.dtype} pieces of `bytes` per rank; "
        f"kernel minus graph floor, us (median of {opts.passes} x {opts.reps}); speed of light "
        f"{sol['sol_us']:.3f} us (L2 round trip {sol['l2_rtt_us']:.3f}, ping-pong one way "
        f"{sol['pingpong_one_way_us']:.3f})")
  print(f"{'N':>2} {'bytes':>6} {'collective':<13} {'oneshot_ll':>10} {'sentinel':>8} {'barrier':>8} {'barrier/ll':>10} {'ll/SoL':>7}")
  for n in opts.ranks:
    floor_samples = []
    for nbytes in opts.sizes:
      for coll in opts.collectives:
        samples = {a: [] for a in ALGORITHMS}
        for _ in range(opts.passes):
          floor_samples += jt.graph_floor_us(n, iters=opts.iters, reps=opts.reps)
          for a in ALGORITHMS:
            samples[a] += jt.gather_scatter_time_us(n, nbytes, collective=coll, algorithm=a,
                                                    dtype=opts.dtype, iters=opts.iters,
                                                    reps=opts.reps)
        floor = statistics.median(floor_samples)
        above = {a: statistics.median(samples[a]) - floor for a in ALGORITHMS}
        ratio = above["oneshot_barrier"] / above["oneshot_ll"] if above["oneshot_ll"] > 0 else 0.0
        rows.append({"ranks": n, "bytes": nbytes, "collective": coll, "dtype": opts.dtype,
                     "floor_us": floor,
                     **{f"{a}_us": above[a] for a in ALGORITHMS}, "barrier_over_ll": ratio})
        print(f"{n:>2} {nbytes:>6} {coll:<13} {above['oneshot_ll']:>10.2f} "
              f"{above['oneshot_sentinel']:>8.2f} {above['oneshot_barrier']:>8.2f} {ratio:>10.2f} "
              f"{above['oneshot_ll'] / sol['sol_us']:>7.2f}", flush=True)
  if opts.json:
    with open(opts.json, "w") as f:
      json.dump({"gpu": dev.device_kind, "jax": jax.__version__, "sol": sol, "rows": rows}, f, indent=1)
  jaxll.check_errors()  # a kernel that gave up makes the figures meaningless


if __name__ == "__main__":
  main()
