"""One process of the ragged all-to-all check (run by jaxll.tools.launch;
processes sharing one GPU): jaxll.ragged_all_to_all with algorithm="oneshot_ll"
and "auto" against numpy, bit for bit, for rows of several shapes and dtypes,
one and several slices a peer, uniform and skewed sizes, repeated; its
gradients (operand and output) through the kernels against numpy's;
jax.lax.ragged_all_to_all under jaxll.route; then 300 steps of a ragged shift
to the next rank in one jitted loop, exact after the last step.

  python ragged_check.py [--runs 3]
"""
import argparse

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--runs", type=int, default=3)
opts = parser.parse_args()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxll.tools import launch  # noqa: E402

pid = launch.init_worker()
import jaxll  # noqa: E402

n = jax.device_count()
mesh = jax.sharding.Mesh(np.array(jax.devices()), ("ep",))
pos = list(mesh.devices.flat).index(jax.local_devices()[0])
# (on CPU processes, for the numeric checks alone: every call is jaxll's composition)
ON_GPU = jax.devices()[0].platform == "gpu"
KERNEL = {"oneshot_ll"} if ON_GPU else {"composed"}
report = {"pid": pid, "rank": pos, "errors": [], "cases": 0, "paths": {}}
# (row shape, slices a peer, rows, dtype, skewed)
CASES = [((), 1, 40, np.float32, False), ((5,), 2, 30, jnp.bfloat16, True),
         ((8,), 3, 48, np.float16, False), ((7, 3), 1, 20, np.int32, True),
         ((7168,), 1, 16, jnp.bfloat16, False), ((4096,), 2, 200, np.float32, True)]


def put(full):
  sharding = NamedSharding(mesh, P("ep"))
  idx = sharding.addressable_devices_indices_map(full.shape)
  return jax.make_array_from_single_device_arrays(
      full.shape, sharding, [jax.device_put(full[i], d) for d, i in idx.items()])


def bits(a):
  a = np.asarray(a)
  return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def mine(a):
  return np.asarray(a.addressable_data(0))


def case(slices, rows, row_shape, dtype, skew, rng):
  """Every rank's operand, output and four size vectors (N, K each) of a
  consistent call: slices packed in the operand, each receiver packing what it
  gets in source order after row 0."""
  send = rng.integers(0, rows // (n * slices) + 1, size=(n, n, slices))
  if skew:
    send[:, 0, :] = rows // (2 * slices)
  for r in range(n):  # (a rank's slices fit its operand)
    while send[r].sum() > rows:
      send[r].flat[np.argmax(send[r])] -= 1
  k = n * slices
  vec = np.zeros((4, n, k), np.int32)
  for r in range(n):
    vec[0, r] = np.concatenate([[0], np.cumsum(send[r].ravel())[:-1]])
    vec[1, r] = send[r].ravel()
  out_rows = 1
  for d in range(n):
    at = 1 + np.concatenate([[0], np.cumsum(send[:, d].ravel())[:-1]]).reshape(n, slices)
    vec[2, :, d * slices:(d + 1) * slices] = at
    vec[3, d] = send[:, d].ravel()
    out_rows = max(out_rows, 1 + int(send[:, d].sum()) + 2)
  if np.dtype(dtype) == np.int32:
    x = rng.integers(-1000, 1000, size=(n, rows, *row_shape)).astype(np.int32)
    o = rng.integers(-1000, 1000, size=(n, out_rows, *row_shape)).astype(np.int32)
  else:
    x = (rng.standard_normal((n, rows, *row_shape)) * 3).astype(dtype)
    o = (rng.standard_normal((n, out_rows, *row_shape)) * 3).astype(dtype)
  return x, o, vec


def reference(x, o, vec, r):
  """Rank r's result (numpy), in the dtype of x."""
  want = o[r].copy()
  slices = vec.shape[2] // n
  for s in range(n):
    for k in range(slices):
      i = r * slices + k
      io, ss, oo = vec[0, s, i], vec[1, s, i], vec[2, s, i]
      want[oo:oo + ss] = x[s, io:io + ss]
  return want


def sharded(fn, n_out=1):
  return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P("ep"),) * 6,
                               out_specs=P("ep") if n_out == 1 else (P("ep"),) * n_out))


