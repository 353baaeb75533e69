"""Fixed cost per all-reduce call on one GPU, measured the way the paper does.

Two figures, both in steady state with no host sync inside the timed region:

* kernel time minus the CUDA-graph node floor, per algorithm, virtual-rank
  count and message size: a CUDA graph holds ``--iters`` back-to-back calls on
  every rank's stream; it is replayed ``--reps`` times under CUDA events (the
  graph of empty kernels, measured the same way, is the floor). Points are
  measured in ``--passes`` interleaved passes; the median of all samples is kept.
  ``--launch streams`` (default): each rank's call is its own launch on its
  rank's stream, as on a host with a GPU per rank, so on one GPU the figure
  includes how far apart the N launches start; ``one``: each call is one launch
  of every rank's blocks, which start together (the floor: one empty kernel a
  call).
* a one-GPU mesh, jitted chain of ``--chain`` steps ``v = f(v) * 0.5`` with f
  the empty FFI custom call (``jaxll_noop``) or ``jaxll.all_reduce`` (with
  ``--jit-collectives``, also ``jaxll.ppermute`` and ``jaxll.all_to_all``); the
  compiled chain runs ``--runs`` times back to back with one sync at the end,
  repeated ``--reps`` times; the median per step is kept. ``--feedback 1``
  (default): each run takes the previous run's donated output, as a training
  loop does; ``0``: every run takes the same input, which makes XLA record its
  command buffers again on the host each run (host-bound; kept for comparison).

  python benchmarks/fixed_cost.py --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxll  # noqa: E402
from jaxll.tools import testing as jt  # noqa: E402

BARRIER_FREE = ["oneshot_ll", "oneshot_sentinel", "twoshot_ll", "twoshot_sentinel"]


def steady_per_call_us(fn, arg, calls: int, runs: int, reps: int,
                       feedback: bool = True) -> float:
  # The method of jaxll.tools.bench.timing.steady_per_call_us, repeated here so that
  # the script's timing is the same whichever jaxll build it measures. feedback:
  # each run takes the previous run's (donated) output, as a training loop
  # carries its state; `arg` itself is copied first, never consumed.
  first = jax.numpy.copy(arg)
  out = jax.block_until_ready(fn(first))
  out = jax.block_until_ready(fn(out if feedback else arg))
  samples = []
  for _ in range(reps):
    t0 = time.perf_counter()
    for _ in range(runs):
      out = fn(out if feedback else arg)
    jax.block_until_ready(out)
    samples.append((time.perf_counter() - t0) * 1e6 / (runs * calls))
  return statistics.median(samples)


def use_pdl(value: str) -> None:
  """Rebuilds workspaces with JAXLL_PDL=value (read when a workspace is built)."""
  os.environ["JAXLL_PDL"] = value
  jaxll.free_workspaces()
  jax.clear_caches()


def kernel_section(args, pdl: str) -> list[dict]:
  samples: dict[tuple, list[float]] = {}
  for _ in range(args.passes):
    use_pdl(pdl)
    for launch in args.launch:
      one = launch == "one"
      for n in args.ranks:
        samples.setdefault((launch, n, "floor", 0), []).extend(
            jt.graph_floor_us(n, iters=args.iters, reps=args.reps, one_launch=one))
        for nbytes in args.sizes:
          for algo in args.algorithms:
            samples.setdefault((launch, n, algo, nbytes), []).extend(
                jt.kernel_time_us(n, nbytes, algorithm=algo, iters=args.iters, reps=args.reps,
                                  one_launch=one))
  rows = []
  for launch in args.launch:
    for n in args.ranks:
      floor = statistics.median(samples[(launch, n, "floor", 0)])
      for nbytes in args.sizes:
        for algo in args.algorithms:
          k = statistics.median(samples[(launch, n, algo, nbytes)])
          rows.append({"ranks": n, "bytes": nbytes, "algorithm": algo, "pdl": pdl,
                       "launch": launch, "kernel_us": k, "floor_us": floor,
                       "above_floor_us": k - floor})
  return rows


# The collectives a jitted chain may call (on the one-GPU mesh: a group of one,
# whose kernels still run, epochs, signatures and all)
COLLECTIVE_CALLS = {
    "all_reduce": lambda v, algo: jaxll.all_reduce(v, "x", algorithm=algo),
    "ppermute": lambda v, algo: jaxll.ppermute(v, "x", [(0, 0)], algorithm=algo),
    "all_to_all": lambda v, algo: jaxll.all_to_all(v, "x", 0, 0, tiled=True, algorithm=algo),
}


def jit_section(args, pdl: str, feedback: bool) -> list[dict]:
  """The chains are compiled first, then timed in interleaved repetitions (each
  repetition times every chain once), so drifts hit all of them alike."""
  use_pdl(pdl)
  dev = jax.devices("cuda")[0]
  noop = jax.ffi.ffi_call("jaxll_noop", jax.ShapeDtypeStruct((4,), np.float32),
                          input_output_aliases={0: 0})
  half = np.float32(0.5)

  jit = (lambda f: jax.jit(f, donate_argnums=0)) if feedback else jax.jit

  @jit
  def noop_chain(v):
    for _ in range(args.chain):
      v = noop(v) * half
    return v

  chains = [("noop*0.5", 16, noop_chain, jax.device_put(np.ones(4, np.float32), dev))]
  mesh = jax.make_mesh((1,), ("x",), devices=[dev])
  for nbytes in args.sizes:
    xs = jax.device_put(np.ones(max(1, nbytes // 4), np.float32), NamedSharding(mesh, P("x")))
    for coll in args.jit_collectives:
      call = COLLECTIVE_CALLS[coll]
      for algo in args.jit_algorithms:
        def body(v, algo=algo, call=call):
          for _ in range(args.chain):
            v = call(v, algo) * half
          return v
        f = jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
        chains.append((f"{coll}[{algo}]*0.5", nbytes, f, xs))
  samples = {(name, nbytes): [] for name, nbytes, _, _ in chains}
  for _, _, f, x in chains:
    jax.block_until_ready(f(jax.numpy.copy(x)))  # compile
  for _ in range(args.reps):
    for name, nbytes, f, x in chains:
      samples[name, nbytes].append(
          steady_per_call_us(f, x, args.chain, args.runs, 1, feedback))
  rows = []
  floor = statistics.median(samples["noop*0.5", 16])
  for name, nbytes, _, _ in chains:
    us = statistics.median(samples[name, nbytes])
    row = {"what": name, "bytes": nbytes, "pdl": pdl, "feedback": feedback, "step_us": us}
    if name != "noop*0.5":
      row["above_noop_us"] = us - floor
    rows.append(row)
  return rows


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
  p.add_argument("--sizes", type=int, nargs="+", default=[8, 4096])
  p.add_argument("--algorithms", nargs="+", default=BARRIER_FREE)
  p.add_argument("--jit-algorithms", nargs="+", default=["oneshot_ll", "oneshot_sentinel"])
  p.add_argument("--jit-collectives", nargs="+", default=["all_reduce"],
                 choices=sorted(COLLECTIVE_CALLS), help="what the jitted chains call")
  p.add_argument("--launch", nargs="+", choices=["streams", "one"], default=["streams"],
                 help="streams: each rank's call its own launch on its own stream; one: "
                      "every rank's blocks in one launch")
  p.add_argument("--iters", type=int, default=400)
  p.add_argument("--reps", type=int, default=9)
  p.add_argument("--passes", type=int, default=3)
  p.add_argument("--chain", type=int, default=200)
  p.add_argument("--runs", type=int, default=20)
  p.add_argument("--no-jit", action="store_true")
  p.add_argument("--no-kernel", action="store_true")
  p.add_argument("--feedback", nargs="+", type=int, default=[1],
                 help="jitted chains: 0 = every run takes the same input, 1 = each run "
                      "takes the previous output (donated), as a training loop does")
  p.add_argument("--pdl", nargs="+", default=["1", "0"],
                 help="JAXLL_PDL settings to measure (1: programmatic dependent launch on)")
  p.add_argument("--label", default="")
  p.add_argument("--json")
  args = p.parse_args()
  kern = [] if args.no_kernel else [r for pdl in args.pdl for r in kernel_section(args, pdl)]
  jit = [] if args.no_jit else [r for pdl in args.pdl for fb in args.feedback
                                for r in jit_section(args, pdl, bool(fb))]
  print(f"# fixed cost {args.label} on {jax.devices('cuda')[0].device_kind}, jax {jax.__version__}")
  print(f"{'pdl':>3} {'launch':7} {'N':>2} {'bytes':>6} {'algorithm':18} {'kernel':>7} {'floor':>6} "
        f"{'above':>6}")
  for r in kern:
    print(f"{r['pdl']:>3} {r['launch']:7} {r['ranks']:>2} {r['bytes']:>6} {r['algorithm']:18} "
          f"{r['kernel_us']:7.2f} "
          f"{r['floor_us']:6.2f} {r['above_floor_us']:6.2f}")
  for r in jit:
    extra = f" above noop {r['above_noop_us']:.2f}" if "above_noop_us" in r else ""
    print(f"pdl {r['pdl']} feedback {int(r['feedback'])} jit 1-GPU mesh {r['what']:28s} {r['bytes']:>6} B: "
          f"{r['step_us']:.2f} us/step{extra}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"label": args.label, "config": vars(args), "kernel": kern, "jit": jit}, f,
                indent=1)
  jaxll.check_errors()


if __name__ == "__main__":
  main()
