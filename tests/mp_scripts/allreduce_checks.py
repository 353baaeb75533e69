"""One process of a jaxll end-to-end check (run by jaxll.tools.launch): every process
joins jax.distributed and the checks run the real jit + shard_map path over the
global mesh, whatever the layout: one process driving several GPUs (peer
access), one process per GPU or N processes sharing one GPU (CUDA IPC), or
processes that each drive several GPUs (both). Reports, per case, whether every
local shard matched the float64 reference and one hash of the output bits (the
local shards of a group must agree bit for bit, or the case fails here), so the
launcher can check that ranks in other processes agree too.

  python allreduce_checks.py [--steps 1000] [--stress 480] [--latency]
  python allreduce_checks.py --platform cpu --cpu-devices 4 ...

With ``--platform cpu`` (a dry run of these checks on CPU devices, for CI) every
call site lowers to XLA's all-reduce, so only ``auto`` is exercised and its
path must be ``xla``.
"""
import argparse
import hashlib
import os
import time
import zlib

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--stress", type=int, default=480,
                    help="runs of the mixed program (24 call sites each on GPU)")
parser.add_argument("--latency", action="store_true")
parser.add_argument("--platform", choices=("gpu", "cpu"), default="gpu")
parser.add_argument("--cpu-devices", type=int, default=1)
opts = parser.parse_args()
GPU = opts.platform == "gpu"
if not GPU:
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={opts.cpu_devices}"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

if not GPU:
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_cpu_collectives_implementation", "gloo")

from jaxll.tools import launch  # noqa: E402

pid = launch.init_worker()
jax.config.update("jax_default_matmul_precision", "highest")  # f32 matmuls, not TF32
import jaxll  # noqa: E402
from jaxll import algorithms  # noqa: E402

n = jax.device_count()
KERNELS = list(algorithms.KERNELS) if GPU else []
REL_TOL = {"float32": 2e-6, "bfloat16": 2 ** -8, "float16": 2 ** -11, "int32": 0}
EPS = {"float32": 2 ** -23, "bfloat16": 2 ** -7, "float16": 2 ** -10}
SIZES = [1, 777, 65_539, 1_500_001] if GPU else [1, 777, 65_539]  # up to 6 MB (f32)
report = {"pid": pid, "devices": [d.id for d in jax.local_devices()], "cases": {},
          "errors": [], "seconds": {}}
_t = [time.monotonic(), None]


def section(name):
  """A progress mark; the previous section's time goes into the report."""
  now = time.monotonic()
  if _t[1] is not None:
    report["seconds"][_t[1]] = round(now - _t[0], 1)
  _t[:] = [now, name]
  launch.progress(name)


def expect_path(f, *args, algorithm, count=None):
  """Every call site of `f` took `algorithm` (XLA everywhere on CPU)."""
  sites = jaxll.explain(f, *args)
  want = algorithm if GPU else "xla"
  got = [s.algorithm for s in sites]
  forced = algorithm != "auto" or not GPU
  if (count is not None and len(got) != count) or (forced and any(a != want for a in got)):
    report["errors"].append(f"paths {got}, expected {want}")
  return sites


def compiled(f, *args):
  """`f` compiled for `args`, once every process has compiled it too. Loading a
  module while the other processes' kernels already spin on a shared GPU
  waiting for this one is a hazard this test does not need to take."""
  c = f.lower(*args).compile()
  launch.barrier()
  return c


def rows(shape_lead, count, dtype, seed):
  """Every rank's input, generated identically in every process."""
  rng = np.random.default_rng(seed)
  if np.dtype(dtype) == np.int32:
    return rng.integers(-1000, 1000, size=(*shape_lead, count)).astype(np.int32)
  return (rng.standard_normal((*shape_lead, count)) * 3).astype(dtype)


def global_array(mesh, spec, full):
  """The global array whose blocks on this process's devices are cut from `full`."""
  sharding = NamedSharding(mesh, spec)
  idx = sharding.addressable_devices_indices_map(full.shape)
  return jax.make_array_from_single_device_arrays(
      full.shape, sharding, [jax.device_put(full[idx[d]], d) for d in idx])


def sum_tol(x64, dtype, path, axis=0):
  """Tolerance of a reduction over `axis` that took `path` (the algorithm a
  call site ran), relative to sum(|x|): one rounding of the exact sum for the
  kernels that accumulate in float32; a rounding per rank for those that add in
  the element type (LL128-atomic, and XLA's all-reduce)."""
  name = np.dtype(dtype).name
  rel = REL_TOL[name]
  if name != "int32" and (path == "xla" or not algorithms.SPECS[path].reproducible):
    rel = x64.shape[axis] * EPS[name]
  return rel * np.abs(x64).sum(axis)


