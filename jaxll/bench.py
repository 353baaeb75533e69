"""``python -m jaxll.bench``: all-reduce latency against message size, jaxll's
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

  python -m jaxll.bench                      # a few minutes
  python -m jaxll.bench --quick              # about a minute
  python -m jaxll.bench --ranks 2 4 8 --json out.json --plot out.png
  python -m jaxll.bench --mode processes --procs 2 8 --sizes 4K
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

DEFAULT_SIZES = sorted({2 ** k for k in range(3, 29)} | {12, 3000, 100_000})
QUICK_SIZES = [8, 4096, 65536]
MODES = ("virtual", "local", "processes")
COLLECTIVES = ("all_reduce", "all_gather", "psum_scatter")
_SUFFIX = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
           "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text: str) -> int:
  """'4096', '4K', '64KiB', '1M' -> bytes (binary multiples)."""
  t = text.strip().upper()
  i = len(t)
  while i and not t[i - 1].isdigit():
    i -= 1
  number, suffix = t[:i], t[i:]
  if not number.isdigit() or suffix not in _SUFFIX:
    raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 8, 4K, 1M)")
  value = int(number) * _SUFFIX[suffix]
  if value <= 0:
    raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
  return value


def format_size(n: int) -> str:
  for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
    if n >= scale and n % scale == 0:
      return f"{n // scale} {unit}"
  return f"{n} B"


def build_parser() -> argparse.ArgumentParser:
  from jaxll import algorithms
  p = argparse.ArgumentParser(
      prog="python -m jaxll.bench", description=__doc__.split("\n\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--mode", choices=MODES, nargs="+", default=["virtual", "local"],
                 help="what to measure (default: both)")
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
  from jaxll._ext import ext
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


# --- machine ------------------------------------------------------------------------

def machine_info() -> dict:
  import jax
  import jaxlib
  info = {"python": platform.python_version(), "jax": jax.__version__,
          "jaxlib": jaxlib.__version__, "host": platform.node()}
  try:
    gpus = jax.devices("cuda")
  except RuntimeError:
    gpus = []
  info["gpu"] = gpus[0].device_kind if gpus else None
  info["gpu_count"] = len(gpus)
  try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30).stdout.split()
    info["driver"] = out[0] if out else None
  except (OSError, subprocess.SubprocessError):
    info["driver"] = None
  from jaxll._ext import ext
  v = ext.built_cuda_version if ext is not None else 0
  info["cuda_runtime_built"] = f"{v // 1000}.{(v % 1000) // 10}"
  info["nccl"] = _package_version("nvidia-nccl")
  info["cuda_plugin"] = _package_version("jax-cuda")
  return info


def _package_version(prefix: str) -> str | None:
  from importlib import metadata
  for dist in metadata.distributions():
    name = (dist.metadata.get("Name") or "").lower()
    if name.startswith(prefix):
      return f"{name} {dist.version}"
  return None


# --- timing helpers -------------------------------------------------------------------

def steady_per_call_us(fn, arg, calls_per_run: int, runs: int, reps: int) -> float:
  """Time per call in steady state, in µs: after two warm-up runs, each of
  `reps` repetitions dispatches `runs` runs back to back (each making
  `calls_per_run` dependent calls) and waits once at the end; the median over
  the repetitions. No host sync or dispatch gap sits inside the timed region
  except the one at its end, spread over ``runs * calls_per_run`` calls.

  Each run takes the previous run's output, as a training loop carries its
  state, so `fn` must return an array like its argument; jit it with
  ``donate_argnums=0`` so the buffers repeat and XLA replays its command
  buffers as they are. (Feeding the same input to every run makes XLA record
  its command buffers again on the host each run: on an H200 with jax 0.11.2
  that doubled an empty custom call's cost per call, see benchmarks/README.md.)
  `arg` itself is copied first, never consumed."""
  import jax
  arg = jax.block_until_ready(fn(jax.numpy.copy(arg)))
  arg = jax.block_until_ready(fn(arg))
  samples = []
  for _ in range(reps):
    t0 = time.perf_counter()
    for _ in range(runs):
      arg = fn(arg)
    jax.block_until_ready(arg)
    samples.append((time.perf_counter() - t0) * 1e6 / (runs * calls_per_run))
  return statistics.median(samples)


def steady_method(args) -> str:
  return (f"steady state: jitted chain of {args.chain} dependent calls, {args.runs} runs back "
          f"to back per sync, each on the last one's (donated) output, median of {args.reps}")


def probe_sol(ordinal: int, reps: int) -> dict:
  """The speed-of-light bound on one GPU: 2 L2 round trips (one
  ``__threadfence()`` each) + one remote store, the store from a flag ping-pong
  between two blocks on two streams; medians of ``reps`` probes."""
  from jaxll._ext import ext

  l2 = statistics.median(ext.probe_l2_fence_us(ordinal, 20000, False) for _ in range(reps))
  one_way = statistics.median(
      ext.probe_pingpong_one_way_us(ordinal, ordinal, 20000) for _ in range(reps))
  return {"l2_rtt_us": l2, "pingpong_one_way_us": one_way,
          "sol_us": 2 * l2 + (2 * one_way - 2 * l2) / 2}


def measure_sol(args) -> dict:
  """Speed-of-light inputs and per-call floors, on GPU 0 (and GPU pairs)."""
  import jax
  import numpy as np

  from jaxll._ext import ext
  import jaxll.testing as jt

  dev = jax.devices("cuda")[0]
  o = dev.local_hardware_id
  reps = max(3, args.reps // 3)
  store_fence = statistics.median(ext.probe_l2_fence_us(o, 20000, True) for _ in range(reps))
  sol = {"device": dev.device_kind, "store_fence_us": store_fence, **probe_sol(o, reps)}
  l2 = sol["l2_rtt_us"]
  pairs = {}
  gpus = jax.devices("cuda")
  for a in gpus:
    for b in gpus:
      if a.id < b.id and ext.can_access_peer(a.local_hardware_id, b.local_hardware_id):
        ow = statistics.median(
            ext.probe_pingpong_one_way_us(a.local_hardware_id, b.local_hardware_id, 20000)
            for _ in range(reps))
        pairs[f"{a.id}-{b.id}"] = {"pingpong_one_way_us": ow, "sol_us": 2 * l2 + (2 * ow - 2 * l2) / 2}
  sol["pairs"] = pairs

  # Per-call floor of a trivial FFI custom call in a jitted chain (command buffers on).
  noop = jax.ffi.ffi_call("jaxll_noop", jax.ShapeDtypeStruct((4,), np.float32),
                          input_output_aliases={0: 0})

  @functools.partial(jax.jit, donate_argnums=0)
  def chain(v):
    for _ in range(args.chain):
      v = noop(v)
    return v

  x = jax.device_put(np.ones(4, np.float32), dev)
  sol["ffi_call_floor_us"] = steady_per_call_us(chain, x, args.chain, args.runs, args.reps)
  sol["ffi_call_floor_method"] = steady_method(args)
  sol["graph_node_floor_us"] = {
      str(n): statistics.median(jt.graph_floor_us(n, iters=args.iters, reps=args.reps))
      for n in (args.ranks if "virtual" in args.mode else [])}
  return sol


# --- virtual mode -----------------------------------------------------------------------

def chain_step(collective: str, algorithm: str, n: int):
  """One step ``w -> w'`` (same shape, one rank's piece) of the jitted chains of
  local and processes modes, inside shard_map over axis "x" of n devices: the
  all-reduce; the all-gather of w (tiled), of which the step keeps the first
  piece; the reduce-scatter of n copies of w (tiled)."""
  import jax.numpy as jnp

  import jaxll
  if collective == "all_reduce":
    return lambda w: jaxll.all_reduce(w, "x", algorithm=algorithm)
  if collective == "all_gather":
    return lambda w: jaxll.all_gather(w, "x", tiled=True, algorithm=algorithm)[:w.shape[0]]
  if collective == "psum_scatter":
    # n copies of w along its first axis (w may have any rank: the processes
    # mode's w is (1, count)); the tiled reduce-scatter gives back w's shape.
    return lambda w: jaxll.psum_scatter(jnp.concatenate([w] * n, axis=0), "x", tiled=True,
                                        algorithm=algorithm)
  raise ValueError(f"collective must be one of {COLLECTIVES}, got {collective!r}")


def _virtual_gather_scatter(args, n: int, dtype: str, count: int, algo: str) -> dict:
  """One virtual-mode point of --collective all_gather / psum_scatter: the
  kernel (auto: its choice) timed, or why not."""
  import jax
  import numpy as np

  import jaxll.testing as jt
  from jaxll import gather_scatter
  item = np.dtype(jax.numpy.dtype(dtype)).itemsize
  out = {}
  kernel = algo
  if algo == "auto":
    operand = count * item * (n if args.collective == "psum_scatter" else 1)
    kernel, why = gather_scatter.choose_auto(args.collective, n, operand,
                                             jax.numpy.dtype(dtype))
    out["auto_choice"] = kernel
    if kernel == "xla":
      return dict(out, status="n/a", reason=f"auto picks xla ({why}), which cannot run on "
                                             "virtual ranks")
  sentinel_dtypes = gather_scatter._SENTINEL_DTYPES
  if kernel == "oneshot_sentinel" and jax.numpy.dtype(dtype).name not in sentinel_dtypes:
    return dict(out, status="n/a", reason=f"no sentinel kernel for {dtype}")
  # Fewer calls per graph for large pieces, as for the all-reduce: about
  # 256 MiB moved per graph (each rank reads n pieces of count items).
  iters = max(3, min(args.iters, (256 << 20) // max(1, count * item * n * n)))
  samples = jt.gather_scatter_time_us(n, count * item, collective=args.collective,
                                      algorithm=kernel, dtype=dtype, iters=iters,
                                      reps=args.reps)
  return dict(out, status="ok", kernel_us=statistics.median(samples), kernel_us_samples=samples)


def bench_virtual(args, n: int, progress) -> list[dict]:
  import jax
  import numpy as np

  from jaxll import algorithms
  import jaxll.testing as jt

  jt.virtual_workspace(n)
  floor = statistics.median(jt.graph_floor_us(n, iters=args.iters, reps=args.reps))
  records = []
  for dtype in args.dtypes:
    item = np.dtype(jax.numpy.dtype(dtype)).itemsize
    for nbytes in args.sizes:
      count = max(1, nbytes // item)
      for algo in args.algorithms:
        if algo == algorithms.XLA:
          continue  # XLA's all-reduce cannot run on virtual ranks
        rec = {"mode": "virtual", "ranks": n, "dtype": dtype, "bytes": count * item,
               "algorithm": algo, "collective": args.collective}
        progress(rec)
        if args.collective != "all_reduce":
          rec.update(_virtual_gather_scatter(args, n, dtype, count, algo))
          if rec["status"] == "ok":
            rec.update(floor_us=floor, above_floor_us=rec["kernel_us"] - floor)
          records.append(rec)
          continue
        kernel = algo
        if algo == algorithms.AUTO:
          kernel, why = algorithms.choose_auto(n, count * item, np.dtype(jax.numpy.dtype(dtype)), "sum")
          rec["auto_choice"] = kernel
        if kernel == algorithms.XLA:
          rec.update(status="n/a", reason=f"auto picks xla ({why}), which cannot run on "
                                          "virtual ranks")
        elif limit := algorithms.kernel_limits(kernel, np.dtype(jax.numpy.dtype(dtype)), "sum"):
          rec.update(status="n/a", reason=limit)
        else:
          # Fewer calls per graph for large messages: about 256 MiB moved per graph.
          iters = max(3, min(args.iters, (256 << 20) // max(1, count * item * n)))
          samples = jt.kernel_time_us(n, count * item, dtype=dtype, algorithm=kernel,
                                      iters=iters, reps=args.reps)
          k = statistics.median(samples)
          rec.update(status="ok", kernel_us=k, kernel_us_samples=samples, floor_us=floor,
                     above_floor_us=k - floor)
        records.append(rec)
  import jaxll
  jaxll.check_errors()
  return records


# --- local mode --------------------------------------------------------------------------

def local_gpu_counts(args, available: int) -> list[int]:
  """The GPU counts local mode measures: ``--gpus`` (those that exist), or all."""
  if args.gpus is None:
    return [available] if available >= 2 else []
  return sorted({n for n in args.gpus if n <= available})


def bench_local(args, progress, devices=None) -> list[dict]:
  """Local mode on the first N of `devices` (default: the CUDA GPUs) for each
  N of :func:`local_gpu_counts`."""
  import jax
  devices = jax.devices("cuda") if devices is None else devices
  records = []
  for n in local_gpu_counts(args, len(devices)):
    records += _bench_local_mesh(args, progress, devices[:n])
  return records


def _bench_local_mesh(args, progress, gpus) -> list[dict]:
  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxll
  from jaxll import algorithms

  n = len(gpus)
  mesh = jax.make_mesh((n,), ("x",), devices=gpus)
  records = []
  for dtype in args.dtypes:
    dt = np.dtype(jax.numpy.dtype(dtype))
    for nbytes in args.sizes:
      count = max(1, nbytes // dt.itemsize)
      x = jax.device_put(
          (np.random.default_rng(0).random(n * count) * 1e-3).astype(dt),
          NamedSharding(mesh, P("x")))
      for algo in args.algorithms:
        rec = {"mode": "local", "ranks": n, "dtype": dtype, "bytes": count * dt.itemsize,
               "algorithm": algo, "collective": args.collective}
        progress(rec)
        step = chain_step(args.collective, algo, n)

        def body(v, step=step):
          # v + (psum of v): the added local term keeps each step's input
          # non-replicated, so XLA cannot turn a psum of a psum into a multiply.
          w = v
          for _ in range(args.chain):
            w = v + step(w)
          return w

        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")),
                    donate_argnums=0)
        try:
          sites = jaxll.explain(f, x)
        except jaxll.AlgorithmUnavailableError as e:
          rec.update(status="n/a", reason=str(e).split(": ", 1)[-1])
          records.append(rec)
          continue
        rec["path"] = sites[0].algorithm if sites else "?"
        rec.update(status="ok", jit_us=steady_per_call_us(f, x, args.chain, args.runs, args.reps))
        records.append(rec)
      if gpus[0].platform != "gpu":
        continue  # (CPU devices in tests: jaxll's empty-kernel call needs a GPU)
      # The custom-call floor of the same chain: jaxll's empty-kernel call in
      # place of the all-reduce.
      def floor_body(v):
        w = v
        for _ in range(args.chain):
          w = v + jax.ffi.ffi_call("jaxll_noop", jax.ShapeDtypeStruct(w.shape, w.dtype),
                                   input_output_aliases={0: 0})(w)
        return w
      f = jax.jit(jax.shard_map(floor_body, mesh=mesh, in_specs=P("x"), out_specs=P("x")),
                  donate_argnums=0)
      floor = steady_per_call_us(f, x, args.chain, args.runs, args.reps)
      for r in records:
        if (r["dtype"], r["bytes"]) == (dtype, count * dt.itemsize) and r["status"] == "ok":
          r.update(floor_us=floor, above_floor_us=r["jit_us"] - floor)
  # psum as the reference for every point, from the same run.
  by_point = {}
  for r in records:
    if r["algorithm"] == algorithms.XLA and r["status"] == "ok":
      by_point[(r["dtype"], r["bytes"])] = r["jit_us"]
  for r in records:
    ref = by_point.get((r["dtype"], r["bytes"]))
    if ref and r["status"] == "ok":
      r["psum_jit_us"] = ref
      r["speedup_vs_psum"] = ref / r["jit_us"]
  jaxll.check_errors()
  return records


# --- processes mode ---------------------------------------------------------------------

def bench_processes(args, progress) -> list[dict]:
  """N jax.distributed processes sharing GPU 0 (MPS where available), each
  timing the same chains as local mode (jaxll/bench_worker.py)."""
  from jaxll import algorithms, launch
  from jaxll import bench_worker

  names = [a for a in args.algorithms if a != algorithms.XLA]  # NCCL cannot share a GPU
  records = []
  for n in args.procs:
    for dtype in args.dtypes:
      progress({"mode": "processes", "ranks": n, "dtype": dtype, "bytes": args.sizes[0],
                "algorithm": "(all)"})
      workers = launch.run(
          bench_worker.__file__, n, timeout=600, mps="auto", devices=["0"] * n,
          # every size stays on jaxll's kernels: XLA's all-reduce (NCCL) cannot
          # run several ranks on one GPU
          env={"JAXLL_AUTO_MAX_BYTES": str(1 << 40), "NCCL_NVLS_ENABLE": "0",
               "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
          args=["--sizes", *map(str, args.sizes), "--algorithms", *names, "--dtype", dtype,
                "--collective", args.collective,
                "--chain", str(args.chain), "--runs", str(args.runs), "--reps", str(args.reps)])
      results = [w.result for w in workers]
      for nbytes in args.sizes:
        floor = statistics.median(r["us"][f"{nbytes}:floor"] for r in results)
        for algo in names:
          rec = {"mode": "processes", "ranks": n, "dtype": dtype, "bytes": nbytes,
                 "algorithm": algo, "collective": args.collective}
          path = results[0]["paths"][f"{nbytes}:{algo}"]
          if path.startswith("n/a: "):  # the worker could not build this program
            records.append(dict(rec, status="n/a", reason=path[5:].split(": ", 1)[-1]))
            continue
          per_proc = [r["us"][f"{nbytes}:{algo}"] for r in results]
          us = statistics.median(per_proc)
          records.append({**rec, "status": "ok", "jit_us": us,
                          "jit_us_per_process": per_proc, "floor_us": floor,
                          "above_floor_us": us - floor, "mps": workers[0].mps,
                          "path": path})
  return records


# --- summary, table, plot -------------------------------------------------------------

BARRIER_BASELINES = {"oneshot_barrier": ("oneshot_ll", "oneshot_sentinel"),
                     "twoshot_barrier": ("twoshot_ll", "twoshot_sentinel")}


def summarize(records: list[dict], sol: dict | None) -> dict:
  """Ratios quoted in the notes, all from this run."""
  out = {}
  kernel = {(r["mode"], r["ranks"], r["dtype"], r["bytes"], r["algorithm"]): r["kernel_us"]
            for r in records if r["status"] == "ok" and "kernel_us" in r}
  above = {(r["mode"], r["ranks"], r["dtype"], r["bytes"], r["algorithm"]): r["above_floor_us"]
           for r in records if r["status"] == "ok" and "above_floor_us" in r}
  for (mode, n, dtype, nbytes, algo), us in sorted(above.items()):
    point = f"{mode} N={n} {dtype} {format_size(nbytes)} {algo}"
    if sol and mode == "virtual":
      out.setdefault("kernel_above_floor_over_sol", {})[point] = us / sol["sol_us"]
    if mode == "processes" and ("virtual", n, dtype, nbytes, algo) in above:
      out.setdefault("processes_above_floor_over_virtual", {})[point] = (
          us / above[("virtual", n, dtype, nbytes, algo)])
  for (mode, n, dtype, nbytes, algo), us in sorted(kernel.items()):
    point = f"{mode} N={n} {dtype} {format_size(nbytes)}"
    if algo in BARRIER_BASELINES and nbytes <= 4096:
      free = [kernel[(mode, n, dtype, nbytes, a)] for a in BARRIER_BASELINES[algo]
              if (mode, n, dtype, nbytes, a) in kernel]
      if free:
        out.setdefault(f"{algo}_over_best_barrier_free", {})[point] = us / min(free)
  return out


def format_pivot(records: list[dict]) -> str:
  """Kernel time per call, one row per size and one column per algorithm, for
  each (mode, N, dtype); the last column is what ``auto`` chose."""
  lines = []
  panels = sorted({(r["mode"], r["ranks"], r["dtype"]) for r in records
                   if "kernel_us" in r})
  for mode, n, dtype in panels:
    rows = [r for r in records if (r["mode"], r["ranks"], r["dtype"]) == (mode, n, dtype)]
    algos = [a for a in dict.fromkeys(r["algorithm"] for r in rows) if a != "auto"]
    lines.append(f"kernel us per call, {mode}, N={n}, {dtype}")
    head = f"{'size':>10s} " + " ".join(f"{a[:16]:>16s}" for a in algos) + "  auto ->"
    lines += [head, "-" * len(head)]
    for nbytes in sorted({r["bytes"] for r in rows}):
      at = {r["algorithm"]: r for r in rows if r["bytes"] == nbytes}
      cells = []
      for a in algos:
        r = at.get(a)
        cells.append(f"{r['kernel_us']:16.2f}" if r and "kernel_us" in r else f"{'-':>16s}")
      auto = at.get("auto", {}).get("auto_choice", "")
      lines.append(f"{format_size(nbytes):>10s} " + " ".join(cells) + f"  {auto}")
    lines.append("")
  return "\n".join(lines)


def format_table(records: list[dict], sol: dict | None, args=None) -> str:
  lines = []
  if sol:
    lines.append(f"speed of light on {sol['device']}: L2 round trip (one __threadfence()) "
                 f"{sol['l2_rtt_us']:.3f} us, "
                 f"ping-pong one way {sol['pingpong_one_way_us']:.3f} us, "
                 f"SoL {sol['sol_us']:.3f} us")
    lines.append(f"  FFI custom-call floor {sol['ffi_call_floor_us']:.2f} us/call "
                 f"({sol.get('ffi_call_floor_method', '')})")
    for n, v in sol.get("graph_node_floor_us", {}).items():
      lines.append(f"  CUDA-graph node floor, {n} virtual ranks: {v:.2f} us/call")
    for pair, v in sol.get("pairs", {}).items():
      lines.append(f"  GPU pair {pair}: ping-pong one way {v['pingpong_one_way_us']:.3f} us, "
                   f"SoL {v['sol_us']:.3f} us")
  colls = sorted({r.get("collective", "all_reduce") for r in records})
  if colls:
    lines.append(f"collective: {', '.join(colls)}")
  lines.append("kernel us: virtual ranks, CUDA graph of many calls; per call us: jitted chain, "
               + (steady_method(args) if args else "steady state")
               + "; above floor: minus the graph-node floor (virtual) or the custom-call floor "
               "of the same chain (local, processes); x SoL: above floor / SoL")
  header = f"{'mode':9s} {'N':>2s} {'dtype':9s} {'size':>10s} {'algorithm':20s} " \
           f"{'kernel us':>9s} {'per call':>8s} {'above fl':>8s} {'x SoL':>6s} " \
           f"{'psum us':>8s} {'vs psum':>7s}  note"
  lines += [header, "-" * len(header)]
  skipped = {}
  for r in records:
    if r["status"] != "ok":
      key = (r["mode"], r["ranks"], r["algorithm"], r.get("reason", ""))
      skipped.setdefault(key, []).append(r["bytes"])
      continue

    def num(key, fmt="{:.2f}"):
      return fmt.format(r[key]) if key in r else "-"
    xsol = (f"{r['above_floor_us'] / sol['sol_us']:.1f}"
            if sol and "above_floor_us" in r else "-")
    note = f"auto -> {r['auto_choice']}" if "auto_choice" in r else r.get("path", "")
    lines.append(f"{r['mode']:9s} {r['ranks']:>2d} {r['dtype']:9s} {format_size(r['bytes']):>10s} "
                 f"{r['algorithm']:20s} {num('kernel_us'):>9s} {num('jit_us'):>8s} "
                 f"{num('above_floor_us'):>8s} {xsol:>6s} {num('psum_jit_us'):>8s} "
                 f"{num('speedup_vs_psum', '{:.2f}x'):>7s}  {note}")
  for (mode, n, algo, reason), sizes in skipped.items():
    lines.append(f"not measured: {mode} N={n} {algo} at {len(sizes)} sizes "
                 f"({format_size(min(sizes))}..{format_size(max(sizes))}): {reason}")
  return "\n".join(lines)


def plot(records: list[dict], sol: dict | None, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  panels = sorted({(r["mode"], r["ranks"], r["dtype"]) for r in records})
  fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
  for ax, (mode, n, dtype) in zip(axes[0], panels):
    rows = [r for r in records if (r["mode"], r["ranks"], r["dtype"]) == (mode, n, dtype)
            and r["status"] == "ok"]
    for algo in sorted({r["algorithm"] for r in rows}):
      pts = sorted((r["bytes"], r) for r in rows if r["algorithm"] == algo)
      xs = [b for b, _ in pts]
      if any("kernel_us" in r for _, r in pts):
        ax.plot(xs, [r.get("kernel_us", math.nan) for _, r in pts], marker="o",
                label=f"{algo} kernel")
      if mode != "virtual" and any("jit_us" in r for _, r in pts):
        ax.plot(xs, [r.get("jit_us", math.nan) for _, r in pts], marker="x", linestyle="--",
                label=f"{algo} jitted per call")
    if sol:
      ax.axhline(sol["sol_us"], color="k", linestyle=":", label=f"SoL {sol['sol_us']:.2f} us")
      floor = sol.get("graph_node_floor_us", {}).get(str(n))
      if mode == "virtual" and floor is not None:
        ax.axhline(floor + sol["sol_us"], color="gray", linestyle="-.",
                   label=f"graph floor + SoL {floor + sol['sol_us']:.2f} us")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message bytes per rank")
    ax.set_ylabel("microseconds per call")
    ax.set_title(f"{mode}, N={n}, {dtype}" + (f" ({sol['device']})" if sol else ""))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def report(info: dict, args: argparse.Namespace, sol: dict | None, records: list[dict]) -> dict:
  """The JSON document a run writes."""
  config = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
  return {"machine": info, "config": config, "sol": sol,
          "summary": summarize(records, sol), "results": records}


def main(argv=None) -> int:
  os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
  args = parse_args(argv)
  import jax

  from jaxll._ext import ext
  try:
    gpus = jax.devices("cuda")
  except RuntimeError:
    gpus = []
  reason = None
  if not gpus:
    reason = (f"JAX sees no CUDA GPU (backend: {jax.default_backend()}); there is nothing "
              "to measure. Run it on a machine with an NVIDIA GPU and jax's CUDA plugin.")
  elif ext is None:
    from jaxll import _ext
    reason = f"{_ext.NO_KERNELS_REASON}; there is nothing to measure."
  if reason is not None:
    print("jaxll.bench: " + reason)
    if args.json:  # a report that says why it holds no measurement, not no file
      with open(args.json, "w") as f:
        json.dump({"measured": False, "reason": reason, "records": []}, f, indent=1)
      print(f"wrote {args.json} (no measurements)")
    return 0

  n_virtual = len([a for a in args.algorithms if a != "xla"])
  local_counts = local_gpu_counts(args, len(gpus))
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
  print(f"jaxll.bench on {info['gpu_count']} x {info['gpu']} (driver {info['driver']}, "
        f"jax {info['jax']}, {info['nccl'] or 'NCCL version unknown'})", flush=True)
  sol = None if args.no_sol else measure_sol(args)
  records = []
  if "virtual" in args.mode:
    for n in args.ranks:
      records += bench_virtual(args, n, progress)
  if "local" in args.mode:
    records += bench_local(args, progress, gpus)
  if "processes" in args.mode:
    records += bench_processes(args, progress)
  print(file=sys.stderr)
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
