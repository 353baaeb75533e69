"""ppermute and all-to-all kernels on virtual ranks (one GPU): kernel time minus
the CUDA-graph floor per call, side by side in one run with the barrier
baselines and with jaxll's one-shot all-gather of the same bytes.

For each (N, bytes a peer gets) it measures, in --passes interleaved passes of
--reps graph replays (--iters calls each):
  ppermute ring    every rank sends to the next (LL16, sentinel, barrier)
  ppermute swap    ranks exchange in pairs, 2i <-> 2i+1 (LL16, barrier)
  all_to_all       a piece of `bytes` to every peer (LL16, sentinel, barrier)
  all_gather       jaxll's one-shot all-gather (LL16) of pieces of `bytes`:
                   every rank receives the same N-1 pieces an all-to-all
                   receives; the reference for both collectives
  ragged uniform   ragged_all_to_all (LL16): a slice of `bytes` to every peer
                   (rows of up to 256 bytes), as the all-to-all moves
  ragged skewed    the same bytes a rank, all to the next rank (each rank
                   receives N-1 slices' worth from one peer)
and keeps the median of all samples; the graph of empty kernels measured the
same way is the floor. The speed of light (on one GPU: 2 L2 round trips + one
remote store; jaxll.tools.bench.sol.probe_sol) is probed in the same run.

  python benchmarks/exchange.py --json out.json
"""
from __future__ import annotations

import argparse
import json
import statistics

import jax
import numpy as np

from jaxll.tools import testing as jt
from jaxll.tools.bench.sol import probe_sol

# (column, collective, algorithm, permutation kind)
COLUMNS = (
    ("ring_ll", "ppermute", "oneshot_ll", "ring"),
    ("ring_sentinel", "ppermute", "oneshot_sentinel", "ring"),
    ("ring_barrier", "ppermute", "oneshot_barrier", "ring"),
    ("swap_ll", "ppermute", "oneshot_ll", "swap"),
    ("swap_barrier", "ppermute", "oneshot_barrier", "swap"),
    ("a2a_ll", "all_to_all", "oneshot_ll", None),
    ("a2a_sentinel", "all_to_all", "oneshot_sentinel", None),
    ("a2a_barrier", "all_to_all", "oneshot_barrier", None),
    ("gather_ll", "all_gather", "oneshot_ll", None),
    ("ragged_ll", "ragged", "oneshot_ll", "uniform"),
    ("ragged_skew_ll", "ragged", "oneshot_ll", "skewed"),
)


def _ragged_case(kind: str, n: int, nbytes: int, itemsize: int):
  """(operand rows, output rows, row elements, (N, 4, N) sizes) of a ragged
  all-to-all moving `nbytes` to every peer (uniform) or the same bytes a rank
  all to the next rank (skewed), in rows of up to 256 bytes."""
  row_bytes = min(nbytes, 256)
  row_elems = max(1, row_bytes // itemsize)
  rows = max(1, nbytes // (row_elems * itemsize))
  send = np.full((n, n), rows, np.int32)
  if kind == "skewed":
    send[:] = 0
    for r in range(n):
      send[r, (r + 1) % n] = rows * (n - 1) if n > 1 else rows
  sizes = np.zeros((n, 4, n), np.int32)
  for r in range(n):
    sizes[r, 0] = np.concatenate([[0], np.cumsum(send[r])[:-1]])
    sizes[r, 1] = send[r]
    sizes[r, 3] = send[:, r]
  for d in range(n):
    sizes[:, 2, d] = np.concatenate([[0], np.cumsum(send[:, d])[:-1]])
  return int(send.sum(1).max()), int(send.sum(0).max()), row_elems, sizes


def _perm(kind: str, n: int):
  if kind == "ring":
    return [(i, (i + 1) % n) for i in range(n)]
  return [(i, i ^ 1) for i in range(n)]


def _time(col, n: int, nbytes: int, opts) -> list[float]:
  _, coll, algorithm, kind = col
  kw = dict(dtype=opts.dtype, algorithm=algorithm, iters=opts.iters, reps=opts.reps)
  if coll == "all_gather":
    return jt.gather_scatter_time_us(n, nbytes, collective="all_gather", **kw)
  if coll == "ragged":
    rows, out_rows, row_elems, sizes = _ragged_case(kind, n, nbytes,
                                                    np.dtype(jax.numpy.dtype(opts.dtype)).itemsize)
    return jt.ragged_time_us(n, rows, out_rows, row_elems, sizes, **kw)
  return jt.exchange_time_us(n, nbytes, collective=coll,
                             perm=_perm(kind, n) if kind else None, **kw)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
  p.add_argument("--sizes", type=int, nargs="+",
                 default=[8, 64, 512, 4096, 32768, 262144, 1048576])
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
  p.add_argument("--iters", type=int, default=200)
  p.add_argument("--reps", type=int, default=7)
  p.add_argument("--passes", type=int, default=2)
  p.add_argument("--columns", nargs="+", choices=[c[0] for c in COLUMNS],
                 help="measure these columns only (default: all)")
  p.add_argument("--json")
  opts = p.parse_args()
  columns = [c for c in COLUMNS if not opts.columns or c[0] in opts.columns]
  dev = jax.devices("cuda")[0]
  sol = probe_sol(dev.local_hardware_id, opts.reps)
  names = [c[0] for c in columns]
  print(f"# ppermute / all_to_all kernels on {dev.device_kind}, jax {jax.__version__}, "
        f"{opts.dtype}, `bytes` a peer gets; kernel minus graph floor, us (median of "
        f"{opts.passes} x {opts.reps} replays of {opts.iters} calls); speed of light "
        f"{sol['sol_us']:.3f} us")
  print(f"{'N':>2} {'bytes':>8} " + " ".join(f"{c:>13}" for c in names))
  rows = []
  for n in opts.ranks:
    floor_samples = []
    for nbytes in opts.sizes:
      samples = {c[0]: [] for c in columns}
      for _ in range(opts.passes):
        floor_samples += jt.graph_floor_us(n, iters=opts.iters, reps=opts.reps)
        for col in columns:
          if col[3] == "swap" and n % 2:
            continue
          samples[col[0]] += _time(col, n, nbytes, opts)
      floor = statistics.median(floor_samples)
      row = {"ranks": n, "bytes": nbytes, "floor_us": floor, "sol_us": sol["sol_us"]}
      for name, s in samples.items():
        row[name] = statistics.median(s) - floor if s else None
      rows.append(row)
      print(f"{n:>2} {nbytes:>8} " + " ".join(
          f"{row[c]:>13.3f}" if row[c] is not None else f"{'-':>13}" for c in names),
          flush=True)
  if opts.json:
    with open(opts.json, "w") as f:
      json.dump({"device": dev.device_kind, "jax": jax.__version__, "dtype": opts.dtype,
                 "iters": opts.iters, "reps": opts.reps, "passes": opts.passes, "sol": sol,
                 "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
