"""One process of the all-gather / reduce-scatter check (run by jaxll.tools.launch;
processes sharing one GPU): jaxll.all_gather and jaxll.psum_scatter with
algorithm="oneshot_ll", "oneshot_sentinel", "oneshot_barrier" and "auto"
(whose kernel must be its measured choice) against numpy, for several sizes
and dtypes (pieces of several rounds included), in one program with a
jaxll.all_reduce, repeated. The gather must return every rank's piece bit for
bit; the scatter must equal piece r of the one-shot all-reduce of the same
inputs bit for bit, and the float64 sum within rounding. Then a stress chain
per algorithm: 500 steps of a small and a large gather and scatter back to
back in one jitted loop, exact after the last step. With --reverse the mesh
lists the devices in reverse order, so a process's rank (its mesh position) is
not its process index.

  python gather_scatter_check.py [--runs 5] [--reverse]
"""
import argparse

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--runs", type=int, default=5)
parser.add_argument("--reverse", action="store_true")
opts = parser.parse_args()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxll.tools import launch  # noqa: E402

pid = launch.init_worker()
import jaxll  # noqa: E402
from jaxll import choice, gather_scatter  # noqa: E402

n = jax.device_count()
if opts.reverse:
  mesh = jax.sharding.Mesh(np.array(jax.devices()[::-1]), ("tp",))
else:
  mesh = jax.make_mesh((n,), ("tp",))
pos = list(mesh.devices.flat).index(jax.local_devices()[0])  # this process's rank (one device each)
report = {"pid": pid, "rank": pos, "errors": [], "cases": 0}
CASES = [(1, np.float32), (1000, jnp.bfloat16), (4097, np.float16), (65_539, np.int32),
         (300_001, np.float32)]


def put(full, spec):
  sharding = NamedSharding(mesh, spec)
  idx = sharding.addressable_devices_indices_map(full.shape)
  return jax.make_array_from_single_device_arrays(
      full.shape, sharding, [jax.device_put(full[i], d) for d, i in idx.items()])


def bits(a):
  a = np.asarray(a)
  return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


for algorithm in ("oneshot_ll", "oneshot_sentinel", "oneshot_barrier", "auto"):
  for count, dtype in CASES:
    if algorithm == "oneshot_sentinel" and np.dtype(dtype) == np.int32:
      continue  # (no sentinel kernel for int32)
    key = f"{algorithm}/{count}/{np.dtype(dtype).name}"
    launch.progress(key)
    rng = np.random.default_rng(count)
    if np.dtype(dtype) == np.int32:
      pieces = rng.integers(-1000, 1000, size=(n, count)).astype(np.int32)
      parts = rng.integers(-1000, 1000, size=(n, n * count)).astype(np.int32)
    else:
      pieces = (rng.standard_normal((n, count)) * 3).astype(dtype)
      parts = (rng.standard_normal((n, n * count)) * 3).astype(dtype)

    def body(p, q, algorithm=algorithm):
      g = jaxll.all_gather(p[0], "tp", algorithm=algorithm)  # (n, count)
      s = jaxll.psum_scatter(q[0], "tp", tiled=True, algorithm=algorithm)  # (count,)
      whole = jaxll.all_reduce(q[0], "tp", algorithm="oneshot_ll")  # (n * count,)
      return g[None], s[None], whole[None]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp"), P("tp")),
                              out_specs=(P("tp"), P("tp"), P("tp"))))
    args = (put(pieces, P("tp")), put(parts, P("tp")))
    sites = [s.algorithm for s in jaxll.explain(f, *args) if s.op in ("all_gather", "psum_scatter")]
    expect = [algorithm, algorithm]
    if algorithm == "auto":  # its measured choice (the crossover to XLA is lifted here)
      item = np.dtype(dtype).itemsize
      expect = [choice.gather_scatter_auto("all_gather", n, count * item, dtype)[0],
                choice.gather_scatter_auto("psum_scatter", n, n * count * item, dtype)[0]]
      report.setdefault("auto", {})[key] = sites
    if sites != expect:
      report["errors"].append(f"{key}: the kernels did not serve both calls ({sites}, want {expect})")
    compiled = f.lower(*args).compile()
    launch.barrier()
    first = None
    for _ in range(opts.runs):
      g, s, whole = compiled(*args)
      g = np.asarray(g.addressable_data(0))[0]
      s = np.asarray(s.addressable_data(0))[0]
      whole = np.asarray(whole.addressable_data(0))[0]
      if first is None:
        first = (g, s)
        if not np.array_equal(bits(g), bits(pieces)):
          report["errors"].append(f"{key}: the gathered pieces differ from the inputs")
        if not np.array_equal(bits(s), bits(whole[pos * count:(pos + 1) * count])):
          report["errors"].append(f"{key}: the scattered piece differs from the all-reduce's")
        want = parts.astype(np.float64).sum(0)[pos * count:(pos + 1) * count]
        scale = np.abs(parts.astype(np.float64)).sum(0)[pos * count:(pos + 1) * count]
        tol = {"float32": 2e-6, "bfloat16": 1.6e-2, "float16": 2e-3, "int32": 0}[
            np.dtype(dtype).name]
        if not (np.abs(s.astype(np.float64) - want) <= tol * scale).all():
          report["errors"].append(f"{key}: the scattered piece is off the float64 sum")
      elif not (np.array_equal(bits(g), bits(first[0])) and np.array_equal(bits(s), bits(first[1]))):
        report["errors"].append(f"{key}: a run differs from the first")
        break
    report["cases"] += 1


