"""A benchmark run's summary, table, plot and JSON report."""

from __future__ import annotations

import argparse
import math

from jaxll.tools.bench.timing import steady_method
from jaxll.tools.bench.units import format_size


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
