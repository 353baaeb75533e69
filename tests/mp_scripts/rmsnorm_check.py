"""One process of the fused all-reduce + residual + RMSNorm check (run by
jaxll.tools.launch; processes sharing one GPU): jaxll.all_reduce_rmsnorm with
algorithm="fused" (the one kernel) against the composition over the
one-shot LL all-reduce, for several shapes and dtypes (rows spanning several
LL16 regions included), followed by a plain all-reduce in the same program and
repeated. new_residual must be bitwise the composition's (the same rank-order
float32 sum and one rounding), normed within a rounding or two (the sum of
squares is reduced in another order than XLA's), every run the first run's bits.
algorithm="auto" must take the fused kernel exactly for the cases of at most
jaxll.choice.fused_auto_max_bytes (more where "fused" runs on the sentinel
exchange in a group of 2), with the bits of the path it took.
algorithm="fused_sentinel" (the kernel on the sentinel exchange) and
"fused_twoshot_sentinel" (the two-shot kernel) must serve every case but the
64 x 16384 one (beyond one round or one row-wave: refused with ValueError) with
the same checks as "fused", and the LL16 kernel's new_residual bits; in groups
of 8 a named exchange's refusal of another case is listed under "refused"
rather than failed (on one shared H100 with 8 processes: fused_sentinel and
fused_twoshot_sentinel at 64 x 16384, fused_sentinel at 16 x 8192 float16).

  python rmsnorm_check.py [--runs 10]
"""
import argparse

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--runs", type=int, default=10)
opts = parser.parse_args()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxll.tools import launch  # noqa: E402

pid = launch.init_worker()
import jaxll  # noqa: E402

n = jax.device_count()
mesh = jax.make_mesh((n,), ("tp",))
report = {"pid": pid, "errors": [], "cases": 0, "max_rel": {}, "refused": []}
CASES = [((1, 4096), jnp.bfloat16), ((7, 128), np.float32), ((3, 5120), np.float32),
         ((64, 16384), jnp.bfloat16), ((16, 8192), np.float16), ((5, 12), np.float32)]
TOL = {np.dtype(np.float32): 2e-6, np.dtype(jnp.bfloat16): 1.6e-2, np.dtype(np.float16): 2e-3}


def put(full, spec):
  sharding = NamedSharding(mesh, spec)
  idx = sharding.addressable_devices_indices_map(full.shape)
  return jax.make_array_from_single_device_arrays(
      full.shape, sharding, [jax.device_put(full[i], d) for d, i in idx.items()])


def check_runs(key, compiled, args, want, dtype):
  """Runs `compiled` opts.runs times: the first run's new_residual and the
  all-reduce after it bitwise the composition's (`want`), normed within the
  tolerance, every later run the first run's bits."""
  first = None
  bits = lambda a: a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)  # noqa: E731
  for _ in range(opts.runs):
    got = [np.asarray(o.addressable_data(0)) for o in compiled(*args)]
    if first is None:
      first = got
      if not np.array_equal(bits(got[1]), bits(want[1])):
        report["errors"].append(f"{key}: new_residual differs from the composition's")
      if not np.array_equal(bits(got[2]), bits(want[2])):
        report["errors"].append(f"{key}: the all-reduce after it differs")
      a, b = got[0].astype(np.float64), want[0].astype(np.float64)
      rel = float(np.max(np.abs(a - b) / (np.abs(b) + 1e-3)))
      report["max_rel"][key] = rel
      if rel > 2 * TOL[np.dtype(dtype)]:
        report["errors"].append(f"{key}: normed off by {rel:.2e} (relative)")
    elif not all(np.array_equal(g, f) for g, f in zip(got, first)):
      report["errors"].append(f"{key}: a run differs from the first")
      break


for (tokens, hidden), dtype in CASES:
  key = f"{tokens}x{hidden}/{np.dtype(dtype).name}"
  launch.progress(key)
  rng = np.random.default_rng(tokens * hidden)
  x = rng.standard_normal((n * tokens, hidden)).astype(dtype)
  res = rng.standard_normal((tokens, hidden)).astype(dtype)
  w = (1 + 0.1 * rng.standard_normal(hidden)).astype(dtype)

  def step(algorithm):
    def body(x, r, w):
      normed, new_res = jaxll.all_reduce_rmsnorm(x, r, w, "tp", algorithm=algorithm)
      return normed, new_res, jaxll.all_reduce(new_res * 2, "tp", algorithm="oneshot_ll")
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp"), P(), P()),
                                 out_specs=(P(), P(), P())))

  args = (put(x, P("tp")), put(res, P()), put(w, P()))
  fused, composed = step("fused"), step("oneshot_ll")
  paths = sorted({s.algorithm for s in jaxll.explain(fused, *args)})
  if not any(p.startswith("fused_") for p in paths):  # (this program's sites only)
    report["errors"].append(f"{key}: the fused kernel did not serve the call ({paths})")
  # algorithm="auto": the fused kernel up to its auto limit for this group and
  # exchange, then the composition; where it takes the kernel, its bits
  auto = step("auto")
  took = any(s.algorithm.startswith("fused_") for s in jaxll.explain(auto, *args))
  nbytes = tokens * hidden * np.dtype(dtype).itemsize
  small = nbytes <= jaxll.choice.fused_auto_max_bytes(
      n, any(p.endswith("_sentinel") for p in paths), any("twoshot" in p for p in paths))
  if took != small:
    report["errors"].append(f"{key}: auto took the fused kernel: {took}, expected {small}")
  fc, cc = fused.lower(*args).compile(), composed.lower(*args).compile()
  ac = auto.lower(*args).compile()
  launch.barrier()
  want = [np.asarray(o.addressable_data(0)) for o in cc(*args)]
  by_auto = [np.asarray(o.addressable_data(0)) for o in ac(*args)]
  if not all(np.array_equal(a, b) for a, b in zip(by_auto, [np.asarray(
      o.addressable_data(0)) for o in (fc if took else cc)(*args)])):
    report["errors"].append(f"{key}: auto's results differ from the path it took")
  # the sentinel exchange and the two-shot kernel, named: the same checks
  # (where they serve the shape)
  variants = [("fused", fc)]
  for name, path in (("fused_sentinel", "fused_oneshot_sentinel"),
                     ("fused_twoshot_sentinel", "fused_twoshot_sentinel")):
    try:
      named = step(name)
      if path not in {s.algorithm for s in jaxll.explain(named, *args)}:
        report["errors"].append(f"{key}: {name} took another path")
      variants.append((name, named.lower(*args).compile()))
    except ValueError as e:
      if "exchange cannot serve" in str(e) and ((tokens, hidden) == (64, 16384) or n >= 8):
        report["refused"].append(f"{key}: {name}")
      else:
        report["errors"].append(f"{key}: {name} refused: {e}")
  launch.barrier()
  for name, compiled in variants:
    check_runs(f"{key}/{name}", compiled, args, want, dtype)
  report["cases"] += 1
jaxll.check_errors()
launch.report(report)
