"""One process of the ppermute / all-to-all check (run by jaxll.tools.launch;
processes sharing one GPU): jaxll.ppermute (a ring shift, a pairwise swap and
a partial permutation) and jaxll.all_to_all (along dimension 0, and split 1 /
concat 0) with algorithm="oneshot_ll", "oneshot_sentinel", "oneshot_barrier"
and "auto" against numpy, bit for bit, for several sizes and dtypes (several
rounds included), in one program with a jaxll.all_reduce, repeated; their
gradients through the kernels; jax.lax's under jaxll.route. Then a stress
chain per algorithm: 500 steps of a ring shift, an all-to-all and a shift
back in one jitted loop, exact after the last step. With --reverse the mesh
lists the devices in reverse order.

  python exchange_check.py [--runs 3] [--reverse]
"""
import argparse

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--runs", type=int, default=3)
parser.add_argument("--reverse", action="store_true")
opts = parser.parse_args()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxll.tools import launch  # noqa: E402

pid = launch.init_worker()
import jaxll  # noqa: E402

n = jax.device_count()
devs = jax.devices()[::-1] if opts.reverse else jax.devices()
mesh = jax.sharding.Mesh(np.array(devs), ("ep",))
pos = list(mesh.devices.flat).index(jax.local_devices()[0])
report = {"pid": pid, "rank": pos, "errors": [], "cases": 0, "paths": {}}
CASES = [(1, np.float32), (1000, jnp.bfloat16), (4097, np.float16), (65_539, np.int32),
         (200_003, np.float32)]
PERMS = {"ring": [(i, (i + 1) % n) for i in range(n)],
         "swap": [(i, i ^ 1) for i in range(n)],
         "partial": [(0, n - 1), (n - 1, 0)] if n > 2 else [(1, 0)]}


def put(full, spec=P("ep")):
  sharding = NamedSharding(mesh, spec)
  idx = sharding.addressable_devices_indices_map(full.shape)
  return jax.make_array_from_single_device_arrays(
      full.shape, sharding, [jax.device_put(full[i], d) for d, i in idx.items()])


def bits(a):
  a = np.asarray(a)
  return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def mine(a):
  return np.asarray(a.addressable_data(0))


def permuted(x, perm, algorithm):
  """Rank pos's ppermute result, from every rank's rows of x."""
  want = np.zeros_like(bits(x[0]))
  for s, d in perm:
    if d == pos:
      want = bits(x[s]).copy()
      if algorithm == "oneshot_sentinel" and s != d:  # (the pattern arrives as a NaN)
        want[want == np.iinfo(want.dtype).max] = {2: 0x7FC0 if x.dtype == jnp.bfloat16
                                                  else 0x7E00, 4: 0x7FC00000}[x.dtype.itemsize]
  return want


for algorithm in ("oneshot_ll", "oneshot_sentinel", "oneshot_barrier", "auto"):
  for count, dtype in CASES:
    if algorithm == "oneshot_sentinel" and np.dtype(dtype) == np.int32:
      continue
    key = f"{algorithm}/{count}/{np.dtype(dtype).name}"
    launch.progress(key)
    rng = np.random.default_rng(count)
    if np.dtype(dtype) == np.int32:
      x = rng.integers(-1000, 1000, size=(n, n * count)).astype(np.int32)
    else:
      x = (rng.standard_normal((n, n * count)) * 3).astype(dtype)

    def body(v, algorithm=algorithm):
      v = v[0]
      outs = [jaxll.ppermute(v, "ep", PERMS[k], algorithm=algorithm) for k in PERMS]
      a2a = jaxll.all_to_all(v.reshape(n, count), "ep", 0, 0, tiled=True, algorithm=algorithm)
      whole = jaxll.all_reduce(v, "ep", algorithm="oneshot_ll")
      return tuple(o[None] for o in outs) + (a2a[None], whole[None])

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("ep"),
                              out_specs=(P("ep"),) * (len(PERMS) + 2)))
    args = (put(x),)
    sites = [s.algorithm for s in jaxll.explain(f, *args) if s.op in ("ppermute", "all_to_all")]
    report["paths"][key] = sites
    if algorithm != "auto" and sites != [algorithm] * (len(PERMS) + 1):
      report["errors"].append(f"{key}: the kernels did not serve every call ({sites})")
    if algorithm == "auto" and "xla" in sites:
      report["errors"].append(f"{key}: auto went to XLA ({sites})")
    compiled = f.lower(*args).compile()
    launch.barrier()
    for run in range(opts.runs):
      *perms, a2a, _ = (mine(o)[0] for o in compiled(*args))
      kernel = algorithm if algorithm != "auto" else None
      for k, got in zip(PERMS, perms):
        alg = kernel or sites[list(PERMS).index(k)]
        if not np.array_equal(bits(got), permuted(x, PERMS[k], alg)):
          report["errors"].append(f"{key}: ppermute {k} differs (run {run})")
      alg = kernel or sites[-1]
      want = np.stack([bits(x[j]).reshape(n, count)[pos] for j in range(n)])
      if alg == "oneshot_sentinel":
        want = want.copy()
        nan_bits = bits(np.array([np.nan], dtype))[0]
        for j in range(n):
          if j != pos:
            want[j][want[j] == np.iinfo(want.dtype).max] = nan_bits
      if not np.array_equal(bits(a2a), want):
        report["errors"].append(f"{key}: all_to_all differs (run {run})")
    report["cases"] += 1