def stress_step(algorithm, small, large):
  """One step of the stress chain on this rank's (small,) and (large,) float32
  pieces of small integers: each piece is gathered and the gathered vector
  reduce-scattered (n times the piece, exact), then the step adds 1, so after
  k steps every piece is its start plus k, bit for bit."""
  def one(x):
    g = jaxll.all_gather(x, "tp", tiled=True, algorithm=algorithm)  # (n * c,), every rank alike
    s = jaxll.psum_scatter(g, "tp", tiled=True, algorithm=algorithm)  # n * x
    return s - (n - 1) * x + 1
  return one(small), one(large)


# Stress: STEPS steps of four calls each (a small and a large gather and
# scatter) back to back in one jitted loop, no host sync between calls.
STEPS = 500
for algorithm in ("oneshot_ll", "oneshot_sentinel", "oneshot_barrier", "auto"):
  key = f"stress/{algorithm}"
  launch.progress(key)
  rng = np.random.default_rng(7)
  small0 = rng.integers(-50, 50, size=(n, 37)).astype(np.float32)
  large0 = rng.integers(-50, 50, size=(n, 70_001)).astype(np.float32)

  def chain(a, b, algorithm=algorithm):
    out = jax.lax.fori_loop(0, STEPS, lambda _, ab: stress_step(algorithm, *ab), (a[0], b[0]))
    return out[0][None], out[1][None]

  f = jax.jit(jax.shard_map(chain, mesh=mesh, in_specs=(P("tp"), P("tp")),
                            out_specs=(P("tp"), P("tp"))))
  args = (put(small0, P("tp")), put(large0, P("tp")))
  sites = {s.algorithm for s in jaxll.explain(f, *args)}
  if algorithm != "auto" and sites != {algorithm}:
    report["errors"].append(f"{key}: the kernels did not serve every call ({sites})")
  report.setdefault("stress_kernels", {})[algorithm] = sorted(sites)
  compiled = f.lower(*args).compile()
  launch.barrier()
  a, b = compiled(*args)
  for got, start, name in ((a, small0, "small"), (b, large0, "large")):
    got = np.asarray(got.addressable_data(0))[0]
    if not np.array_equal(got, start[pos] + STEPS):
      bad = int(np.sum(got != start[pos] + STEPS))
      report["errors"].append(f"{key}: {name} pieces off after {STEPS} steps ({bad} elements)")
  report["cases"] += 1
jaxll.check_errors()
launch.report(report)
