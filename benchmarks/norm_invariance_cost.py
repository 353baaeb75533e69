"""What the fused kernel's one order of a row's squares costs: the fused
all-reduce + RMSNorm kernel's time per call on this install (the row's squares
in the tree order of ffi/kernels/square_tree.cuh, the same bits whatever the
cut) beside a float-sum build of the same source (JAXLL_NORM_FLOAT_SUM=1: the
squares in the cut's order, rows cut freely), on N virtual ranks of GPU 0.

Each build runs in a process of its own (``--float-build``: the directory the
float-sum build is installed in, as ``pip install --target``), the two taking
turns --alternations times; each turn times every (N, tokens, exchange) as
CUDA graphs of back-to-back calls, all ranks one launch a call
(jaxll.tools.testing.rmsnorm_kernel_time_us, minus the graph floor of an
empty kernel). Kept: the median over the turns of each turn's median.
``--also NAME=DIR`` times another install beside them, in the same turns (an
earlier commit's build, say), as a column of its own.

  JAXLL_NORM_FLOAT_SUM=1 pip install --no-build-isolation --no-deps --target /tmp/float .
  python benchmarks/norm_invariance_cost.py --float-build /tmp/float --ranks 2,8 \\
      --tokens 1,2,4,8,16,64,128,256 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def child(opts) -> None:
  """One turn of one build: every case's kernel time, as JSON on stdout."""
  import jax

  import jaxll
  from jaxll.tools import testing

  rows = []
  for n in opts.ranks:
    floor = statistics.median(testing.graph_floor_us(n, iters=opts.iters, reps=opts.reps,
                                                     one_launch=True))
    for exchange in opts.exchanges:
      for tokens in opts.tokens:
        plan = testing.rmsnorm_plan(n, tokens, opts.hidden, dtype="bfloat16", protocol=exchange)
        if not plan["blocks"]:
          continue  # (that exchange cannot serve the call)
        try:
          times = testing.rmsnorm_kernel_time_us(n, tokens, opts.hidden, dtype="bfloat16",
                                                 iters=opts.iters, reps=opts.reps,
                                                 protocol=exchange, one_launch=True)
        except ValueError:
          continue  # (that exchange cannot serve the call)
        rows.append({"ranks": n, "tokens": tokens, "hidden": opts.hidden, "exchange": exchange,
                     "plan": {k: plan[k] for k in ("exchange", "segments", "rows_at_once",
                                                   "cluster", "threads", "waves")},
                     "kernel_us": statistics.median(times) - floor, "floor_us": floor})
  json.dump({"device": jax.devices()[0].device_kind, "jax": jax.__version__,
             "jaxll": os.path.dirname(jaxll.__file__), "rows": rows}, sys.stdout)


def run_turn(site: str | None, argv: list[str]) -> dict:
  env = dict(os.environ)
  if site:
    env["PYTHONPATH"] = site + os.pathsep + env.get("PYTHONPATH", "")
  out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *argv], env=env,
                       capture_output=True, text=True, check=False)
  if out.returncode:
    raise SystemExit(f"a turn failed ({'float build' if site else 'this install'}):\n"
                     f"{out.stderr[-4000:]}")
  return json.loads(out.stdout)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--float-build", help="directory of the JAXLL_NORM_FLOAT_SUM=1 install")
  p.add_argument("--ranks", default="2,8")
  p.add_argument("--tokens", default="1,2,4,8,16,64,128,256")
  p.add_argument("--hidden", type=int, default=8192)
  p.add_argument("--exchanges", default="auto,ll",
                 help="all_reduce_rmsnorm protocols (auto: the one the table takes)")
  p.add_argument("--alternations", type=int, default=3)
  p.add_argument("--iters", type=int, default=200, help="calls per CUDA graph")
  p.add_argument("--reps", type=int, default=10, help="graph replays per turn")
  p.add_argument("--also", action="append", default=[], metavar="NAME=DIR",
                 help="another install to time in the same turns (a column of its own)")
  p.add_argument("--json")
  p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  opts = p.parse_args()
  if opts.child:
    opts.ranks = [int(v) for v in opts.ranks.split(",")]
    opts.tokens = [int(v) for v in opts.tokens.split(",")]
    opts.exchanges = opts.exchanges.split(",")
    child(opts)
    return
  if not opts.float_build:
    p.error("--float-build is required")
  argv = [f"--ranks={opts.ranks}", f"--tokens={opts.tokens}", f"--hidden={opts.hidden}",
          f"--exchanges={opts.exchanges}", f"--iters={opts.iters}", f"--reps={opts.reps}"]
  sites = {"tree": None, "float": opts.float_build}
  for item in opts.also:
    name, _, path = item.partition("=")
    if not name or not path or name in sites:
      p.error(f"--also takes NAME=DIR with a new name, got {item!r}")
    sites[name] = path
  turns = {name: [] for name in sites}
  for _ in range(opts.alternations):
    for name, site in sites.items():
      turns[name].append(run_turn(site, argv))

  def key(r):
    return r["ranks"], r["tokens"], r["exchange"]

  rows = []
  for r in turns["tree"][0]["rows"]:
    k = key(r)
    tree = [x["kernel_us"] for t in turns["tree"] for x in t["rows"] if key(x) == k]
    flt = [x["kernel_us"] for t in turns["float"] for x in t["rows"] if key(x) == k]
    float_plan = next((x["plan"] for x in turns["float"][0]["rows"] if key(x) == k), None)
    if not flt:
      continue
    t, f = statistics.median(tree), statistics.median(flt)
    row = {"ranks": k[0], "tokens": k[1], "hidden": opts.hidden, "exchange": k[2],
           "plan": r["plan"], "float_plan": float_plan, "tree_us": t, "float_us": f,
           "cost_us": t - f, "cost_pct": 100 * (t - f) / f, "tree_turns_us": tree,
           "float_turns_us": flt}
    for name in list(sites)[2:]:
      other = [x["kernel_us"] for t_ in turns[name] for x in t_["rows"] if key(x) == k]
      row[f"{name}_us"] = statistics.median(other) if other else None
    rows.append(row)
  head = turns["tree"][0]
  print(f"# {' '.join(sys.argv)} ({head['device']}, jax {head['jax']}; kernel time above the "
        f"graph floor, bf16, median of {opts.alternations} turns)")
  extra = list(sites)[2:]
  print("| N | tokens x hidden | exchange (plan) | tree order µs | float sum µs | cost µs | cost % |"
        + "".join(f" {name} µs |" for name in extra))
  print("| --- | --- | --- | --- | --- | --- | --- |" + " --- |" * len(extra))
  for r in rows:
    plan = r["plan"]
    same = "" if r["float_plan"] == plan else ", float build cut otherwise"
    print(f"| {r['ranks']} | {r['tokens']} x {r['hidden']} | {r['exchange']} ({plan['exchange']}, "
          f"{plan['segments']} seg, {plan['rows_at_once']} rows at once{same}) | "
          f"{r['tree_us']:.2f} | {r['float_us']:.2f} | {r['cost_us']:+.2f} | "
          f"{r['cost_pct']:+.1f} |" + "".join(
              f" {r[name + '_us']:.2f} |" if r[name + "_us"] is not None else " - |"
              for name in extra))
  if opts.json:
    with open(opts.json, "w") as fh:
      json.dump({"device": head["device"], "jax": head["jax"], "command": " ".join(sys.argv),
                 "rows": rows}, fh, indent=1)


if __name__ == "__main__":
  main()