# gradients through the kernels, and jax.lax's under route
launch.progress("grad")
g = np.random.default_rng(3).standard_normal((n, 4 * n, 8)).astype(np.float32)


def loss(v, fn_perm, fn_a2a):
  y = fn_perm(v[0], "ep", PERMS["ring"]) * 2
  z = fn_a2a(y, "ep", 1, 0, tiled=True) if y.shape[1] % n == 0 else y
  return z[None]


for name, fp, fa in (("jaxll", jaxll.ppermute, jaxll.all_to_all),
                     ("route", jax.lax.ppermute, jax.lax.all_to_all)):
  f = jax.shard_map(lambda v: loss(v, fp, fa), mesh=mesh, in_specs=P("ep"), out_specs=P("ep"))
  if name == "route":
    f = jaxll.route(f)
  grad = jax.jit(jax.grad(lambda v: jnp.sum(f(v) ** 2)))
  sites = jaxll.explain(grad, put(g))
  report["paths"][f"grad/{name}"] = [(s.op, s.algorithm) for s in sites]
  if sorted(s.op for s in sites) != ["all_to_all"] * 2 + ["ppermute"] * 2 or any(
      s.algorithm == "xla" for s in sites):
    report["errors"].append(f"grad/{name}: {report['paths'][f'grad/{name}']}")
  launch.barrier()
  got = mine(grad(put(g)))[0]
  # d/dv sum((2 * a2a(ppermute(v)))^2) = 8 v: the permutation and exchange undone
  if not np.array_equal(got, 8 * g[pos]):
    report["errors"].append(f"grad/{name}: gradient differs from 8 x")
  report["cases"] += 1

# stress: a shift, an all-to-all and the shift back, 500 times in one loop
STEPS = 500
for algorithm in ("oneshot_ll", "oneshot_sentinel", "oneshot_barrier", "auto"):
  key = f"stress/{algorithm}"
  launch.progress(key)
  x0 = np.random.default_rng(9).integers(-50, 50, size=(n, n * 1001)).astype(np.float32)
  back = [(d, s) for s, d in PERMS["ring"]]

  def step(_, v, algorithm=algorithm):
    v = jaxll.ppermute(v, "ep", PERMS["ring"], algorithm=algorithm)
    v = jaxll.all_to_all(v.reshape(n, -1), "ep", 0, 0, tiled=True, algorithm=algorithm)
    v = jaxll.all_to_all(v, "ep", 0, 0, tiled=True, algorithm=algorithm).reshape(-1)
    return jaxll.ppermute(v, "ep", back, algorithm=algorithm) + 1

  f = jax.jit(jax.shard_map(lambda v: jax.lax.fori_loop(0, STEPS, step, v[0])[None],
                            mesh=mesh, in_specs=P("ep"), out_specs=P("ep")))
  args = (put(x0),)
  sites = {s.algorithm for s in jaxll.explain(f, *args)}
  if "xla" in sites or (algorithm != "auto" and sites != {algorithm}):
    report["errors"].append(f"{key}: the kernels did not serve every call ({sites})")
  compiled = f.lower(*args).compile()
  launch.barrier()
  got = mine(compiled(*args))[0]
  if not np.array_equal(got, x0[pos] + STEPS):
    report["errors"].append(f"{key}: off after {STEPS} steps "
                            f"({int(np.sum(got != x0[pos] + STEPS))} elements)")
  report["cases"] += 1
jaxll.check_errors()
launch.report(report)
