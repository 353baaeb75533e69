"""One process of the tensor-parallel model check (run by jaxll.tools.launch): the
model of tests/tp_model.py (forward, gradient, decode loop) over a
(dp, tp) = (1, N) mesh whose tp ranks are the launched processes, written with
jaxll's region helpers and with psum inside jaxll.route_psums. Reports, per
program, the path of every tp call site (on GPU each must be a jaxll kernel:
XLA's all-reduce cannot run several ranks on one GPU anyway) and the largest
error of this process's shards against the float64 reference.

  python tp_block.py [--runs 50]
  python tp_block.py --platform cpu ...   (a dry run on CPU devices: XLA everywhere)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

parser = argparse.ArgumentParser()
parser.add_argument("--runs", type=int, default=50, help="runs of each compiled program")
parser.add_argument("--platform", choices=("gpu", "cpu"), default="gpu")
opts = parser.parse_args()
GPU = opts.platform == "gpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

if not GPU:
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_cpu_collectives_implementation", "gloo")

from jaxll.tools import launch  # noqa: E402

pid = launch.init_worker()
jax.config.update("jax_default_matmul_precision", "highest")  # f32 matmuls, not TF32
import jaxll  # noqa: E402
import tp_model as tm  # noqa: E402

n = jax.device_count()
mesh = jax.make_mesh((1, n), ("dp", "tp"))
w_in, w_out, x = tm.init(seed=1)
want = {"forward": tm.ref_forward(w_in, w_out, x), "grad": tm.ref_grad(w_in, w_out, x),
        "decode": tm.ref_decode(w_in, w_out, x)}
report = {"pid": pid, "devices": [d.id for d in jax.local_devices()], "errors": [],
          "paths": {}, "max_error": {}}
def max_error(got, ref):
  """Largest |got - ref| / (1 + |ref|) over this process's shards; inf where a
  value is not finite (NaN: what a rank that gave up writes)."""
  worst = 0.0
  for shard in got.addressable_shards:
    data = np.asarray(shard.data, np.float64)
    if not np.isfinite(data).all():
      return float("inf")
    diff = np.abs(data - ref[shard.index])
    worst = max(worst, float((diff / (1 + np.abs(ref[shard.index]))).max()))
  return worst


args = tm.place(mesh, w_in, w_out, x)
for variant in ("helpers", "route"):
  for name, f in zip(("forward", "grad", "decode"), tm.programs(mesh, variant)):
    key = f"{variant}/{name}"
    launch.progress(key)
    tp = tm.tp_sites(jaxll.explain(f, *args))
    report["paths"][key] = [s.algorithm for s in tp]
    if not tp:
      report["errors"].append(f"{key}: no tp call site")
    elif GPU and any(s.algorithm == "xla" for s in tp):
      report["errors"].append(f"{key}: tp sites on XLA: {[(s.site, s.reason) for s in tp]}")
    compiled = f.lower(*args).compile()
    launch.barrier()  # every process has its program loaded before any kernel spins
    for _ in range(opts.runs):
      out = compiled(*args)
    errs = [max_error(g, r) for g, r in zip(jax.tree.leaves(out), jax.tree.leaves(want[name]))]
    report["max_error"][key] = max(errs)
    if not max(errs) <= 1e-4:
      report["errors"].append(f"{key}: error {max(errs):.2e} against the float64 reference")

try:
  jaxll.check_errors()
except Exception as e:  # (reported, so the test names it, rather than a bare exit)
  report["errors"].append(f"check_errors: {type(e).__name__}: {e}")
launch.report(report)
