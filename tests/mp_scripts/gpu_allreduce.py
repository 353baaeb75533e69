"""One process of a multi-process jaxll check on GPUs (run by jaxll.launch):
every process joins jax.distributed, the global mesh has one device per
process (N processes may share one GPU), and each check runs the real
jit + shard_map path. Reports, per case, whether this process's result matched
the float64 reference and a hash of its output bits, so the launcher can check
that ranks agree bitwise.

  python gpu_allreduce.py [--steps 1000] [--latency]
"""
import argparse
import hashlib
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxll import launch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--latency", action="store_true")
opts = parser.parse_args()

pid = launch.init_worker()
jax.config.update("jax_default_matmul_precision", "highest")  # f32 matmuls, not TF32
import jaxll  # noqa: E402
from jaxll import algorithms  # noqa: E402

n = jax.process_count()
assert jax.device_count() == n, "one device per process"
dev = jax.local_devices()[0]
REL_TOL = {"float32": 2e-6, "bfloat16": 2 ** -8, "float16": 2 ** -11, "int32": 0}
EPS = {"float32": 2 ** -23, "bfloat16": 2 ** -7, "float16": 2 ** -10}
SIZES = [1, 777, 65_539, 1_500_001]  # 1 element .. 6 MB (f32)
report = {"pid": pid, "cases": {}, "errors": [], "seconds": {}}
_t = [time.monotonic(), None]


def section(name):
  """A progress mark; the previous section's time goes into the report."""
  now = time.monotonic()
  if _t[1] is not None:
    report["seconds"][_t[1]] = round(now - _t[0], 1)
  _t[:] = [now, name]
  launch.progress(name)
_barriers = [0]


def compiled(f, *args):
  """`f` compiled for `args`, once every process has compiled it too. Loading a
  module while the other processes' kernels already spin on the shared GPU
  waiting for this one is a hazard this test does not need to take."""
  c = f.lower(*args).compile()
  _barriers[0] += 1
  from jax._src import distributed
  distributed.global_state.client.wait_at_barrier(f"jaxll-test-{_barriers[0]}", 300_000)
  return c


def rows(shape_lead, count, dtype, seed):
  """Every rank's input, generated identically in every process."""
  rng = np.random.default_rng(seed)
  if np.dtype(dtype) == np.int32:
    return rng.integers(-1000, 1000, size=(*shape_lead, count)).astype(np.int32)
  return (rng.standard_normal((*shape_lead, count)) * 3).astype(dtype)


def global_array(mesh, spec, full):
  """The global array whose block on this process's device is cut from `full`."""
  sharding = NamedSharding(mesh, spec)
  idx = sharding.addressable_devices_indices_map(full.shape)[dev]
  return jax.make_array_from_single_device_arrays(
      full.shape, sharding, [jax.device_put(full[idx], dev)])


def sum_tol(x64, dtype, algorithm, axis=0):
  """Tolerance of a reduction over `axis`, relative to sum(|x|)."""
  rel = REL_TOL[np.dtype(dtype).name]
  if algorithm != "auto" and not algorithms.SPECS[algorithm].reproducible:
    rel = x64.shape[axis] * EPS[np.dtype(dtype).name]
  return rel * np.abs(x64).sum(axis)


def check(name, got, ref, tol):
  got = np.asarray(got)
  bad = np.abs(got.astype(np.float64) - ref) > tol
  ok = not bad.any()
  report["cases"][name] = {"ok": ok, "hash": hashlib.sha1(got.tobytes()).hexdigest()}
  if not ok:
    i = int(np.argmax(bad.reshape(-1)))
    report["errors"].append(f"{name}: {int(bad.sum())} elements off, first {i}: "
                            f"{got.reshape(-1)[i]} vs {ref.reshape(-1)[i]}")


section("1-D mesh, every algorithm")
# 1. Every algorithm, dtype, op, on the 1-D mesh; four sizes per program (four call sites).
mesh = jax.make_mesh((n,), ("x",))
for algorithm in algorithms.KERNELS:
  for dtype in (np.float32, jnp.bfloat16, np.float16, np.int32):
    for op in ("sum", "max"):
      if algorithms.kernel_limits(algorithm, np.dtype(dtype), op):
        continue
      fulls = [rows((n,), c, dtype, seed=zlib.crc32(f"{algorithm}/{op}/{c}".encode()))
               for c in SIZES]
      xs = [global_array(mesh, P("x"), f) for f in fulls]
      f = jax.jit(jax.shard_map(
          lambda *vs, a=algorithm, o=op: [jaxll.all_reduce(v, "x", op=o, algorithm=a) for v in vs],
          mesh=mesh, in_specs=(P("x"),) * len(SIZES), out_specs=[P("x")] * len(SIZES)))
      sites = jaxll.explain(f, *xs)
      assert [s.algorithm for s in sites] == [algorithm] * len(SIZES), sites
      outs = compiled(f, *xs)(*xs)
      for c, full, out in zip(SIZES, fulls, outs):
        x64 = full.astype(np.float64)
        ref = {"sum": x64.sum(0), "max": x64.max(0)}[op]
        tol = sum_tol(x64, dtype, algorithm) if op == "sum" else 0
        check(f"1d/{algorithm}/{np.dtype(dtype).name}/{op}/{c}", out.addressable_data(0)[0],
              ref, tol)

