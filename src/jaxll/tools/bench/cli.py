"""``python -m jaxll.tools.bench``: all-reduce latency against message size, jaxll's
algorithms against each other, against XLA's all-reduce (``jax.lax.psum``) and
against the hardware's speed of light, measured side by side in one run.
``--collective all_gather`` or ``psum_scatter`` measures those instead (sizes
are one rank's piece; their algorithms; XLA's all-gather / reduce-scatter as
the reference; in the jitted chains a step is the all-gather of w keeping its
first piece, or the reduce-scatter of n copies of w).

Modes:
  virtual   N virtual ranks on one GPU (``--ranks``, default 8): kernel time per
            call (CUDA events over a CUDA graph of ``--iters`` calls on every
            rank's stream) and that time minus the graph-node floor (the same
            graph of empty kernels). psum cannot run here.
  local     one process, a mesh over the first N local GPUs (``--gpus``, default
            all of them, at least 2): jitted per-call time of a chain inside
            shard_map, jaxll against psum, and its cost above the custom-call
            floor (the same chain with an empty-kernel custom call).
  processes N jax.distributed processes sharing GPU 0 (``--procs``, default 2;
            CUDA MPS where available), one device each, timed like local mode.
Jitted figures are steady state: a jitted chain of ``--chain`` dependent calls is
run ``--runs`` times back to back with one sync at the end, each run on the
previous run's donated output (as a training loop carries its state), and the
time per call is the median over ``--reps`` such repetitions (no host sync or
dispatch inside the timed region). Every run also measures the speed-of-light
inputs on GPU 0: the L2 round trip (one __threadfence()), a flag ping-pong
between two blocks (and between every GPU pair with peer access), the bound
``2*L2 + (pingpong_rtt - 2*L2)/2``, the CUDA-graph node floor and the per-call
floor of a trivial FFI custom call in a jitted chain (command buffers on).

  python -m jaxll.tools.bench                      # a few minutes
  python -m jaxll.tools.bench --quick              # about a minute
  python -m jaxll.tools.bench --ranks 2 4 8 --json out.json --plot out.png
  python -m jaxll.tools.bench --mode processes --procs 2 8 --sizes 4K"""

from __future__ import annotations

import argparse
import json
import os
import sys

from jaxll.tools.bench import modes
from jaxll.tools.bench.report import format_pivot, format_table, plot, report, summarize
from jaxll.tools.bench.sol import machine_info, measure_sol
from jaxll.tools.bench.timing import COLLECTIVES
from jaxll.tools.bench.units import DEFAULT_SIZES, QUICK_SIZES, format_size, parse_size

MODES = ("virtual", "local", "processes")


def _prog() -> str:
  """The name the benchmark was started by: the jaxll-bench script, or the module."""
  name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
  return name if name.startswith("jaxll-bench") else "python -m jaxll.tools.bench"


def build_parser() -> argparse.ArgumentParser:
  from jaxll import algorithms
  p = argparse.ArgumentParser(
      prog=_prog(), description=__doc__.split("\n\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--mode", choices=MODES, nargs="+", default=["virtual", "local"],
                 help="what to measure (default: virtual local)")
  p.add_argument("--collective", choices=COLLECTIVES, default="all_reduce",
                 help="all_reduce (default), all_gather or psum_scatter; for the last two "
                      "sizes are one rank's piece (the gather's input, the scatter's output)")
  p.add_argument("--ranks", type=int, nargs="+", default=[8],
                 help="virtual ranks per run in virtual mode (default: 8)")
  p.add_argument("--gpus", type=int, nargs="+", default=None,
                 help="GPU counts per run in local mode, meshes over the first N local GPUs "
                      "(default: all of them)")
  p.add_argument("--sizes", type=parse_size, nargs="+", default=None,
                 help="message sizes per rank (default: 8 B .. 256 MiB and a few odd sizes)")
  p.add_argument("--dtypes", nargs="+", default=["float32"],
                 choices=sorted(algorithms.DTYPE_CODES), help="element types (default: float32)")
  p.add_argument("--algorithms", nargs="+", default=None,
                 choices=list(algorithms.ALGORITHMS),
                 help="algorithms to measure (default: all)")
  p.add_argument("--procs", type=int, nargs="+", default=[2],
                 help="process counts per run in processes mode (default: 2)")
  p.add_argument("--chain", type=int, default=200, help="calls per jitted chain (default 200)")
  p.add_argument("--runs", type=int, default=20,
                 help="jitted chains run back to back per timed repetition (default 20)")
  p.add_argument("--iters", type=int, default=200, help="calls per CUDA graph (default 200)")
  p.add_argument("--reps", type=int, default=15, help="repetitions per point (default 15)")
  p.add_argument("--quick", action="store_true",
                 help="3 sizes, shorter chains and fewer repetitions")
  p.add_argument("--json", metavar="PATH", help="write every measurement to PATH")
  p.add_argument("--plot", metavar="PATH", help="write a latency-vs-size PNG to PATH")
  p.add_argument("--no-sol", action="store_true", help="skip the speed-of-light probes")
  return p


def parse_args(argv=None) -> argparse.Namespace:
  p = build_parser()
  args = p.parse_args(argv)
  from jaxll.native import ext
  _MAX_RANKS = ext.max_ranks if ext is not None else 16
  for n in args.ranks:
    if not 1 <= n <= _MAX_RANKS:
      p.error(f"--ranks must be in 1..{_MAX_RANKS}, got {n}")
  for n in args.gpus or ():
    if not 2 <= n <= _MAX_RANKS:
      p.error(f"--gpus must be in 2..{_MAX_RANKS}, got {n}")
  for n in args.procs:
    if not 2 <= n <= _MAX_RANKS:
      p.error(f"--procs must be in 2..{_MAX_RANKS}, got {n}")
  for name in ("chain", "runs", "iters", "reps"):
    if getattr(args, name) < 1:
      p.error(f"--{name} must be at least 1")
  if args.quick:
    args.sizes = args.sizes or QUICK_SIZES
    args.chain, args.runs = min(args.chain, 50), min(args.runs, 5)
    args.iters, args.reps = min(args.iters, 50), min(args.reps, 5)
  args.sizes = sorted(set(args.sizes or DEFAULT_SIZES))
  if args.collective != "all_reduce":
    from jaxll import gather_scatter
    wrong = [a for a in args.algorithms or () if a not in gather_scatter.ALGORITHMS]
    if wrong:
      p.error(f"--collective {args.collective} takes --algorithms from "
              f"{list(gather_scatter.ALGORITHMS)}, got {wrong}")
    args.algorithms = args.algorithms or list(gather_scatter.ALGORITHMS)
  if args.algorithms is None:
    from jaxll import algorithms
    args.algorithms = list(algorithms.ALGORITHMS)
  if args.plot and not _have_matplotlib():
    p.error("--plot needs matplotlib (pip install matplotlib)")
  return args


def _have_matplotlib() -> bool:
  try:
    import matplotlib  # noqa: F401
    return True
  except ImportError:
    return False


def _measured_nothing(args, reason: str) -> int:
  """Says why the run measured nothing (and writes a report saying so where
  --json asks for one); the exit status is 1."""
  print("jaxll.tools.bench: measured nothing: " + reason, file=sys.stderr)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"measured": False, "reason": reason, "records": []}, f, indent=1)
    print(f"wrote {args.json} (no measurements)")
  return 1