def check(name, shards, ref, tol):
  """`shards`: this process's blocks of one group's result (each must equal
  `ref` within `tol`, and all must be the same bits)."""
  ok, hashes = True, set()
  for got in shards:
    got = np.asarray(got)
    hashes.add(hashlib.sha1(got.tobytes()).hexdigest())
    bad = np.abs(got.astype(np.float64) - ref) > tol
    if bad.any() and ok:  # the first failing shard tells enough
      ok = False
      i = int(np.argmax(bad.reshape(-1)))
      report["errors"].append(f"{name}: {int(bad.sum())} elements off, first {i}: "
                              f"{got.reshape(-1)[i]} vs {np.reshape(ref, -1)[i]}")
  if len(hashes) > 1:
    ok = False
    report["errors"].append(f"{name}: the ranks of this process differ")
  report["cases"][name] = {"ok": ok, "hash": min(hashes)}


def rows_of(out):
  """The first row of each local shard of a (n, ...) result sharded over its first axis."""
  return [s.data[0] for s in out.addressable_shards]


section("1-D mesh, every algorithm")
# 1. Every algorithm, dtype, op, on the 1-D mesh; four sizes per program (four call sites).
mesh = jax.make_mesh((n,), ("x",))
for algorithm in KERNELS + ["auto"]:
  for dtype in (np.float32, jnp.bfloat16, np.float16, np.int32):
    for op in ("sum", "max"):
      if algorithm != "auto" and algorithms.kernel_limits(algorithm, np.dtype(dtype), op):
        continue
      fulls = [rows((n,), c, dtype, seed=zlib.crc32(f"{algorithm}/{op}/{c}".encode()))
               for c in SIZES]
      xs = [global_array(mesh, P("x"), f) for f in fulls]
      f = jax.jit(jax.shard_map(
          lambda *vs, a=algorithm, o=op: [jaxll.all_reduce(v, "x", op=o, algorithm=a) for v in vs],
          mesh=mesh, in_specs=(P("x"),) * len(SIZES), out_specs=[P("x")] * len(SIZES)))
      sites = expect_path(f, *xs, algorithm=algorithm, count=len(SIZES))
      outs = compiled(f, *xs)(*xs)
      for c, full, out, site in zip(SIZES, fulls, outs, sites):
        x64 = full.astype(np.float64)
        ref = {"sum": x64.sum(0), "max": x64.max(0)}[op]
        tol = sum_tol(x64, dtype, site.algorithm) if op == "sum" else 0
        check(f"1d/{algorithm}/{np.dtype(dtype).name}/{op}/{c}", rows_of(out), ref, tol)

