"""One process of the mesh-forms check (run by jaxll.tools.launch; processes
sharing one GPU): jaxll's kernels serve, with exact results, calls in a
shard_map over an abstract mesh and over no mesh under jax.set_mesh (a bare
abstract mesh, whose devices the lowering cannot know, is XLA's), calls on
inputs typed unreduced (explicit sharding: the partial sums of an einsum),
all_gather(to="invarying" | "reduced"), and collectives written with jax.lax
(and their gradients) inside jaxll.route. Every call site must take a kernel
(the test environment lets auto take one at any size); results are checked
against numpy.

  python mesh_forms_check.py
"""
import numpy as np

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxll.tools import launch  # noqa: E402

pid = launch.init_worker()
import jaxll  # noqa: E402

n = jax.device_count()
mesh = jax.make_mesh((n,), ("tp",), axis_types=(AxisType.Explicit,))
pos = list(mesh.devices.flat).index(jax.local_devices()[0])  # this process's rank
report = {"pid": pid, "rank": pos, "errors": [], "cases": []}
ROWS, COLS = 4 * n, 6
full = (np.arange(n * ROWS * COLS).reshape(n * ROWS, COLS) % 7).astype(np.float32)
blocks = full.reshape(n, ROWS, COLS)   # rank r's block: blocks[r]


def put(array, spec):
  sharding = NamedSharding(mesh, spec)
  idx = sharding.addressable_devices_indices_map(array.shape)
  return jax.make_array_from_single_device_arrays(
      array.shape, sharding, [jax.device_put(array[i], d) for d, i in idx.items()])


def mine(out):
  return np.asarray(out.addressable_data(0))


def check(name, f, args, want):
  """Runs jitted `f`; every call site must be a kernel, and this rank's
  output(s) equal `want` (numpy)."""
  launch.progress(name)
  sites = jaxll.explain(f, *args)
  paths = sorted({s.algorithm for s in sites})
  if not sites or "xla" in paths:
    report["errors"].append(f"{name}: not every call took a kernel: "
                            f"{[(s.op, s.algorithm, s.reason) for s in sites]}")
  outs = f(*args)
  outs = outs if isinstance(outs, tuple) else (outs,)
  for i, (got, expect) in enumerate(zip(outs, want)):
    if not np.array_equal(mine(got), expect):
      report["errors"].append(f"{name}: output {i} differs from numpy")
  report["cases"].append((name, len(sites), paths))


x = put(full, P("tp"))
total = blocks.sum(0)                          # the sum over ranks
gathered = full                                # every rank's block, in rank order
piece = total[pos * (ROWS // n):(pos + 1) * (ROWS // n)]


def collectives(v):
  return (jaxll.all_reduce(v, "tp"), jaxll.all_gather(v, "tp", tiled=True),
          jaxll.psum_scatter(v, "tp", tiled=True))


specs = (P(), P("tp"), P("tp"))  # (the varying gather: each rank its own copy)
# 1. the mesh given as an abstract mesh, under jax.set_mesh
abstract = jax.jit(jax.shard_map(collectives, mesh=mesh.abstract_mesh, in_specs=P("tp"),
                                 out_specs=specs))
with jax.set_mesh(mesh):
  check("abstract mesh", abstract, (x,), (total, gathered, piece))
# (without jax.set_mesh: XLA's, and explain says why; not run, as XLA's collectives
# cannot run several processes on one GPU)
why = [s.reason for s in jaxll.explain(abstract, x) if s.op == "sum"]
if not (why and "jax.set_mesh" in why[0]):
  report["errors"].append(f"bare abstract mesh: {why}")
# 2. no mesh, the one set by jax.set_mesh
with jax.set_mesh(mesh):
  check("set_mesh", jax.jit(jax.shard_map(collectives, in_specs=P("tp"), out_specs=specs)),
        (x,), (total, gathered, piece))

# 3. partial sums typed unreduced: an einsum's, summed by all_reduce and psum_scatter
a = put(np.ones((ROWS, n * COLS), np.float32), P(None, "tp"))
b = put(np.tile(np.arange(COLS, dtype=np.float32), (n * COLS, 1)), P("tp", None))
product = np.ones((ROWS, n * COLS), np.float32) @ np.tile(np.arange(COLS, dtype=np.float32),
                                                           (n * COLS, 1))


@jax.jit
def unreduced(a, b):
  u = jnp.einsum("ij,jk->ik", a, b, out_sharding=NamedSharding(mesh, P(unreduced={"tp"})))
  return jax.shard_map(lambda u: (jaxll.all_reduce(u, "tp"),
                                  jaxll.psum_scatter(u, "tp", tiled=True)),
                       mesh=mesh, in_specs=P(unreduced={"tp"}),
                       out_specs=(P(), P("tp")))(u)


check("unreduced inputs", unreduced, (a, b),
      (product, product[pos * (ROWS // n):(pos + 1) * (ROWS // n)]))

# 4. all_gather's typed forms
check("all_gather to=", jax.jit(jax.shard_map(
    lambda v: (jaxll.all_gather(v, "tp", tiled=True, to="invarying"),
               jaxll.all_gather(v, "tp", tiled=True, to="reduced")),
    mesh=mesh, in_specs=P("tp"), out_specs=(P(), P(reduced={"tp"})))), (x,),
      (gathered, gathered))


# 5. jax.lax's collectives, and the gradient of a gather (a psum_scatter), routed
def written_with_lax(v):
  grad = jax.grad(lambda r: jnp.sum(jax.lax.all_gather(r, "tp", tiled=True) ** 2))(v)
  return (jax.lax.psum(v, "tp"), jax.lax.pmax(v, "tp"),
          jax.lax.psum_scatter(v, "tp", tiled=True), grad)


check("route", jax.jit(jaxll.route(jax.shard_map(
    written_with_lax, mesh=mesh, in_specs=P("tp"), out_specs=(P(), P(), P("tp"), P("tp"))))),
      (x,), (total, blocks.max(0), piece, 2 * n * blocks[pos]))

jaxll.check_errors()
launch.report(report)
