"""Builds jaxll's auto table (src/jaxll/tuning/all_reduce.json) from benchmark measurements.

  python -m jaxll.tools.bench --mode virtual --ranks 2 4 8 --dtypes float32 bfloat16 \
      --algorithms oneshot_ll oneshot_sentinel twoshot_ll twoshot_sentinel \
      --json sweep.json
  python benchmarks/tune_auto.py sweep.json [more.json ...] --out src/jaxll/tuning/all_reduce.json

Inputs may also be benchmarks/fixed_cost.py JSONs (their float32 kernel rows).

For every (group size, dtype) measured, each size's candidates (algorithms
``auto`` may pick) are ranked by median kernel time; consecutive sizes with the
same ranking share a row, and a row reaches up to the geometric mean of its last
size and the next measured one. A size keeps the previous size's winner while
that one is within ``--margin`` (5%) of the fastest, so noise does not flip rows. XLA's all-reduce cannot run on virtual ranks,
so the crossover to it (``--xla-above``) is an input, not a measurement, until
multi-GPU runs measure it; the table's "source" says so.

With ``--from-local`` the table comes from local-mode runs on real GPUs instead
(``python -m jaxll.tools.bench --mode local --gpus 2 4 8 ...``, which times every
algorithm and XLA's all-reduce as jitted per-call time side by side): kernels
are ranked by that time, and each group size's crossover to XLA is measured:
XLA serves the sizes from the first one after which it is fastest at every
measured size (the bound sits halfway, geometrically, below it). Smaller sizes
where XLA is faster by more than the margin are printed as warnings, since auto
is slower than psum there.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys


def _times(records: list[dict], mode: str, metric: str, names) -> dict:
  """{(ranks, dtype): {bytes: {algorithm: time}}} of `mode` all-reduce records
  measured with `metric`, for the algorithms in `names`."""
  times: dict[tuple[int, str], dict[int, dict[str, float]]] = {}
  for r in records:
    if (r.get("mode", "virtual") != mode or r.get("status") != "ok" or metric not in r
        or r["algorithm"] not in names or r.get("collective", "all_reduce") != "all_reduce"):
      continue
    times.setdefault((r["ranks"], r["dtype"]), {}).setdefault(r["bytes"], {})[
        r["algorithm"]] = r[metric]
  return times


def _eligible() -> set[str]:
  from jaxll import algorithms  # the installed jaxll (no GPU needed)
  return {n for n, s in algorithms.SPECS.items() if s.auto and s.code}


def build_table(records: list[dict], xla_above: dict[str, int], note: str,
                margin: float = 0.0, mode: str = "virtual", metric: str = "kernel_us") -> dict:
  times = _times(records, mode, metric, _eligible())
  tables: dict[str, dict[str, list]] = {}
  for (n, dtype), by_size in sorted(times.items()):
    sizes = sorted(by_size)
    rows: list[list] = []
    for i, size in enumerate(sizes):
      t = by_size[size]
      ranked = sorted(t, key=t.get)
      if rows and margin > 0:
        # Keep the previous size's winner while it is within `margin` of the
        # fastest: differences that small are run-to-run noise, not a crossover.
        prev = rows[-1][1][0]
        if prev in t and t[prev] <= (1 + margin) * t[ranked[0]]:
          ranked = [prev] + [a for a in ranked if a != prev]
      upper = (1 << 62) if i + 1 == len(sizes) else int(math.sqrt(size * sizes[i + 1]))
      if rows and rows[-1][1] == ranked:
        rows[-1][0] = upper
      else:
        rows.append([upper, ranked])
    tables.setdefault(str(n), {})[dtype] = rows
  return {"source": note, "xla_above_bytes": xla_above, "tables": tables}


def measured_crossover(records: list[dict], margin: float = 0.05) -> tuple[dict, list[str]]:
  """From local-mode records: per group size, the bytes per rank above which
  auto hands a call to XLA (the smallest over dtypes), and warnings for sizes
  below it where XLA is faster than every kernel by more than `margin`."""
  from jaxll import algorithms
  eligible = _eligible()
  times = _times(records, "local", "jit_us", eligible | {algorithms.XLA})
  above: dict[str, int] = {}
  warnings = []
  for (n, dtype), by_size in sorted(times.items()):
    sizes = [b for b in sorted(by_size)
             if algorithms.XLA in by_size[b] and set(by_size[b]) & eligible]
    if not sizes:
      continue
    best = {b: min(t for a, t in by_size[b].items() if a in eligible) for b in sizes}
    xla_wins = [by_size[b][algorithms.XLA] < best[b] for b in sizes]
    k = len(sizes)
    while k > 0 and xla_wins[k - 1]:
      k -= 1
    if k == len(sizes):
      bound = 1 << 62  # a kernel is fastest at the largest size measured
    elif k == 0:
      bound = 0
    else:
      bound = int(math.sqrt(sizes[k - 1] * sizes[k]))
    above[str(n)] = min(above.get(str(n), bound), bound)
    for b in sizes[:k]:
      if by_size[b][algorithms.XLA] * (1 + margin) < best[b]:
        warnings.append(f"N={n} {dtype} {b} B: XLA {by_size[b][algorithms.XLA]:.2f} us, "
                        f"best kernel {best[b]:.2f} us (auto is slower than psum here)")
  return above, warnings


def dumps_table(table: dict) -> str:
  """JSON with one row per line, so the table reads as a table."""
  out = ["{", f' "source": {json.dumps(table["source"])},',
         f' "xla_above_bytes": {json.dumps(table["xla_above_bytes"])},', ' "tables": {']
  groups = list(table["tables"].items())
  for gi, (n, per_dtype) in enumerate(groups):
    out.append(f'  "{n}": {{')
    dtypes = list(per_dtype.items())
    for di, (dtype, rows) in enumerate(dtypes):
      out.append(f'   "{dtype}": [')
      for ri, row in enumerate(rows):
        out.append(f"    {json.dumps(row)}" + ("," if ri + 1 < len(rows) else ""))
      out.append("   ]" + ("," if di + 1 < len(dtypes) else ""))
    out.append("  }" + ("," if gi + 1 < len(groups) else ""))
  out += [" }", "}", ""]
  text = "\n".join(out)
  assert json.loads(text) == json.loads(json.dumps(table))
  return text


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("inputs", nargs="+", help="JSON files written by python -m jaxll.tools.bench --json")
  p.add_argument("--out", required=True, help="where to write the table")
  p.add_argument("--margin", type=float, default=0.05,
                 help="keep the previous size's winner while within this fraction of the "
                      "fastest (default 0.05)")
  p.add_argument("--xla-above", type=int, default=1 << 20,
                 help="bytes per rank above which auto uses XLA (default 1 MiB; not measured "
                      "on virtual ranks; with --from-local only for group sizes not measured)")
  p.add_argument("--from-local", action="store_true",
                 help="rank by local-mode jitted per-call time on real GPUs and measure the "
                      "crossover to XLA (see the module docstring)")
  args = p.parse_args(argv)
  records, machines = [], []
  for path in args.inputs:
    with open(path) as f:
      doc = json.load(f)
    if "results" in doc:
      records += doc["results"]
      m = doc.get("machine", {})
      machines.append(f"{m.get('gpu_count')} x {m.get('gpu')}, driver {m.get('driver')}, "
                      f"jax {m.get('jax')}")
    else:  # benchmarks/fixed_cost.py: virtual-rank kernel times, float32
      # (a launch per rank, as a host with a GPU per rank runs them)
      records += [dict(r, mode="virtual", dtype="float32", status="ok") for r in doc["kernel"]
                  if r.get("launch", "streams") == "streams"]
  inputs = ", ".join(os.path.basename(x) for x in args.inputs)
  machine = "; ".join(sorted(set(machines)))
  if args.from_local:
    measured, warnings = measured_crossover(records, args.margin)
    for w in warnings:
      print("warning:", w)
    note = (f"jitted per-call time on real GPUs, local mode ({machine}) from {inputs} by "
            f"benchmarks/tune_auto.py --from-local; crossover to XLA measured for N in "
            f"{sorted(int(n) for n in measured)}")
    table = build_table(records, {"default": args.xla_above, **measured}, note, args.margin,
                        mode="local", metric="jit_us")
  else:
    note = (f"kernel time on virtual ranks ({machine}) from {inputs} by benchmarks/tune_auto.py; "
            f"the crossover to XLA ({args.xla_above} bytes) is not measured on virtual ranks")
    table = build_table(records, {"default": args.xla_above}, note, args.margin)
  if not table["tables"]:
    p.error(f"no usable {'local' if args.from_local else 'virtual'}-mode timings in the inputs")
  with open(args.out, "w") as f:
    f.write(dumps_table(table))
  for n, per_dtype in table["tables"].items():
    for dtype, rows in per_dtype.items():
      print(f"N={n} {dtype}: " + ", ".join(f"<= {r[0]} B: {r[1][0]}" for r in rows))
  print(f"XLA above (bytes per rank): {table['xla_above_bytes']}")
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
