"""First timing of the one-shot LL kernel on one GPU (virtual ranks).

Measures, side by side in one run:
  - kernel time per all-reduce call: a CUDA graph of `iters` back-to-back calls
    on every virtual rank's stream, replayed `reps` times (median of reps);
  - the graph-node floor: the same graph with an empty kernel per rank;
  - jitted per-call time: a jax.jit chain of K dependent calls, median of reps,
    for virtual ranks (one custom call forking onto N streams) and for the
    one-device mesh path through shard_map (command-buffer compatible handler);
and prints them next to the loopback speed of light quoted in DESIGN.md.

  python benchmarks/first_timing.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxll  # noqa: E402
import jaxll.testing as jt  # noqa: E402

LOOPBACK_SOL_US = 0.367  # DESIGN.md section 1, measured on one H200


def _median_time_per_call(fn, arg, k, reps):
  out = fn(arg)
  jax.block_until_ready(out)
  samples = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(arg))
    samples.append((time.perf_counter() - t0) * 1e6 / k)
  return statistics.median(samples), samples


def _machine():
  info = {"gpu": jax.devices()[0].device_kind, "gpu_count": len(jax.devices("cuda")),
          "jax": jax.__version__, "jaxlib": __import__("jaxlib").__version__,
          "python": platform.python_version()}
  try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20)
    info["driver"] = smi.stdout.strip().splitlines()[0]
  except Exception:  # noqa: BLE001
    info["driver"] = "unknown"
  return info


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--nbytes", type=int, default=4096)
  ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
  ap.add_argument("--iters", type=int, default=200)
  ap.add_argument("--reps", type=int, default=30)
  ap.add_argument("--chain", type=int, default=100)
  ap.add_argument("--json", default=None)
  args = ap.parse_args()

  result = {"machine": _machine(), "nbytes": args.nbytes, "dtype": "float32",
            "loopback_sol_us": LOOPBACK_SOL_US, "virtual": {}}
  count = args.nbytes // 4
  for n in args.ranks:
    kern = jt.kernel_time_us(n, args.nbytes, iters=args.iters, reps=args.reps)
    floor = jt.graph_floor_us(n, iters=args.iters, reps=args.reps)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((n, count)).astype(np.float32))
    scale = np.float32(1.0 / n)

    @jax.jit
    def chain(v):
      for _ in range(args.chain):
        v = jt.virtual_all_reduce(v) * scale
      return v

    jit_us, _ = _median_time_per_call(chain, x, args.chain, args.reps)
    row = {"kernel_us_median": statistics.median(kern), "kernel_us_samples": kern,
           "graph_floor_us_median": statistics.median(floor),
           "jitted_per_call_us_median": jit_us}
    result["virtual"][str(n)] = row
    print(f"N={n} {args.nbytes} B f32: kernel {row['kernel_us_median']:.2f} us/call, "
          f"graph floor {row['graph_floor_us_median']:.2f} us, jitted chain "
          f"{jit_us:.2f} us/call (virtual-rank custom call, not command-buffered)", flush=True)

  # One-device mesh, the SPMD handler (command-buffer compatible), N = 1.
  dev = jax.devices("cuda")[0]
  mesh = jax.make_mesh((1,), ("tp",), devices=[dev])
  x1 = jax.device_put(np.ones(count, np.float32), NamedSharding(mesh, P("tp")))

  def make_chain(algorithm):
    def body(v):
      for _ in range(args.chain):
        v = jaxll.all_reduce(v, "tp", algorithm=algorithm) * np.float32(0.5)
      return v
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))

  mesh_ll, _ = _median_time_per_call(make_chain("oneshot_ll"), x1, args.chain, args.reps)
  mesh_xla, _ = _median_time_per_call(make_chain("xla"), x1, args.chain, args.reps)
  result["one_device_mesh"] = {"oneshot_ll_per_step_us": mesh_ll,
                               "xla_per_step_us": mesh_xla,
                               "note": "chain step = all_reduce + multiply; XLA elides a "
                                       "1-device all-reduce, so the xla figure is the "
                                       "multiply alone"}
  print(f"1-device mesh chain step (all_reduce + multiply): oneshot_ll {mesh_ll:.2f} us, "
        f"xla (all-reduce elided) {mesh_xla:.2f} us", flush=True)
  print(f"loopback speed of light (DESIGN.md): {LOOPBACK_SOL_US} us")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