section("2-D mesh")
# 2. A 2-D mesh, reducing over each axis (auto and one forced kernel).
if n >= 2 and n % 2 == 0:
  mesh2 = jax.make_mesh((2, n // 2), ("a", "b"))
  for axis, red in (("b", 1), ("a", 0)):
    for algorithm in ("auto", "twoshot_sentinel", "oneshot_ll"):
      for c in (5, 70_001):
        full = rows((2, n // 2), c, np.float32, seed=c + red)
        x = global_array(mesh2, P("a", "b"), full)
        f = jax.jit(jax.shard_map(lambda v, a=algorithm, ax=axis: jaxll.all_reduce(v, ax, algorithm=a),
                                  mesh=mesh2, in_specs=P("a", "b"), out_specs=P("a", "b")))
        out = compiled(f, x)(x)
        x64 = full.astype(np.float64)
        ref = np.broadcast_to(x64.sum(red, keepdims=True), x64.shape)
        tol = np.broadcast_to(np.expand_dims(sum_tol(x64, np.float32, algorithm, red), red),
                              x64.shape)
        idx = x.sharding.addressable_devices_indices_map(full.shape)[dev]
        group = idx[1 - red].start or 0  # position along the axis that is not reduced
        check(f"2d/{axis}/{algorithm}/{c}/group{group}", out.addressable_data(0)[0, 0],
              ref[idx][0, 0], tol[idx][0, 0])

section("consecutive steps")
# 3. Many consecutive steps inside one jitted loop (epochs and parities on the device).
x_full = rows((n,), 1000, np.float32, seed=99)
x = global_array(mesh, P("x"), x_full)
for algorithm in algorithms.KERNELS:
  f = jax.jit(jax.shard_map(
      lambda v, a=algorithm: jax.lax.fori_loop(
          0, opts.steps, lambda i, w: jaxll.all_reduce(w, "x", algorithm=a) * np.float32(1 / n), v),
      mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
  out = compiled(f, x)(x)
  mean = x_full.astype(np.float64).mean(0)
  # the first step averages; later ones average equal values (a rounding each)
  check(f"steps/{algorithm}", out.addressable_data(0)[0], mean, 1e-3 * np.abs(mean) + 1e-4)

section("training step")
# 4. A training step: gradient through the all-reduce, against the math.
d, k = 16, 8
xs_full = rows((n,), 32 * d, np.float32, seed=5).reshape(n, 32, d)
w0 = rows((), d * k, np.float32, seed=6).reshape(d, k) * 0.1
y = rows((), 32 * k, np.float32, seed=7).reshape(32, k)


def train_step(xb, wb):
  def loss(w):
    s = jaxll.all_reduce(xb[0] @ w, "x")        # sum over ranks of the local products
    return jnp.sum((s - y) ** 2)
  g = jax.grad(loss)(wb[0])                      # local contribution
  return jaxll.all_reduce(g, "x")[None]          # the full gradient, on every rank


xg = global_array(mesh, P("x"), xs_full)
wg = global_array(mesh, P("x"), np.broadcast_to(w0, (n, d, k)).copy())
step = jax.jit(jax.shard_map(train_step, mesh=mesh, in_specs=(P("x"), P("x")),
                             out_specs=P("x")))
g = np.asarray(compiled(step, xg, wg)(xg, wg).addressable_data(0)[0], np.float64)
x64 = xs_full.astype(np.float64)
s = sum(x64[r] @ w0 for r in range(n))
g_ref = sum(x64[r].T @ (2 * (s - y)) for r in range(n))
check("grad", g, g_ref, 1e-4 * np.abs(g_ref) + 1e-3)

section("latency")
# 5. Latency at 4 KB: a jitted chain of dependent calls, per call.
if opts.latency:
  chain = 50
  xl = global_array(mesh, P("x"), rows((n,), 1024, np.float32, seed=1) * 1e-3)
  names = ("auto", "oneshot_ll", "oneshot_sentinel", "oneshot_barrier")
  programs, samples = {}, {a: [] for a in names}
  for algorithm in names:
    def body(v, a=algorithm):
      w = v
      for _ in range(chain):
        w = v + jaxll.all_reduce(w, "x", algorithm=a)
      return w
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    programs[algorithm] = compiled(f, xl)
    jax.block_until_ready(programs[algorithm](xl))
    report.setdefault("latency_path", {})[algorithm] = jaxll.explain(f, xl)[0].algorithm

  # The floor of the same chain in the same setting: jaxll's empty-kernel custom
  # call in place of the all-reduce (no communication, no waiting for peers).
  def floor_body(v):
    w = v
    for _ in range(chain):
      w = v + jax.ffi.ffi_call("jaxll_noop", jax.ShapeDtypeStruct(w.shape, w.dtype),
                               input_output_aliases={0: 0})(w)
    return w
  names += ("floor",)
  samples["floor"] = []
  programs["floor"] = compiled(jax.jit(jax.shard_map(floor_body, mesh=mesh, in_specs=P("x"),
                                                     out_specs=P("x"))), xl)
  jax.block_until_ready(programs["floor"](xl))
  for _ in range(10):  # rounds over the algorithms, so drifts hit all of them alike
    for algorithm in names:
      for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(programs[algorithm](xl))
        samples[algorithm].append((time.perf_counter() - t0) * 1e6 / chain)
  report["latency_us"] = {a: float(np.median(samples[a])) for a in names}

section("done")
jaxll.check_errors()
launch.report(report)
