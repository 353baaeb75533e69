"""One process of the check of gathers and scatters along any dimension (run by
jaxll.tools.launch; processes sharing one GPU): jaxll.all_gather and
jaxll.psum_scatter along dimensions 0, 1 and the last one, tiled and untiled,
float32 and bfloat16, each with its gradient (autodiff's transpose: the scatter
or gather along the same dimension), with algorithm="oneshot_ll",
"oneshot_sentinel", "oneshot_barrier" and "auto", in one jitted program per
algorithm. Every call must take the kernel (auto: one of its kernels); gathered
values and the gradients of scatters (gathers) must equal jax.lax's bit for bit;
scattered values and the gradients of gathers (scatters) must equal, bit for
bit, the piece of jaxll's one-shot all-reduce of the same inputs (the same sums
in rank order), and XLA's within rounding.

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


def body(lib, algorithm):
  """The program: every gather and scatter with its gradient (a vjp with a
  per-rank cotangent), and the all-reduce of each scatter's input."""
  kw = {} if lib is jax.lax else {"algorithm": algorithm}

  def f(*args):
    k = len(GATHERS)
    gx, gct = args[:k], args[k:2 * k]
    sx, sct = args[2 * k:2 * k + len(SCATTERS)], args[2 * k + len(SCATTERS):]
    out = []
    for (_, _, dim, tiled), x, ct in zip(GATHERS, gx, gct):
      y, vjp = jax.vjp(lambda v: lib.all_gather(v, "tp", axis=dim, tiled=tiled, **kw), x[0])
      out += [y[None], vjp(ct[0])[0][None]]
    for (_, _, dim, tiled), x, ct in zip(SCATTERS, sx, sct):
      y, vjp = jax.vjp(lambda v: lib.psum_scatter(v, "tp", scatter_dimension=dim, tiled=tiled,
                                                  **kw), x[0])
      out += [y[None], vjp(ct[0])[0][None]]
      if lib is not jax.lax:
        out.append(jaxll.all_reduce(x[0], "tp", algorithm="oneshot_ll")[None])
    return tuple(out)
  return f


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
  ref_f = jax.jit(jax.shard_map(body(jax.lax, None), mesh=mesh, in_specs=P("tp"),
                                out_specs=P("tp")))
  ref = [local(a) for a in ref_f(*args)]
  for algorithm in ("oneshot_ll", "oneshot_sentinel", "oneshot_barrier", "auto"):
    key = f"{algorithm}/{np.dtype(dtype).name}"
    launch.progress(key)
    f = jax.jit(jax.shard_map(body(jaxll, algorithm), mesh=mesh, in_specs=P("tp"),
                              out_specs=P("tp")))
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
    i = 0
    for name, _, dim, tiled in GATHERS:
      y, grad = got[i], got[i + 1]
      if not np.array_equal(bits(y), bits(ref[i])):
        report["errors"].append(f"{key} {name}: gathered values differ from jax.lax's")
      if grad.shape != ref[i + 1].shape or not np.allclose(
          grad.astype(np.float64), ref[i + 1].astype(np.float64), rtol=2e-2, atol=5e-2):
        report["errors"].append(f"{key} {name}: gradient off XLA's")
      i += 2
    j = 2 * len(GATHERS)
    for name, _, dim, tiled in SCATTERS:
      y, grad, whole = got[i], got[i + 1], got[i + 2]
      if not np.array_equal(bits(y), bits(piece(whole, dim, tiled))):
        report["errors"].append(f"{key} {name}: scattered values differ from the all-reduce's "
                                f"piece")
      if not np.allclose(y.astype(np.float64), ref[j].astype(np.float64), rtol=2e-2, atol=5e-2):
        report["errors"].append(f"{key} {name}: scattered values off XLA's")
      if not np.array_equal(bits(grad), bits(ref[j + 1])):
        report["errors"].append(f"{key} {name}: gradient (a gather) differs from jax.lax's")
      i += 3
      j += 2
    report["cases"] += 1
jaxll.check_errors()
launch.report(report)
