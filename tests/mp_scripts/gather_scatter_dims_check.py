"""One process of the check of gathers and scatters along any dimension (run by
jaxll.tools.launch; processes sharing one GPU): jaxll.all_gather and
jaxll.psum_scatter along dimensions 0, 1 and the last one, tiled and untiled,
float32 and bfloat16, each with its gradient (autodiff's transpose: the scatter
or gather along the same dimension), with algorithm="oneshot_ll",
"oneshot_sentinel", "oneshot_barrier" and "auto", in one jitted program per
algorithm. Every call must take the kernel (auto: one of its kernels).
Gathered values and the gradients of scatters (gathers) must equal numpy's
concatenation of every rank's input bit for bit, as XLA's gather gives;
scattered values and the gradients of gathers (scatters) must equal, bit for
bit, this rank's piece of jaxll's one-shot all-reduce of the same inputs (the
same sums in rank order), and the float64 sum within rounding. (XLA's own
collectives cannot run here: NCCL refuses processes that share a GPU.)

  python gather_scatter_dims_check.py [--runs 3]
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
mesh = jax.make_mesh((n,), ("tp",))
rank = list(mesh.devices.flat).index(jax.local_devices()[0])
report = {"pid": pid, "rank": rank, "errors": [], "cases": 0, "sites": {}}

# (name, per-rank input shape, dimension, tiled)
GATHERS = [("gather/dim0/tiled", (4, 6, 16), 0, True),
           ("gather/dim1/tiled", (4, 6, 16), 1, True),
           ("gather/last/tiled", (4, 6, 16), -1, True),
           ("gather/dim1/untiled", (4, 6, 16), 1, False),
           ("gather/last/untiled", (4, 6, 16), 2, False)]
SCATTERS = [("scatter/dim0/tiled", (2 * n, 6, 16), 0, True),
            ("scatter/dim1/tiled", (4, 2 * n, 16), 1, True),
            ("scatter/last/tiled", (4, 6, 16 * n), -1, True),
            ("scatter/dim1/untiled", (4, n, 16), 1, False),
            ("scatter/dim2/untiled", (4, 6, n, 8), 2, False)]


def put(full):
  sharding = NamedSharding(mesh, P("tp"))
  idx = sharding.addressable_devices_indices_map(full.shape)
  return jax.make_array_from_single_device_arrays(
      full.shape, sharding, [jax.device_put(full[i], d) for d, i in idx.items()])


def bits(a):
  a = np.asarray(a)
  return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def local(a):
  return np.asarray(a.addressable_data(0))[0]


def body(algorithm):
  """The program: every gather and scatter with its gradient (a vjp with a
  per-rank cotangent), and the one-shot all-reduce of each sum's inputs (a
  scatter's input, a gather's cotangent)."""
  def f(*args):
    k = len(GATHERS)
    gx, gct = args[:k], args[k:2 * k]
    sx, sct = args[2 * k:2 * k + len(SCATTERS)], args[2 * k + len(SCATTERS):]
    out = []
    for (_, _, dim, tiled), x, ct in zip(GATHERS, gx, gct):
      y, vjp = jax.vjp(lambda v: jaxll.all_gather(v, "tp", axis=dim, tiled=tiled,
                                                  algorithm=algorithm), x[0])
      whole = jaxll.all_reduce(ct[0], "tp", algorithm="oneshot_ll")
      out += [y[None], vjp(ct[0])[0][None], whole[None]]
    for (_, _, dim, tiled), x, ct in zip(SCATTERS, sx, sct):
      y, vjp = jax.vjp(lambda v: jaxll.psum_scatter(v, "tp", scatter_dimension=dim, tiled=tiled,
                                                    algorithm=algorithm), x[0])
      whole = jaxll.all_reduce(x[0], "tp", algorithm="oneshot_ll")
      out += [y[None], vjp(ct[0])[0][None], whole[None]]
    return tuple(out)
  return f


def gathered(x, dim, tiled):
  """numpy's all_gather of every rank's input x[r]."""
  return np.concatenate(list(x), axis=dim) if tiled else np.stack(list(x), axis=dim)


def gathered_shape(shape, dim, tiled):
  s = list(shape)
  if tiled:
    s[dim] *= n
  else:
    s.insert(dim % (len(shape) + 1), n)
  return tuple(s)


def scattered_shape(shape, dim, tiled):
  s = list(shape)
  if tiled:
    s[dim] //= n
  else:
    del s[dim]
  return tuple(s)


def piece(total, dim, tiled):
  """This rank's piece of a summed scatter input."""
  if tiled:
    return np.split(total, n, axis=dim)[rank]
  return np.take(total, rank, axis=dim)