def main(argv=None) -> int:
  """Runs the benchmark; 0 once something was measured, 1 where nothing could be."""
  os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
  args = parse_args(argv)
  import jax

  from jaxll import native
  try:
    gpus = jax.devices("cuda")
  except RuntimeError:
    gpus = []
  reason = None
  if not gpus:
    reason = (f"JAX sees no CUDA GPU (backend: {jax.default_backend()}); there is nothing "
              "to measure. Run it on a machine with an NVIDIA GPU and jax's CUDA plugin.")
  elif native.ext is None:
    reason = f"{native.NO_KERNELS_REASON}; there is nothing to measure."
  if reason is not None:
    return _measured_nothing(args, reason)

  n_virtual = len([a for a in args.algorithms if a != "xla"])
  local_counts = modes.local_gpu_counts(args, len(gpus))
  proc_counts = args.procs if "processes" in args.mode else []
  if "local" in args.mode and not local_counts:
    print(f"local mode: needs 2 or more GPUs ({'--gpus ' + str(args.gpus) if args.gpus else 'all'}"
          f" of {len(gpus)} visible); skipped", flush=True)
  total = len(args.dtypes) * len(args.sizes) * (
      (len(args.ranks) * n_virtual if "virtual" in args.mode else 0)
      + (len(local_counts) * len(args.algorithms) if "local" in args.mode else 0)) \
      + len(proc_counts) * len(args.dtypes)
  done = [0]

  def progress(rec):
    done[0] += 1
    print(f"\r[{done[0]}/{total}] {rec['mode']} N={rec['ranks']} {rec['dtype']} "
          f"{format_size(rec['bytes'])} {rec['algorithm']}".ljust(70), end="",
          file=sys.stderr, flush=True)

  info = machine_info()
  print(f"jaxll.tools.bench on {info['gpu_count']} x {info['gpu']} (driver {info['driver']}, "
        f"jax {info['jax']}, {info['nccl'] or 'NCCL version unknown'})", flush=True)
  sol = None if args.no_sol else measure_sol(args)
  records = []
  if "virtual" in args.mode:
    for n in args.ranks:
      records += modes.bench_virtual(args, n, progress)
  if "local" in args.mode:
    records += modes.bench_local(args, progress, gpus)
  if "processes" in args.mode:
    records += modes.bench_processes(args, progress)
  print(file=sys.stderr)
  if not any(r["status"] == "ok" for r in records):
    why = sorted({r.get("reason", "") for r in records} - {""})
    return _measured_nothing(args, "no point of this run could be measured" +
                             (": " + "; ".join(why) if why else
                              " (no mode of --mode ran: see the lines above)"))
  summary = summarize(records, sol)
  print(format_table(records, sol, args))
  print(format_pivot(records))
  for name, values in summary.items():
    for key, v in values.items():
      print(f"{name}: {key}: {v:.2f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report(info, args, sol, records), f, indent=1)
    print(f"wrote {args.json}")
  if args.plot:
    plot(records, sol, args.plot)
    print(f"wrote {args.plot}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