section("2-D mesh")
# 2. A 2-D mesh, reducing over each axis (auto and two forced kernels).
if n >= 4 and n % 2 == 0:
  mesh2 = jax.make_mesh((2, n // 2), ("a", "b"))
  for axis, red in (("b", 1), ("a", 0)):
    for algorithm in ["auto"] + (["twoshot_sentinel", "oneshot_ll"] if GPU else []):
      for c in (5, 70_001):
        full = rows((2, n // 2), c, np.float32, seed=c + red)
        x = global_array(mesh2, P("a", "b"), full)
        f = jax.jit(jax.shard_map(lambda v, a=algorithm, ax=axis: jaxll.all_reduce(v, ax, algorithm=a),
                                  mesh=mesh2, in_specs=P("a", "b"), out_specs=P("a", "b")))
        path = expect_path(f, x, algorithm=algorithm, count=1)[0].algorithm
        out = compiled(f, x)(x)
        x64 = full.astype(np.float64)
        ref = np.broadcast_to(x64.sum(red, keepdims=True), x64.shape)
        tol = np.broadcast_to(np.expand_dims(sum_tol(x64, np.float32, path, red), red),
                              x64.shape)
        groups = {}
        for s in out.addressable_shards:
          group = s.index[1 - red].start or 0  # position along the axis that is not reduced
          groups.setdefault(group, []).append(s)
        for group, shards in groups.items():
          idx = shards[0].index
          check(f"2d/{axis}/{algorithm}/{c}/group{group}", [s.data[0, 0] for s in shards],
                ref[idx][0, 0], tol[idx][0, 0])

section("consecutive steps")
# 3. Many consecutive steps inside one jitted loop (epochs and parities on the device).
x_full = rows((n,), 1000, np.float32, seed=99)
x = global_array(mesh, P("x"), x_full)
for algorithm in KERNELS + ["auto"]:
  f = jax.jit(jax.shard_map(
      lambda v, a=algorithm: jax.lax.fori_loop(
          0, opts.steps, lambda i, w: jaxll.all_reduce(w, "x", algorithm=a) * np.float32(1 / n), v),
      mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
  out = compiled(f, x)(x)
  mean = x_full.astype(np.float64).mean(0)
  # the first step averages; later ones average equal values (a rounding each)
  check(f"steps/{algorithm}", rows_of(out), mean, 1e-3 * np.abs(mean) + 1e-4)

section("stress")
# 4. Many calls of one program whose call sites mix every algorithm and three
# sizes. Every run must give the bits of the first (checked against float64)
# where the path is reproducible; where it is not (LL128-atomic: the order of the
# atomic adds varies from run to run when N > 2), within twice the tolerance of
# the first run, so within three times that of the exact sum.
if opts.stress:
  sites = [(a, c) for a in KERNELS + ["auto"] for c in (1, 1000, 20_001)]
  fulls = [rows((n,), c, np.float32, seed=c + 7 * i) for i, (a, c) in enumerate(sites)]
  xs = [global_array(mesh, P("x"), f) for f in fulls]
  f = jax.jit(jax.shard_map(
      lambda *vs: [jaxll.all_reduce(v, "x", algorithm=a) for v, (a, _) in zip(vs, sites)],
      mesh=mesh, in_specs=(P("x"),) * len(sites), out_specs=[P("x")] * len(sites)))
  paths = [site.algorithm for site in expect_path(f, *xs, algorithm="auto", count=len(sites))]
  fc = compiled(f, *xs)
  first = fc(*xs)
  tols = []
  for (a, c), full, out, path in zip(sites, fulls, first, paths):
    x64 = full.astype(np.float64)
    tol = sum_tol(x64, np.float32, path)
    check(f"stress/first/{a}/{c}", rows_of(out), x64.sum(0), tol)
    exact = path != "xla" and algorithms.SPECS[path].reproducible
    tols.append(None if exact else global_array(
        mesh, P("x"), np.broadcast_to(2 * tol, full.shape).astype(np.float32)))
  slack = [t for t in tols if t is not None]
  k = len(sites)

  def count_differences(*args):
    outs, firsts, ts = args[:k], args[k:2 * k], iter(args[2 * k:])
    return sum(jnp.sum(a != b) if t is None else jnp.sum(jnp.abs(a - b) > next(ts))
               for a, b, t in zip(outs, firsts, tols))[None]

  # per-rank counts, no cross-rank traffic
  differ = compiled(jax.jit(jax.shard_map(
      count_differences, mesh=mesh, in_specs=(P("x"),) * (2 * k + len(slack)),
      out_specs=P("x"))), *first, *first, *slack)
  counts = [differ(*fc(*xs), *first, *slack) for _ in range(opts.stress)]
  total = sum(int(np.asarray(s.data)[0]) for cnt in counts for s in cnt.addressable_shards)
  report["stress_calls"] = opts.stress * k
  if total:
    report["errors"].append(f"stress: {total} elements differ from the first run's")

section("loop")
# 4b. Calls before, inside and after a loop that do not depend on each other
# (the conjugate-gradient pattern: a dot product, the iteration loop, a norm
# after it). XLA may run the call after the loop first, or beside it, unless
# the order chain crosses the loop (jaxll/ordering.py); every run must give the
# first run's bits.
if opts.stress:
  la, lb, lc = (rows((n,), c, np.float32, seed=40 + c) for c in (33, 3000, 70_001))
  largs = [global_array(mesh, P("x"), v) for v in (la, lb, lc)]

  pick = (lambda a: a) if GPU else (lambda a: "xla")  # (CPU: XLA's all-reduce)

  def looped(a, b, c):
    pre = jaxll.all_reduce(a, "x", algorithm=pick("oneshot_ll"))
    loop = jax.lax.fori_loop(
        0, 10, lambda i, v: jaxll.all_reduce(v, "x", algorithm=pick("twoshot_ll")) * 0.5, b)
    post = jaxll.all_reduce(c, "x", algorithm=pick("oneshot_sentinel"))
    return pre, loop, post

  # (check_vma off: the loop carries a varying value into an invariant one)
  lf = compiled(jax.jit(jax.shard_map(looped, mesh=mesh, in_specs=(P("x"),) * 3,
                                      out_specs=(P("x"),) * 3, check_vma=False)), *largs)
  lfirst = lf(*largs)
  check("loop/before", rows_of(lfirst[0]), la.astype(np.float64).sum(0),
        sum_tol(la.astype(np.float64), np.float32, pick("oneshot_ll")))
  check("loop/after", rows_of(lfirst[2]), lc.astype(np.float64).sum(0),
        sum_tol(lc.astype(np.float64), np.float32, pick("oneshot_sentinel")))
  ref = [np.asarray(s.data) for o in lfirst for s in o.addressable_shards]
  runs = max(opts.stress // 4, 1)
  bad = 0
  for _ in range(runs):
    got = [np.asarray(s.data) for o in lf(*largs) for s in o.addressable_shards]
    bad += sum(int(np.sum(g.view(np.uint32) != r.view(np.uint32))) for g, r in zip(got, ref))
  report["loop_runs"] = runs
  if bad:
    report["errors"].append(f"loop: {bad} elements differ from the first run's")

section("training step")
# 5. A training step: gradient through the all-reduce, against the math.
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
g = compiled(step, xg, wg)(xg, wg)
x64 = xs_full.astype(np.float64)
s = sum(x64[r] @ w0 for r in range(n))
g_ref = sum(x64[r].T @ (2 * (s - y)) for r in range(n))
check("grad", rows_of(g), g_ref, 1e-4 * np.abs(g_ref) + 1e-3)

section("latency")
# 6. Latency at 4 KB: a jitted chain of dependent calls, per call.
if opts.latency:
  chain = 50
  xl = global_array(mesh, P("x"), rows((n,), 1024, np.float32, seed=1) * 1e-3)
  names = ("auto", "oneshot_ll", "oneshot_sentinel", "oneshot_barrier") if GPU else ("auto",)
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
  if GPU:
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
