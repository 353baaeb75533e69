"""jaxll.all_reduce_rmsnorm: the fused kernel (algorithm="fused") against the
composition (the one-shot LL all-reduce, then XLA's fused norm math), per call,
in steady state: a jitted chain of --chain steps ``(x, r) = f(x, r, w)`` (as in
a decoder, where the normed output feeds the next layer's matmul and the new
residual its residual add; here normed stands in for the next layer's partial
sums), compiled once, run --runs times back to back with one
sync at the end, repeated --reps times; the median per step is kept. Runs in N
jax.distributed processes (jaxll.launch; they share GPU 0 where there are fewer
GPUs), shapes of decode steps (tokens x hidden). --profile adds the device
time per kernel of one run of each chain (process 0, JAX's profiler).

  python benchmarks/fused_rmsnorm.py --processes 2 --json out.json
  python benchmarks/fused_rmsnorm.py --processes 8 --shapes 1x8192,2x8192,4x8192,8x8192,16x8192,32x8192,64x8192,128x8192
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

SHAPES = [(1, 4096), (8, 4096), (1, 8192), (8, 8192), (32, 8192)]


def parse_shapes(text: str) -> list[tuple[int, int]]:
  """"1x8192,8x8192" -> [(1, 8192), (8, 8192)] (tokens x hidden, both positive)."""
  shapes = []
  for part in text.split(","):
    try:
      tokens, hidden = (int(v) for v in part.lower().split("x"))
    except ValueError:
      raise argparse.ArgumentTypeError(f"a shape is TOKENSxHIDDEN, got {part!r}") from None
    if tokens < 1 or hidden < 1:
      raise argparse.ArgumentTypeError(f"tokens and hidden must be positive, got {part!r}")
    shapes.append((tokens, hidden))
  return shapes


def worker(opts) -> None:
  import jax
  if opts.cpu:  # a dry run of the harness on CPU devices (XLA's path everywhere)
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from jaxll import launch
  launch.init_worker()
  import jaxll

  n = jax.device_count()
  mesh = jax.make_mesh((n,), ("tp",))

  def put(full, spec):
    sharding = NamedSharding(mesh, spec)
    idx = sharding.addressable_devices_indices_map(full.shape)
    return jax.make_array_from_single_device_arrays(
        full.shape, sharding, [jax.device_put(full[i], d) for d, i in idx.items()])

  rows = []
  for tokens, hidden in opts.shapes:
    rng = np.random.default_rng(tokens + hidden)
    x = put(rng.standard_normal((n * tokens, hidden)).astype(jnp.bfloat16), P("tp"))
    r0 = put(rng.standard_normal((tokens, hidden)).astype(jnp.bfloat16), P())
    w = put(np.ones(hidden, jnp.bfloat16), P())
    row = {"tokens": tokens, "hidden": hidden, "dtype": "bfloat16", "ranks": n}
    composed = "auto" if opts.cpu else "oneshot_ll"  # (a forced kernel refuses CPU)
    for name, algorithm in (("composed", composed), ("fused", "fused")):
      def chain(x, r, w, algorithm=algorithm):
        for _ in range(opts.chain):  # unrolled: a while loop would sync the host every step
          x, r = jaxll.all_reduce_rmsnorm(x, r, w, "tp", algorithm=algorithm)
        return x, r
      f = jax.jit(jax.shard_map(chain, mesh=mesh, in_specs=(P("tp"), P(), P()),
                                out_specs=(P("tp"), P()), check_vma=False))
      row[f"{name}_paths"] = sorted({s.algorithm for s in jaxll.explain(f, x, r0, w)})
      compiled = f.lower(x, r0, w).compile()
      launch.barrier()
      jax.block_until_ready(compiled(x, r0, w))

      def run_chain(runs):
        xs, r = x, r0
        for _ in range(runs):
          xs, r = compiled(xs, r, w)
        r.block_until_ready()

      per_step = []
      for _ in range(opts.reps):
        t0 = time.perf_counter()
        run_chain(opts.runs)
        per_step.append((time.perf_counter() - t0) / (opts.runs * opts.chain) * 1e6)
      row[f"{name}_us"] = statistics.median(per_step)
      if opts.profile:
        def traced():
          launch.barrier()  # (after the profiler started on process 0: see tp_decode)
          run_chain(2)
        if jax.process_index() == 0:
          from jaxll import kernel_profile
          times = kernel_profile.kernel_times(traced, f"/tmp/jaxll_fused_trace_{os.getpid()}")
          steps = 2 * opts.chain
          row[f"{name}_kernels"] = {kernel_profile.short_name(k): [c / steps, t / steps]
                                    for k, (c, t) in times.items()}
        else:
          traced()
    # (what algorithm="auto" takes for this shape; not timed: it is one of the two)
    auto = jax.shard_map(lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp"), mesh=mesh,
                         in_specs=(P("tp"), P(), P()), out_specs=(P("tp"), P()), check_vma=False)
    row["auto_paths"] = sorted({s.algorithm for s in jaxll.explain(jax.jit(auto), x, r0, w)})
    row["speedup"] = row["composed_us"] / row["fused_us"]
    rows.append(row)
  jaxll.check_errors()
  launch.report({"rows": rows})


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--processes", type=int, default=2)
  p.add_argument("--chain", type=int, default=64)
  p.add_argument("--runs", type=int, default=20)
  p.add_argument("--reps", type=int, default=5)
  p.add_argument("--json", default=None)
  p.add_argument("--shapes", type=parse_shapes, default=SHAPES,
                 help="tokens x hidden per rank, e.g. 1x8192,8x8192 (default: "
                      + ",".join(f"{t}x{h}" for t, h in SHAPES) + ")")
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--cpu", action="store_true", help="dry run on CPU devices (no kernels)")
  p.add_argument("--profile", action="store_true",
                 help="also the device time per kernel and step (JAX's profiler, process 0)")
  opts = p.parse_args()
  if opts.worker:
    worker(opts)
    return
  from jaxll import launch
  args = ["--worker", "--chain", str(opts.chain), "--runs", str(opts.runs),
          "--reps", str(opts.reps), "--shapes", ",".join(f"{t}x{h}" for t, h in opts.shapes)] + (["--cpu"] if opts.cpu else []) + (
              ["--profile"] if opts.profile else [])
  gpus = [str(i) for i in range(opts.processes)]
  try:
    if opts.cpu:
      raise ImportError
    import subprocess
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    if sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) < opts.processes:
      gpus = ["0"] * opts.processes
  except ImportError:
    gpus = None
  except (OSError, subprocess.SubprocessError):
    sys.exit("fused_rmsnorm.py needs NVIDIA GPUs (or --cpu for a dry run)")
  workers = launch.run(os.path.abspath(__file__), opts.processes, args=args, timeout=1800,
                       devices=gpus, mps=False if opts.cpu else "auto", env={"XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                                          "NCCL_NVLS_ENABLE": "0"})
  rows = workers[0].result["rows"]
  for r in rows:
    print(f"{r['tokens']:3d} x {r['hidden']:5d} bf16, {r['ranks']} ranks: composed "
          f"{r['composed_us']:7.2f} us ({','.join(r['composed_paths'])}), fused "
          f"{r['fused_us']:7.2f} us ({','.join(r['fused_paths'])}), {r['speedup']:.2f}x; "
          f"auto: {','.join(r['auto_paths'])}")
    for name in ("composed", "fused"):
      for kernel, (launches, us) in sorted(r.get(f"{name}_kernels", {}).items(), key=lambda kv: -kv[1][1]):
        print(f"    {name:8s} {us:7.2f} us/step in {launches:4.1f} launches/step of {kernel}")
  if opts.json:
    with open(opts.json, "w") as f:
      json.dump({"gpus": gpus, "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
