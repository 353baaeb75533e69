"""What deterministic mode costs, on N virtual ranks of one GPU: kernel times
per call (CUDA graphs of back-to-back calls, median of the repetitions, the
graph floor beside them) of

- the all-reduce above auto's crossover to XLA, where deterministic mode keeps
  a jaxll kernel: every reproducible kernel side by side, and which one the
  mode takes (XLA's all-reduce cannot run several ranks on one GPU: that
  comparison needs a host with several GPUs);
- the fused all-reduce + RMSNorm kernel at decode and prefill shapes, which
  deterministic mode serves at every size (run it on two builds to compare
  them: --label names the build in the output).

  python benchmarks/deterministic_cost.py --json out.json --label this-build
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import numpy as np  # noqa: E402

KERNELS = ("oneshot_ll", "oneshot_sentinel", "twoshot_ll", "twoshot_sentinel")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--ranks", default="2,4,8")
  ap.add_argument("--mib", default="1,2,4,16,64", help="all-reduce sizes, MiB per rank")
  ap.add_argument("--dtypes", default="float32,bfloat16")
  ap.add_argument("--shapes", default="1x8192,8x8192,64x8192,256x8192",
                  help="fused calls, tokens x hidden (bfloat16)")
  ap.add_argument("--skip-all-reduce", action="store_true")
  ap.add_argument("--reps", type=int, default=20)
  ap.add_argument("--label", default="")
  ap.add_argument("--json")
  args = ap.parse_args()

  import jax
  from jaxll import choice
  from jaxll.tools import testing as jt

  if not any(d.platform == "gpu" for d in jax.devices()):
    raise SystemExit("needs a CUDA GPU")
  med = statistics.median
  out = {"device": jax.devices()[0].device_kind, "label": args.label, "jax": jax.__version__,
         "all_reduce": [], "fused": [], "floor_us": {}}
  ranks = [int(r) for r in args.ranks.split(",")]
  for n in ranks:
    out["floor_us"][n] = med(jt.graph_floor_us(n, reps=args.reps))
  if not args.skip_all_reduce:
    print(f"{out['device']} {args.label}: all-reduce kernel time per call (us, median), "
          f"graph floor {out['floor_us']}")
    for n in ranks:
      for dtype in args.dtypes.split(","):
        for mib in (float(m) for m in args.mib.split(",")):
          nbytes = int(mib * 2 ** 20)
          chosen, _ = choice.choose_auto(n, nbytes, np.dtype(jax.numpy.dtype(dtype)), "sum",
                                         deterministic=True)
          auto, _ = choice.choose_auto(n, nbytes, np.dtype(jax.numpy.dtype(dtype)), "sum")
          row = {"n": n, "dtype": dtype, "bytes": nbytes, "deterministic": chosen, "auto": auto}
          for k in KERNELS:
            iters = max(5, min(200, (64 << 20) // max(nbytes, 1) // 4))
            row[k] = med(jt.kernel_time_us(n, nbytes, dtype=dtype, algorithm=k, iters=iters,
                                           reps=args.reps))
          out["all_reduce"].append(row)
          best = min(KERNELS, key=lambda k: row[k])
          print(f"  N={n} {dtype:8s} {mib:5g} MiB: " +
                "  ".join(f"{k} {row[k]:9.1f}" for k in KERNELS) +
                f"  | deterministic takes {chosen} ({row[chosen] / row[best]:.2f}x the "
                f"fastest, {best}); auto: {auto}")
  print(f"{out['device']} {args.label}: fused kernel time per call (us, median, bfloat16)")
  for n in ranks:
    for shape in args.shapes.split(","):
      tokens, hidden = (int(v) for v in shape.split("x"))
      plan = jt.rmsnorm_plan(n, tokens, hidden)
      t = med(jt.rmsnorm_kernel_time_us(n, tokens, hidden, reps=args.reps,
                                        iters=max(10, min(200, 4096 // tokens))))
      out["fused"].append({"n": n, "tokens": tokens, "hidden": hidden, "us": t,
                           "exchange": plan["exchange"], "segments": plan["segments"],
                           "cluster": plan["cluster"]})
      print(f"  N={n} {tokens}x{hidden}: {t:8.2f}  ({plan['exchange']}, {plan['segments']} "
            f"segments, cluster {plan['cluster']})")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  main()
