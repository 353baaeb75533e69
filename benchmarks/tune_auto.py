"""Builds jaxll's auto table (jaxll/auto_table.json) from benchmark measurements.

  python -m jaxll.bench --mode virtual --ranks 2 4 8 --dtypes float32 bfloat16 \
      --algorithms oneshot_ll oneshot_sentinel twoshot_ll twoshot_sentinel \
      --json sweep.json
  python benchmarks/tune_auto.py sweep.json [more.json ...] --out jaxll/auto_table.json

For every (group size, dtype) measured, each size's candidates (algorithms
``auto`` may pick) are ranked by median kernel time; consecutive sizes with the
same ranking share a row, and a row reaches up to the geometric mean of its last
size and the next measured one. XLA's all-reduce cannot run on virtual ranks,
so the crossover to it (``--xla-above``) is an input, not a measurement, until
multi-GPU runs measure it; the table's "source" says so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys


def build_table(records: list[dict], xla_above: dict[str, int], note: str) -> dict:
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
  from jaxll import algorithms  # noqa: E402  (pure Python; no GPU needed)

  eligible = {n for n, s in algorithms.SPECS.items() if s.auto and s.code}
  times: dict[tuple[int, str], dict[int, dict[str, float]]] = {}
  for r in records:
    if r.get("status") != "ok" or "kernel_us" not in r or r["algorithm"] not in eligible:
      continue
    times.setdefault((r["ranks"], r["dtype"]), {}).setdefault(r["bytes"], {})[
        r["algorithm"]] = r["kernel_us"]
  tables: dict[str, dict[str, list]] = {}
  for (n, dtype), by_size in sorted(times.items()):
    sizes = sorted(by_size)
    rows: list[list] = []
    for i, size in enumerate(sizes):
      ranked = sorted(by_size[size], key=by_size[size].get)
      upper = (1 << 62) if i + 1 == len(sizes) else int(math.sqrt(size * sizes[i + 1]))
      if rows and rows[-1][1] == ranked:
        rows[-1][0] = upper
      else:
        rows.append([upper, ranked])
    tables.setdefault(str(n), {})[dtype] = rows
  return {"source": note, "xla_above_bytes": xla_above, "tables": tables}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("inputs", nargs="+", help="JSON files written by python -m jaxll.bench --json")
  p.add_argument("--out", required=True, help="where to write the table")
  p.add_argument("--xla-above", type=int, default=1 << 20,
                 help="bytes per rank above which auto uses XLA (default 1 MiB; not measured "
                      "on virtual ranks)")
  args = p.parse_args(argv)
  records, machines = [], []
  for path in args.inputs:
    with open(path) as f:
      doc = json.load(f)
    records += doc["results"]
    m = doc.get("machine", {})
    machines.append(f"{m.get('gpu_count')} x {m.get('gpu')}, driver {m.get('driver')}, "
                    f"jax {m.get('jax')}")
  note = (f"kernel time on virtual ranks ({'; '.join(sorted(set(machines)))}) from "
          f"{', '.join(os.path.basename(x) for x in args.inputs)} by benchmarks/tune_auto.py; "
          f"the crossover to XLA ({args.xla_above} bytes) is not measured on virtual ranks")
  table = build_table(records, {"default": args.xla_above}, note)
  if not table["tables"]:
    p.error("no usable virtual-mode kernel timings in the inputs")
  with open(args.out, "w") as f:
    json.dump(table, f, indent=1)
    f.write("\n")
  for n, per_dtype in table["tables"].items():
    for dtype, rows in per_dtype.items():
      print(f"N={n} {dtype}: " + ", ".join(f"<= {r[0]} B: {r[1][0]}" for r in rows))
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
