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
import jaxll.testing as jt

pytestmark = pytest.mark.gpu

DTYPES = [np.float32, jnp.bfloat16, np.float16, np.int32]
# Tolerance relative to sum(|x|): f32 accumulates in f32; f16/bf16 accumulate in
# f32 and round once, so the result is within one rounding of the exact value.
REL_TOL = {"float32": 2e-6, "bfloat16": 2 ** -8, "float16": 2 ** -11, "int32": 0}


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


def _check(x, out, op):
  out = np.asarray(out)
  assert out.shape == x.shape and out.dtype == x.dtype
  rows = _bits(out)
  assert (rows == rows[0:1]).all(), "ranks disagree bitwise"
  ref = _reference(x, op)
  got = out[0].astype(np.float64)
  tol = REL_TOL[np.dtype(x.dtype).name] * np.abs(np.asarray(x).astype(np.float64)).sum(0)
  if op != "sum":
    tol = np.zeros_like(tol)  # max/min are exact
  bad = np.abs(got - ref) > tol
  assert not bad.any(), (f"{bad.sum()} of {bad.size} elements off; first at "
                         f"{np.argmax(bad)}: got {got[bad][0]}, want {ref[bad][0]}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_sum_matches_float64_reference(n, dtype):
  item = np.dtype(dtype).itemsize
  cap = jt.virtual_workspace(n).capacity_bytes // item
  sizes = [1, 2, 3, 5, 8, 17, 255, 256, 1000, 4097, 65_539, cap - 3, cap]
  for i, count in enumerate(sizes):
    x = _inputs(n, count, dtype, seed=1000 * n + i)
    _check(x, jt.virtual_all_reduce(x), "sum")


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.float16, np.int32],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("n", [3, 8])
def test_max_min(n, op, dtype):
  for i, count in enumerate([1, 7, 1000, 33_333]):
    x = _inputs(n, count, dtype, seed=7 + i)
    _check(x, jt.virtual_all_reduce(x, op=op), op)


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.float16],
                         ids=lambda d: np.dtype(d).name)
def test_special_values(dtype):
  dt = np.dtype(dtype)
  finfo = jnp.finfo(dt)
  nan_all_ones = np.frombuffer(b"\xff" * dt.itemsize, dtype=dt)[0]
  tiny = np.array(finfo.smallest_subnormal, dtype=dt)
  inf = np.array(np.inf, dtype=dt)
  # columns: rank 0 and rank 1 contributions, then the expected sum
  cases = [
      (np.nan, 1.0, np.nan),
      (nan_all_ones, 0.0, np.nan),
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
  out = np.asarray(jt.virtual_all_reduce(x))
  assert (_bits(out) == _bits(out)[0:1]).all()
  # (compared as float32: the conversion is exact, and NaN == NaN for this check)
  np.testing.assert_array_equal(out[0].astype(np.float32), want.astype(np.float32))
  assert np.array_equal(np.signbit(out[0]), np.signbit(want)), "sign of zero lost"
  # max/min propagate NaN like XLA's
  mx = np.asarray(jt.virtual_all_reduce(x, op="max"))[0]
  assert np.isnan(mx[0]) and np.isnan(mx[1]) and mx[2] == inf


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_stress_ten_thousand_calls(n):
  rng = np.random.default_rng(n)
  cap = jt.virtual_workspace(n).capacity_bytes // 4
  # Mostly small messages (one block), some multi-block ones up to the capacity.
  small = rng.integers(1, 2048, size=8000)
  large = rng.integers(2048, cap + 1, size=2000)
  counts = rng.permutation(np.concatenate([small, large]))
  res = jt.stress(n, counts, dtype="float32", seed=n, max_delay_us=20)
  assert res["error"] == ""
  assert res["calls"] == 10_000
  assert res["mismatches"] == 0, res


@pytest.mark.parametrize("dtype,op", [("bfloat16", "sum"), ("float16", "sum"),
                                      ("int32", "sum"), ("float32", "max"),
                                      ("bfloat16", "min")])
def test_stress_dtypes_and_ops(dtype, op):
  counts = np.random.default_rng(1).integers(1, 40_000, size=1500)
  res = jt.stress(8, counts, dtype=dtype, op=op, seed=3, max_delay_us=10)
  assert res["error"] == "" and res["mismatches"] == 0, res


def test_timeout_is_reported_not_hung():
  """A rank that skips a call leaves its peers waiting: they must give up after
  the timeout, poison their output and report who waited for whom, never hang."""
  cfg = jaxll.WorkspaceConfig(timeout_ms=200)
  x = _inputs(3, 100, np.float32, seed=0)
  out = np.asarray(jt.virtual_all_reduce(x, config=cfg, _skip_rank=1))
  # ranks 0 and 2 waited for rank 1, gave up and poisoned their rows
  assert (_bits(out[0]) == 0xFFFFFFFF).all() and (_bits(out[2]) == 0xFFFFFFFF).all()
  with pytest.raises(jaxll.CollectiveTimeoutError, match=r"waited more than 200 ms for rank 1"):
    jaxll.check_errors()
  with pytest.raises(Exception, match="gave up"):
    np.asarray(jt.virtual_all_reduce(x, config=cfg))
  res = jt.stress(3, [10, 20], config=cfg)
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
