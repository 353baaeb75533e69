"""The crossover table of all_gather / psum_scatter(algorithm="auto") between
the LL16 and the sentinel kernel, from benchmarks/gather_scatter.py JSONs:

  python benchmarks/gather_scatter.py --dtype float32 --sizes 1024 4096 ... --json f32.json
  python benchmarks/gather_scatter.py --dtype bfloat16 --sizes 1024 4096 ... --json bf16.json
  python benchmarks/tune_gather_scatter.py f32.json bf16.json --out src/jaxll/tuning/gather_scatter.json

writes the table that jaxll.choice reads (printed without --out): for each
collective, element width (4 or 2 bytes) and group size measured, the smallest
measured piece size (bytes per rank) at which the sentinel kernel is faster
than LL16 by more than --margin and from which it is nowhere slower by more
than the margin; null where no such size exists (LL16 throughout).
"""
from __future__ import annotations

import argparse
import json

WIDTH = {"float32": 4, "bfloat16": 2, "float16": 2}


def crossover(points: list[tuple[int, float, float]], margin: float) -> int | None:
  """points: (bytes, LL16 us, sentinel us), any order."""
  points = sorted(points)
  for i, (b, ll, sen) in enumerate(points):
    if sen * (1 + margin) < ll and all(s <= l * (1 + margin) for _, l, s in points[i:]):
      return b
  return None


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("json", nargs="+")
  p.add_argument("--margin", type=float, default=0.05)
  p.add_argument("--source", default="kernel time minus the CUDA-graph floor on virtual ranks "
                 "(benchmarks/gather_scatter.py), reduced by benchmarks/tune_gather_scatter.py",
                 help="what the table was measured on (name the GPU)")
  p.add_argument("--out", help="write the table here (default: print it)")
  opts = p.parse_args()
  points: dict = {}
  for path in opts.json:
    with open(path) as f:
      for r in json.load(f)["rows"]:
        key = (r["collective"], WIDTH[r.get("dtype", "float32")], r["ranks"])
        points.setdefault(key, []).append((r["bytes"], r["oneshot_ll_us"], r["oneshot_sentinel_us"]))
  table: dict = {}
  for (collective, width, ranks), v in sorted(points.items()):
    table.setdefault(collective, {}).setdefault(str(width), {})[str(ranks)] = crossover(v, opts.margin)
  text = json.dumps({"source": opts.source, "sentinel_from_bytes": table}, indent=1) + "\n"
  if opts.out:
    with open(opts.out, "w") as f:
      f.write(text)
  else:
    print(text, end="")


if __name__ == "__main__":
  main()
