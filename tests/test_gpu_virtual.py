"""GPU tier, one GPU: the kernels through N virtual ranks, and the JAX path on a
one-device mesh. Marked ``gpu``: skipped where JAX sees no CUDA GPU.

Run with:  pytest -m gpu tests
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll
from jaxll import algorithms
from jaxll.tools import testing as jt

pytestmark = pytest.mark.gpu

FLOATS = [np.float32, jnp.bfloat16, np.float16]
DTYPES = FLOATS + [np.int32]
KERNELS = algorithms.KERNELS
REPRODUCIBLE = [k for k in KERNELS if algorithms.SPECS[k].reproducible]
WITH_MAX_MIN = [k for k in KERNELS if "max" in algorithms.SPECS[k].ops]
# Tolerance relative to sum(|x|): f32 accumulates in f32; f16/bf16 accumulate in
# f32 and round once, so the result is within one rounding of the exact value.
REL_TOL = {"float32": 2e-6, "bfloat16": 2 ** -8, "float16": 2 ** -11, "int32": 0}
# LL128-atomic adds in the element type, once per rank.
EPS = {"float32": 2 ** -23, "bfloat16": 2 ** -7, "float16": 2 ** -10}


def _name(d):
  return np.dtype(d).name


def _supported(algorithm, dtype, op="sum"):
  return algorithms.kernel_limits(algorithm, np.dtype(dtype), op) is None


def _cases(algos, dtypes, op="sum"):
  return [(a, d) for a in algos for d in dtypes if _supported(a, d, op)]


def _bits(a):
  a = np.asarray(a)
  return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _inputs(n, count, dtype, seed):
  rng = np.random.default_rng(seed)
  if np.dtype(dtype) == np.int32:
    return rng.integers(-1000, 1000, size=(n, count)).astype(np.int32)
  return (rng.standard_normal((n, count)) * 3).astype(dtype)


def _reference(x, op):
  x64 = np.asarray(x).astype(np.float64)
  return {"sum": x64.sum(0), "max": x64.max(0), "min": x64.min(0)}[op]


def _check(x, out, op, algorithm="oneshot_ll"):
  out = np.asarray(out)
  assert out.shape == x.shape and out.dtype == x.dtype
  rows = _bits(out)
  assert (rows == rows[0:1]).all(), "ranks disagree bitwise"
  ref = _reference(x, op)
  got = out[0].astype(np.float64)
  name = np.dtype(x.dtype).name
  rel = REL_TOL[name]
  if not algorithms.SPECS[algorithm].reproducible:
    rel = x.shape[0] * EPS[name]
  tol = rel * np.abs(np.asarray(x).astype(np.float64)).sum(0)
  if op != "sum":
    tol = np.zeros_like(tol)  # max/min are exact
  bad = ~(np.abs(got - ref) <= tol)  # (NaN, what a rank that gave up writes, is never within)
  assert not bad.any(), (f"{bad.sum()} of {bad.size} elements off; first at "
                         f"{np.argmax(bad)}: got {got[bad][0]}, want {ref[bad][0]}")


@pytest.mark.parametrize("algorithm,dtype", _cases(KERNELS, DTYPES),
                         ids=lambda v: v if isinstance(v, str) else _name(v))
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_sum_matches_float64_reference(n, algorithm, dtype):
  # 300_001 f32 elements take several rounds of a one-shot kernel at N=8
  for i, count in enumerate([1, 3, 17, 255, 4097, 65_539, 300_001]):
    x = _inputs(n, count, dtype, seed=1000 * n + i)
    _check(x, jt.virtual_all_reduce(x, algorithm=algorithm), "sum", algorithm)
  jaxll.check_errors()


@pytest.mark.parametrize("algorithm", KERNELS)
def test_large_messages_checked_on_device(algorithm):
  """Up to 64 MB per rank (odd element counts), every N and float dtype, each
  output element checked on the device against the rank-order reduction (or,
  for LL128-atomic, the float64 sum) and the guard elements around it."""
  for n in (2, 3, 4, 8):
    for dtype in FLOATS:
      item = np.dtype(dtype).itemsize
      counts = [(64 << 20) // item - 3, (5 << 20) // item + 7]
      res = jt.stress(n, counts, dtype=_name(dtype), algorithm=algorithm, seed=n,
                      max_delay_us=0)
      assert res["error"] == "" and res["mismatches"] == 0, (n, _name(dtype), res)


@pytest.mark.parametrize("algorithm", KERNELS)
def test_256_megabyte_messages(algorithm):
  """256 MB per rank plus an odd tail (hundreds of rounds), N = 2 and 8, checked
  element by element on the device."""
  for n in (2, 8):
    for dtype in (np.float32, jnp.bfloat16):
      item = np.dtype(dtype).itemsize
      res = jt.stress(n, [(256 << 20) // item + 5], dtype=_name(dtype), algorithm=algorithm,
                      seed=n, max_delay_us=0)
      assert res["error"] == "" and res["mismatches"] == 0, (n, _name(dtype), res)


@pytest.mark.parametrize("algorithm,dtype", _cases(WITH_MAX_MIN, DTYPES, "max"),
                         ids=lambda v: v if isinstance(v, str) else _name(v))
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("n", [3, 8])
def test_max_min(n, op, algorithm, dtype):
  for i, count in enumerate([1, 7, 1000, 33_333]):
    x = _inputs(n, count, dtype, seed=7 + i)
    _check(x, jt.virtual_all_reduce(x, op=op, algorithm=algorithm), op, algorithm)
  jaxll.check_errors()


@pytest.mark.parametrize("algorithm,dtype", _cases(KERNELS, FLOATS),
                         ids=lambda v: v if isinstance(v, str) else _name(v))
def test_special_values(algorithm, dtype):
  dt = np.dtype(dtype)
  finfo = jnp.finfo(dt)
  sentinel = np.frombuffer(b"\xff" * dt.itemsize, dtype=dt)[0]  # all ones: the sentinel
  tiny = np.array(finfo.smallest_subnormal, dtype=dt)
  inf = np.array(np.inf, dtype=dt)
  # columns: rank 0 and rank 1 contributions, then the expected sum
  cases = [
      (np.nan, 1.0, np.nan),
      (sentinel, 0.0, np.nan),
      (0.0, sentinel, np.nan),
      (sentinel, sentinel, np.nan),
      (inf, 1.0, np.inf),
      (-inf, -1.0, -np.inf),
      (inf, -inf, np.nan),
      (-0.0, -0.0, -0.0),
      (-0.0, 0.0, 0.0),
      (tiny, tiny, 2 * tiny.astype(np.float64)),
      (tiny, -tiny, 0.0),
      (finfo.max, 0.0, finfo.max),
  ]
  x = np.array([[c[0] for c in cases], [c[1] for c in cases]], dtype=dt)
  want = np.array([c[2] for c in cases], dtype=np.float64).astype(dt)
  if algorithm == "twoshot_ll128_atomic":
    # Documented properties of the atomic adds: a sum of negative zeros is +0.0,
    # and f32 adds flush subnormals to zero (PTX red.add.f32).
    want[7] = 0.0
    if dt == np.float32:
      want[9] = 0.0
  for reps in (1, 40):  # also as a longer message: many units carry the pattern
    xr = np.tile(x, (1, reps))
    out = np.asarray(jt.virtual_all_reduce(xr, algorithm=algorithm))
    assert (_bits(out) == _bits(out)[0:1]).all()
    got = out[0].reshape(reps, -1)
    for row in got:
      # (compared as float32: the conversion is exact, and NaN == NaN here)
      np.testing.assert_array_equal(row.astype(np.float32), want.astype(np.float32))
      assert np.array_equal(np.signbit(row[~np.isnan(want.astype(np.float32))]),
                            np.signbit(want[~np.isnan(want.astype(np.float32))])), "sign lost"
  if "max" in algorithms.SPECS[algorithm].ops:
    mx = np.asarray(jt.virtual_all_reduce(x, op="max", algorithm=algorithm))
    assert (_bits(mx) == _bits(mx)[0:1]).all()
    assert np.isnan(mx[0][:4].astype(np.float32)).all() and mx[0][4] == inf


def _mixed_counts(rng, calls, small_max=2048, big_max=200_000):
  """Mostly small messages, some large enough to take several blocks and rounds."""
  small = rng.integers(1, small_max, size=calls - calls // 10)
  large = rng.integers(small_max, big_max, size=calls // 10)
  return rng.permutation(np.concatenate([small, large]))


def test_stress_hundred_thousand_calls_mixing_algorithms():
  """10^5 consecutive calls at N=8, cycling through every algorithm, sizes from
  1 element to 800 KB, ranks skewed by random delays."""
  rng = np.random.default_rng(5)
  counts = _mixed_counts(rng, 100_000)
  res = jt.stress(8, counts, algorithm=list(KERNELS), seed=5, max_delay_us=10)
  assert res["error"] == "" and res["calls"] == 100_000, res
  assert res["mismatches"] == 0, res


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_stress_many_rounds(n):
  """Tiny scratch (2 KiB per round): most calls take many rounds, so the
  double buffering between rounds is exercised on every call."""
  cfg = jaxll.WorkspaceConfig(scratch_bytes=2048)
  counts = _mixed_counts(np.random.default_rng(n), 10_000, 512, 20_000)
  res = jt.stress(n, counts, algorithm=list(KERNELS), seed=n, max_delay_us=10, config=cfg)
  assert res["error"] == "" and res["calls"] == 10_000
  assert res["mismatches"] == 0, res


@pytest.mark.parametrize("dtype,op", [("bfloat16", "sum"), ("float16", "sum"),
                                      ("int32", "sum"), ("float32", "max"),
                                      ("bfloat16", "min"), ("int32", "max")])
def test_stress_dtypes_and_ops(dtype, op):
  names = [a for a in KERNELS if _supported(a, jnp.dtype(dtype), op)]
  counts = np.random.default_rng(1).integers(1, 40_000, size=2000)
  res = jt.stress(8, counts, dtype=dtype, op=op, algorithm=names, seed=3, max_delay_us=10)
  assert res["error"] == "" and res["mismatches"] == 0, res


@pytest.mark.parametrize("start", [2 ** 32 - 40, 2 ** 33 - 1, 3 * 2 ** 30 - 7])
def test_epochs_cross_the_flag_wrap_and_refresh(start):
  """Block epochs set close to the 32-bit flag wrap and to the LL16 refresh
  epochs (every 2^30, both parities), starting on either parity: calls keep
  working across them."""
  cfg = jaxll.WorkspaceConfig(scratch_bytes=4096)
  ws = jt.virtual_workspace(3, config=cfg)
  jt.set_epochs(ws, start)
  counts = np.random.default_rng(2).integers(1, 5000, size=300)
  res = jt.stress(3, counts, algorithm=list(KERNELS), seed=2, max_delay_us=5, config=cfg)
  assert res["error"] == "" and res["mismatches"] == 0, res


@pytest.mark.parametrize("algorithm", KERNELS)
def test_timeout_is_reported_not_hung(algorithm):
  """A rank that skips a call leaves its peers waiting: they must give up after
  the timeout, poison their output and report who waited for whom, never hang."""
  cfg = jaxll.WorkspaceConfig(timeout_ms=200)
  x = _inputs(3, 5000, np.float32, seed=0)
  out = np.asarray(jt.virtual_all_reduce(x, config=cfg, algorithm=algorithm, _skip_rank=1))
  # ranks 0 and 2 waited for rank 1, gave up and poisoned (at least part of) their rows
  assert (_bits(out[0]) == 0xFFFFFFFF).any() and (_bits(out[2]) == 0xFFFFFFFF).any()
  with pytest.raises(jaxll.CollectiveTimeoutError, match=r"waited more than 200 ms for rank"):
    jaxll.check_errors()
  with pytest.raises(Exception, match="gave up"):
    np.asarray(jt.virtual_all_reduce(x, config=cfg, algorithm=algorithm))
  res = jt.stress(3, [10, 20], config=cfg, algorithm=algorithm)
  assert "gave up" in res["error"]
  jaxll.free_workspaces()
  assert jaxll.errors() == []


def test_jitted_chain_of_virtual_calls():
  n = 4
  x = _inputs(n, 999, np.float32, seed=11)

  @jax.jit
  def chain(v):
    for _ in range(20):
      v = jt.virtual_all_reduce(v) * np.float32(1.0 / n)
    return v

  out = np.asarray(chain(x))
  want = x.astype(np.float64).sum(0) / n  # averaging is idempotent after the first call
  np.testing.assert_allclose(out[0], want, rtol=1e-5, atol=1e-5)
  assert (_bits(out) == _bits(out)[0:1]).all()


@pytest.mark.parametrize("command_buffer,protocol", [(False, "auto"), (True, "auto"),
                                                     (True, "sentinel")])
def test_jitted_chain_of_virtual_fused_calls(command_buffer, protocol):
  # the jittable virtual fused call (and its command-buffer twin), in a chain
  # as benchmarks/fused_rmsnorm.py --virtual runs it: each step equals the
  # numpy-driven tool's result for the same inputs, and a chain of 12 steps is
  # bitwise equal across ranks and to the same steps taken one at a time
  n, tokens, hidden = 4, 3, 2048
  rng = np.random.default_rng(5)
  x = rng.standard_normal((n, tokens, hidden)).astype(jnp.bfloat16)
  res = np.broadcast_to(rng.standard_normal((tokens, hidden)).astype(jnp.bfloat16),
                        (n, tokens, hidden))
  w = (1 + 0.1 * rng.standard_normal(hidden)).astype(jnp.bfloat16)
  step = lambda a, r, w: jt.virtual_fused_rmsnorm(a, r, w, command_buffer=command_buffer,
                                                  protocol=protocol)
  normed, new = (np.asarray(v) for v in jax.jit(step)(x, res, w))
  want_normed, want_new = jt.virtual_all_reduce_rmsnorm(x, res[0], w, protocol=protocol)
  np.testing.assert_array_equal(normed.view(np.uint16), want_normed.view(np.uint16))
  np.testing.assert_array_equal(new.view(np.uint16), want_new.view(np.uint16))

  @jax.jit
  def chain(a, r, w):
    for _ in range(12):
      a, r = step(a, r, w)
    return a, r

  a, r = (np.asarray(v) for v in chain(x, res, w))
  b, q = x, res
  for _ in range(12):
    b, q = (np.asarray(v) for v in jax.jit(step)(b, q, w))
  for got, want in ((a, b), (r, q)):
    assert np.isfinite(got.astype(np.float32)).all()
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert (got.view(np.uint16) == got[0:1].view(np.uint16)).all()
  with pytest.raises(ValueError, match="residual must have"):
    jt.virtual_fused_rmsnorm(x, res[0], w)
  jaxll.check_errors()


@pytest.mark.parametrize("algorithm", KERNELS)
@pytest.mark.parametrize("n", [2, 3, 8])
def test_one_launch_all_reduce(n, algorithm):
  # every rank's blocks in one launch (GroupArgs, blockIdx.y the rank): the
  # reduction as the float64 reference has it, bitwise equal across ranks and,
  # for the reproducible kernels, to the same call forked onto the ranks'
  # streams; sizes from one unit to several rounds; then 24 calls in a jitted
  # chain captured into a command buffer, each call's output the next one's
  # input with nothing between them (group grids back to back, launching early
  # under PDL where the grid allows it)
  for i, count in enumerate([1, 17, 4097, 65_539, 300_001]):
    for dtype in (np.float32, jnp.bfloat16):
      if not _supported(algorithm, dtype):
        continue
      x = _inputs(n, count, dtype, seed=50 * n + i)
      one = np.asarray(jt.virtual_all_reduce(x, algorithm=algorithm, one_launch=True))
      _check(x, one, "sum", algorithm)
      if algorithms.SPECS[algorithm].reproducible:
        forked = np.asarray(jt.virtual_all_reduce(x, algorithm=algorithm))
        np.testing.assert_array_equal(_bits(one), _bits(forked))
  x = _inputs(n, 999, np.float32, seed=12)
  steps = 24

  def chain(v, one_launch):
    for _ in range(steps):
      v = jt.virtual_all_reduce(v, algorithm=algorithm, command_buffer=True,
                                one_launch=one_launch)
    return v

  out = np.asarray(jax.jit(chain, static_argnums=1)(x, True))
  # (call k > 1 adds N equal rows: n^(steps-1) times the first call's sum, each
  # call's rounding within (N - 1) eps of its magnitude)
  scale = float(n) ** (steps - 1)
  x64 = x.astype(np.float64)
  bound = scale * np.abs(x64).sum(0) * steps * n * EPS["float32"]
  err = np.abs(out[0].astype(np.float64) - scale * x64.sum(0))
  assert (err <= bound).all(), (err - bound).max()
  assert (_bits(out) == _bits(out)[0:1]).all()
  if algorithms.SPECS[algorithm].reproducible:
    np.testing.assert_array_equal(_bits(out), _bits(jax.jit(chain, static_argnums=1)(x, False)))
  jaxll.check_errors()


@pytest.mark.parametrize("protocol", ["auto", "ll", "sentinel", "twoshot_ll", "twoshot_sentinel"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_one_launch_fused_equals_forked(n, protocol):
  # the fused kernel (general, decode-shape and two-shot cuts, clustered or
  # not) with every rank in one launch: bitwise what the same call forked onto
  # the ranks' streams gives, per rank (residuals differ across ranks), one
  # call per shape, and for the first shape a jitted chain of 12 captured into
  # a command buffer
  rng = np.random.default_rng(n)
  cuts, chained = set(), False
  for tokens, hidden, dtype in ((1, 8192, jnp.bfloat16), (2, 8192, jnp.bfloat16),
                                (16, 8192, jnp.bfloat16), (64, 8192, jnp.bfloat16),
                                (3, 2048, np.float32), (5, 16384, jnp.bfloat16)):
    x = rng.standard_normal((n, tokens, hidden)).astype(dtype)
    res = rng.standard_normal((n, tokens, hidden)).astype(dtype)
    w = (1 + 0.1 * rng.standard_normal(hidden)).astype(dtype)
    plan = jt.rmsnorm_plan(n, tokens, hidden, dtype=dtype, protocol=protocol)
    if plan["blocks"] == 0:  # (the protocol named cannot serve this shape)
      continue
    cuts.add((plan["lean"], plan["twoshot"], plan["cluster"] > 1, plan["pdl"]))
    step = lambda a, r, w, one, cb=False: jt.virtual_fused_rmsnorm(
        a, r, w, eps=1e-5, protocol=protocol, one_launch=one, command_buffer=cb)
    got = [np.asarray(v) for v in jax.jit(step, static_argnums=3)(x, res, w, True)]
    want = [np.asarray(v) for v in jax.jit(step, static_argnums=3)(x, res, w, False)]
    for g, v in zip(got, want):
      assert np.isfinite(g.astype(np.float32)).all()
      np.testing.assert_array_equal(_bits(g), _bits(v))

    if chained:
      continue  # (the chain for the first shape served only)
    chained = True

    def chain(a, r, w, one):
      for _ in range(12):
        a, r = step(a, r, w, one, True)
      return a, r

    got = [np.asarray(v) for v in jax.jit(chain, static_argnums=3)(x, res, w, True)]
    want = [np.asarray(v) for v in jax.jit(chain, static_argnums=3)(x, res, w, False)]
    for g, v in zip(got, want):
      np.testing.assert_array_equal(_bits(g), _bits(v))
  assert cuts, "no shape ran"
  if protocol == "ll":  # (64 rows of 8192: the general kernel's cut)
    assert any(not lean and not two for lean, two, _, _ in cuts), cuts
  cc = getattr(jax.devices("cuda")[0], "compute_capability", "0")
  if n == 2 and protocol in ("auto", "ll", "sentinel") and float(cc) >= 9.0:
    # (rows of 8192 at 1 and 2 tokens go as clusters where the device launches
    # them: the group twins' clusters, which lie along x, must have run)
    assert any(clustered for _, _, clustered, _ in cuts), cuts
  jaxll.check_errors()


def test_device_ordinal_is_local_hardware_id():
  for dev in jax.devices("cuda"):
    assert jt.device_ordinal(dev) == dev.local_hardware_id


@pytest.fixture()
def mesh_1gpu():
  return jax.make_mesh((1,), ("tp",), devices=jax.devices("cuda")[:1])


def test_one_device_mesh_through_shard_map(mesh_1gpu):
  mesh = mesh_1gpu
  x = jax.device_put(_inputs(1, 4097, np.float32, seed=5)[0], NamedSharding(mesh, P("tp")))

  def body(v):
    a = jaxll.all_reduce(v, "tp", algorithm="oneshot_ll")
    b = jaxll.all_reduce(a * 2, "tp", algorithm="oneshot_ll", op="max")
    c = jaxll.all_reduce(v.astype(jnp.bfloat16), "tp", algorithm="oneshot_ll")
    return a + b + c.astype(jnp.float32)

  def ref(v):
    return v + 2 * v + v.astype(jnp.bfloat16).astype(jnp.float32)

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))
  sites = jaxll.explain(f, x)
  assert [s.algorithm for s in sites] == ["oneshot_ll"] * 3
  assert len({s.workspace for s in sites}) == 1 and sites[0].workspace > 0
  assert "jaxll_all_reduce" in f.lower(x).as_text()
  for _ in range(2):  # the same program twice in a row
    np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(ref(x)))

  # auto on a group of one device leaves the (free) all-reduce to XLA
  g = jax.jit(jax.shard_map(lambda v: jaxll.all_reduce(v, "tp"), mesh=mesh,
                            in_specs=P("tp"), out_specs=P("tp")))
  assert jaxll.explain(g, x)[0].algorithm == "xla"
  np.testing.assert_array_equal(np.asarray(g(x)), np.asarray(x))


@pytest.mark.parametrize("algorithm", KERNELS)
def test_every_algorithm_through_shard_map(mesh_1gpu, algorithm):
  """The FFI path of each kernel on a one-device mesh (a group of one rank)."""
  mesh = mesh_1gpu
  x = jax.device_put(_inputs(1, 70_001, np.float32, seed=9)[0], NamedSharding(mesh, P("tp")))
  f = jax.jit(jax.shard_map(lambda v: jaxll.all_reduce(v, "tp", algorithm=algorithm),
                            mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))
  assert jaxll.explain(f, x)[0].algorithm == algorithm
  for _ in range(3):
    np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(x))
  if "max" in algorithms.SPECS[algorithm].ops:
    g = jax.jit(jax.shard_map(lambda v: jaxll.all_reduce(v, "tp", op="max", algorithm=algorithm),
                              mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))
    np.testing.assert_array_equal(np.asarray(g(x)), np.asarray(x))
  xi = jax.device_put(np.arange(1000, dtype=np.int32), NamedSharding(mesh, P("tp")))
  h = jax.jit(jax.shard_map(lambda v: jaxll.all_reduce(v, "tp", algorithm=algorithm),
                            mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))
  if _supported(algorithm, np.int32):
    np.testing.assert_array_equal(np.asarray(h(xi)), np.asarray(xi))
  else:
    with pytest.raises(jaxll.AlgorithmUnavailableError, match="int32"):
      h.lower(xi)


def test_two_functions_share_one_workspace(mesh_1gpu):
  mesh = mesh_1gpu
  x = jax.device_put(np.arange(300, dtype=np.float32), NamedSharding(mesh, P("tp")))
  f = jax.jit(jax.shard_map(lambda v: jaxll.all_reduce(v, "tp", algorithm="oneshot_ll"),
                            mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))
  g = jax.jit(jax.shard_map(lambda v: jaxll.all_reduce(v * 3, "tp", algorithm="oneshot_ll"),
                            mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))
  before = {w.id for w in jaxll.workspaces()}
  for _ in range(3):
    np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(x))
    np.testing.assert_array_equal(np.asarray(g(x)), np.asarray(x) * 3)
  (site_f,), (site_g,) = jaxll.explain(f, x), jaxll.explain(g, x)
  assert site_f.workspace == site_g.workspace
  new = {w.id for w in jaxll.workspaces()} - before
  assert len(new) <= 1


def test_loop_inside_jit_keeps_epochs_on_device(mesh_1gpu):
  mesh = mesh_1gpu
  x = jax.device_put(np.linspace(-1, 1, 1000, dtype=np.float32), NamedSharding(mesh, P("tp")))

  def body(v):
    return jax.lax.fori_loop(
        0, 500, lambda i, a: jaxll.all_reduce(a, "tp", algorithm="oneshot_ll") + 1.0, v)

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("tp"), out_specs=P("tp"),
                            check_vma=False))
  np.testing.assert_allclose(np.asarray(f(x)), np.asarray(x) + 500, rtol=1e-6)


# XLA flags that let XLA reorder or overlap independent work: command buffers
# built from buffer dependencies alone (independent calls become parallel graph
# branches), and the latency-hiding scheduler.
CONCURRENCY_FLAGS = ["--xla_gpu_command_buffer_scheduling_mode=CONCURRENT",
                     "--xla_gpu_enable_latency_hiding_scheduler=true"]


@pytest.mark.parametrize("flags", CONCURRENCY_FLAGS + [""])
def test_independent_calls_stay_ordered(flags):
  # 16 independent call sites on one workspace, 300 runs, in a fresh process (XLA
  # reads its flags once): the order chain of jaxll/ordering.py keeps them in
  # program order, one at a time.
  import os
  import subprocess
  import sys
  script = os.path.join(os.path.dirname(__file__), "gpu_scripts", "independent_calls.py")
  env = dict(os.environ, XLA_FLAGS=flags, JAXLL_TIMEOUT_MS="5000",
             XLA_PYTHON_CLIENT_PREALLOCATE="false")
  out = subprocess.run([sys.executable, script, "300"], env=env, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0 and "INDEPENDENT_CALLS OK 4800" in out.stdout, (
      out.stdout[-2000:], out.stderr[-4000:])