for c, (row_shape, slices, rows, dtype, skew) in enumerate(CASES):
  rng = np.random.default_rng(c)
  x, o, vec = case(slices, rows, row_shape, dtype, skew, rng)
  args = tuple(put(a) for a in (x, o, *vec))
  for algorithm in ("oneshot_ll", "auto") if ON_GPU else ("auto",):
    key = f"{algorithm}/{row_shape}/{slices}/{np.dtype(dtype).name}/{'skew' if skew else 'even'}"
    launch.progress(key)
    f = sharded(lambda *a, algorithm=algorithm: jaxll.ragged_all_to_all(
        *(v[0] for v in a), axis_name="ep", algorithm=algorithm)[None])
    sites = [s.algorithm for s in jaxll.explain(f, *args)]
    report["paths"][key] = sites
    if set(sites) != KERNEL or len(sites) != 1:
      report["errors"].append(f"{key}: the kernel did not serve the call ({sites})")
    compiled = f.lower(*args).compile()
    launch.barrier()
    for run in range(opts.runs):
      got = mine(compiled(*args))[0]
      if not np.array_equal(bits(got), bits(reference(x, o, vec, pos))):
        report["errors"].append(f"{key}: differs from numpy (run {run})")
    report["cases"] += 1

# gradients through the kernels, against numpy's; and jax.lax's under route
launch.progress("grad")
rng = np.random.default_rng(7)
x, o, vec = case(2, 24, (6,), np.float32, False, rng)
w = rng.standard_normal(o.shape).astype(np.float32)
args = tuple(put(a) for a in (x, o, *vec))
want_x = np.zeros_like(x)  # d sum(w * result) / d operand: w at where each row landed
want_o = w.copy()          # ... / d output: w where no slice wrote
slices = vec.shape[2] // n
for s in range(n):
  for i in range(vec.shape[2]):
    d = i // slices
    io, ss, oo = vec[0, s, i], vec[1, s, i], vec[2, s, i]
    want_x[s, io:io + ss] = w[d, oo:oo + ss]
    want_o[d, oo:oo + ss] = 0
for name, fn in (("jaxll", jaxll.ragged_all_to_all), ("route", jax.lax.ragged_all_to_all)):
  f = jax.shard_map(lambda *a, fn=fn: fn(*(v[0] for v in a), axis_name="ep")[None], mesh=mesh,
                    in_specs=(P("ep"),) * 6, out_specs=P("ep"))
  if name == "route":
    f = jaxll.route(f)
  # (global arrays are arguments: a process cannot close over them)
  grad = jax.jit(jax.grad(lambda a, b, *rest: jnp.sum(f(a, b, *rest[:4]) * rest[4]),
                          argnums=(0, 1)))
  gargs = (*args, put(w))
  sites = jaxll.explain(grad, *gargs)
  report["paths"][f"grad/{name}"] = [(s.op, s.algorithm) for s in sites]
  ops = sorted(s.op for s in sites)
  # (the forward call is linear, so only its transpose is left, and the
  # all-to-alls of the offsets)
  if ops != ["all_to_all", "all_to_all", "ragged_all_to_all"] or (
      ON_GPU and any(s.algorithm == "xla" for s in sites)):
    report["errors"].append(f"grad/{name}: {report['paths'][f'grad/{name}']}")
  launch.barrier()
  gx, go = (mine(v)[0] for v in grad(*gargs))
  if not (np.array_equal(gx, want_x[pos]) and np.array_equal(go, want_o[pos])):
    report["errors"].append(f"grad/{name}: gradient differs from numpy's")
  report["cases"] += 1

# stress: every rank's rows to the next rank, 300 times in one loop
STEPS = 300
launch.progress("stress")
rows = 64
x0 = np.random.default_rng(9).integers(-50, 50, size=(n, rows, 33)).astype(np.float32)
vec = np.zeros((4, n, n), np.int32)
for r in range(n):
  vec[1, r, (r + 1) % n] = rows
  vec[3, r, (r - 1) % n] = rows


def stress(v, io, ss, oo, rs):
  def step(_, y):
    return jaxll.ragged_all_to_all(y, y, io[0], ss[0], oo[0], rs[0], axis_name="ep") + 1
  return jax.lax.fori_loop(0, STEPS, step, v[0])[None]


f = jax.jit(jax.shard_map(stress, mesh=mesh, in_specs=(P("ep"),) * 5, out_specs=P("ep")))
args = tuple(put(a) for a in (x0, *vec))
sites = {s.algorithm for s in jaxll.explain(f, *args)}
if sites != KERNEL:
  report["errors"].append(f"stress: the kernel did not serve every call ({sites})")
compiled = f.lower(*args).compile()
launch.barrier()
got = mine(compiled(*args))[0]
if not np.array_equal(got, x0[(pos - STEPS) % n] + STEPS):
  report["errors"].append("stress: off after the loop")
report["cases"] += 1
jaxll.check_errors()
launch.report(report)