for dtype in (np.float32, jnp.bfloat16):
  rng = np.random.default_rng(11)
  draw = lambda shape: (rng.standard_normal((n, *shape)) * 3).astype(dtype)
  inputs = ([draw(s) for _, s, _, _ in GATHERS] +
            [draw(gathered_shape(s, d, t)) for _, s, d, t in GATHERS] +
            [draw(s) for _, s, _, _ in SCATTERS] +
            [draw(scattered_shape(s, d, t)) for _, s, d, t in SCATTERS])
  args = [put(a) for a in inputs]
  k = len(GATHERS)
  gx, gct = inputs[:k], inputs[k:2 * k]
  sx, sct = inputs[2 * k:2 * k + len(SCATTERS)], inputs[2 * k + len(SCATTERS):]
  tol = {"float32": 2e-6, "bfloat16": 1.6e-2}[np.dtype(dtype).name]
  for algorithm in ("oneshot_ll", "oneshot_sentinel", "oneshot_barrier", "auto"):
    key = f"{algorithm}/{np.dtype(dtype).name}"
    launch.progress(key)
    f = jax.jit(jax.shard_map(body(algorithm), mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))
    sites = [s for s in jaxll.explain(f, *args) if s.op in ("all_gather", "psum_scatter")]
    report["sites"][key] = sorted({(s.op, s.dimension, s.algorithm) for s in sites})
    # every gather and scatter and both gradients: 2 x (5 + 5) calls
    if len(sites) != 2 * (len(GATHERS) + len(SCATTERS)):
      report["errors"].append(f"{key}: {len(sites)} gather/scatter call sites")
    unserved = [(s.op, s.dimension, s.algorithm, s.reason) for s in sites
                if s.algorithm == "xla" or (algorithm != "auto" and s.algorithm != algorithm)]
    if unserved:
      report["errors"].append(f"{key}: calls not on the kernel: {unserved}")
    compiled = f.lower(*args).compile()
    launch.barrier()
    first = None
    for run in range(opts.runs):
      got = [local(a) for a in compiled(*args)]
      if first is None:
        first = got
      elif not all(np.array_equal(bits(a), bits(b)) for a, b in zip(got, first)):
        report["errors"].append(f"{key}: run {run} differs from the first")
        break

    def check_sum(name, what, y, whole, parts, dim, tiled):
      if not np.array_equal(bits(y), bits(piece(whole, dim, tiled))):
        report["errors"].append(f"{key} {name}: {what} differs from the all-reduce's piece")
      want = piece(parts.astype(np.float64).sum(0), dim, tiled)
      scale = piece(np.abs(parts.astype(np.float64)).sum(0), dim, tiled)
      if y.shape != want.shape or not (np.abs(y.astype(np.float64) - want) <= tol * scale).all():
        report["errors"].append(f"{key} {name}: {what} off the float64 sum")

    i = 0
    for (name, _, dim, tiled), x, ct in zip(GATHERS, gx, gct):
      y, grad, whole = got[i:i + 3]
      if not np.array_equal(bits(y), bits(gathered(x, dim, tiled))):
        report["errors"].append(f"{key} {name}: gathered values differ from the inputs")
      check_sum(name, "gradient (a scatter)", grad, whole, ct, dim, tiled)
      i += 3
    for (name, _, dim, tiled), x, ct in zip(SCATTERS, sx, sct):
      y, grad, whole = got[i:i + 3]
      check_sum(name, "scattered value", y, whole, x, dim, tiled)
      if not np.array_equal(bits(grad), bits(gathered(ct, dim, tiled))):
        report["errors"].append(f"{key} {name}: gradient (a gather) differs from the cotangents")
      i += 3
    report["cases"] += 1
jaxll.check_errors()
launch.report(report)
