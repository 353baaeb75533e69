"""The benchmark's modes: virtual ranks on one GPU (kernel time in CUDA graphs),
a mesh over local GPUs and jax.distributed processes sharing GPU 0 (jitted
per-call time in steady state)."""

from __future__ import annotations

import os
import statistics

from jaxll.tools.bench.timing import chain_step, steady_per_call_us


def _virtual_gather_scatter(args, n: int, dtype: str, count: int, algo: str) -> dict:
  """One virtual-mode point of --collective all_gather / psum_scatter: the
  kernel (auto: its choice) timed, or why not."""
  import jax
  import numpy as np

  from jaxll import choice, collective_common
  from jaxll.tools import testing as jt
  item = np.dtype(jax.numpy.dtype(dtype)).itemsize
  out = {}
  kernel = algo
  if algo == "auto":
    operand = count * item * (n if args.collective == "psum_scatter" else 1)
    kernel, why = choice.gather_scatter_auto(args.collective, n, operand,
                                             jax.numpy.dtype(dtype))
    out["auto_choice"] = kernel
    if kernel == "xla":
      return dict(out, status="n/a", reason=f"auto picks xla ({why}), which cannot run on "
                                             "virtual ranks")
  sentinel_dtypes = collective_common.SENTINEL_DTYPES
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

  from jaxll import algorithms, choice
  from jaxll.tools import testing as jt

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
          kernel, why = choice.choose_auto(n, count * item, np.dtype(jax.numpy.dtype(dtype)), "sum")
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


def bench_processes(args, progress) -> list[dict]:
  """N jax.distributed processes sharing GPU 0 (MPS where available), each
  timing the same chains as local mode (jaxll/tools/bench/worker.py)."""
  from jaxll import algorithms
  from jaxll.tools import launch

  worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
  names = [a for a in args.algorithms if a != algorithms.XLA]  # NCCL cannot share a GPU
  records = []
  for n in args.procs:
    for dtype in args.dtypes:
      progress({"mode": "processes", "ranks": n, "dtype": dtype, "bytes": args.sizes[0],
                "algorithm": "(all)"})
      workers = launch.run(
          worker, n, timeout=600, mps="auto", devices=["0"] * n,
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
