"""GPU tier, one GPU, virtual ranks: the all-gather and reduce-scatter kernels
(ffi/kernels/gather_scatter.cu) on N = 1, 2, 3, 4, 8 ranks, LL16, sentinel and
barrier protocols, every dtype with a kernel, odd sizes and sizes of several
rounds.

- all-gather moves bits: every rank's output is exactly the ranks' pieces in
  rank order (NaN payloads, signed zeros and all), except that under the
  sentinel protocol a peer's element whose bits are all ones (the pattern)
  arrives as the canonical NaN.
- reduce-scatter adds in rank order, as the one-shot all-reduce does: rank r's
  piece is bitwise the piece r of jaxll's one-shot all-reduce of the same
  inputs, and within the float64 sum's rounding.
Marked ``gpu``."""

import numpy as np
import pytest

import jax.numpy as jnp
import jaxll
from jaxll.tools import testing as jt

pytestmark = pytest.mark.gpu

DTYPES = [np.float32, jnp.bfloat16, np.float16, np.int32]
ALGORITHMS = ["oneshot_ll", "oneshot_sentinel", "oneshot_barrier"]
# The canonical NaN the sentinel protocol sends in place of the all-ones pattern.
CANONICAL_NAN = {"float32": 0x7FC00000, "bfloat16": 0x7FC0, "float16": 0x7E00}


def _served(dtype, algorithm):
  if algorithm == "oneshot_sentinel" and np.dtype(dtype) == np.int32:
    pytest.skip("no sentinel kernel for int32 (all ones is a valid int32); "
                "test_sentinel_refuses_int32 checks the refusal")
COUNTS = [1, 3, 17, 1000, 4097, 65_539, 300_001]


def _bits(a):
  a = np.asarray(a)
  return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _random(shape, dtype, seed):
  rng = np.random.default_rng(seed)
  if np.dtype(dtype) == np.int32:
    return rng.integers(-1000, 1000, size=shape).astype(np.int32)
  return (rng.standard_normal(shape) * 3).astype(dtype)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_all_gather_moves_every_bit(n, dtype, algorithm):
  _served(dtype, algorithm)
  for i, count in enumerate(COUNTS):
    x = _random((n, count), dtype, seed=100 * n + i)
    if np.dtype(dtype).kind == "f":  # bit patterns arithmetic would not keep
      bits = _bits(x)
      bits[:, 0] = np.iinfo(bits.dtype).max  # all-ones: a NaN with a payload
      if count > 1:
        bits[:, 1] = bits.dtype.type(1 << (8 * bits.dtype.itemsize - 1))  # -0.0
    got = jt.virtual_all_gather(x, algorithm=algorithm)
    assert got.shape == (n, n, count) and got.dtype == x.dtype
    # what a peer's piece must arrive as
    sent = _bits(x).copy()
    if algorithm == "oneshot_sentinel":
      sent[sent == np.iinfo(sent.dtype).max] = CANONICAL_NAN[np.dtype(dtype).name]
    for r in range(n):
      want = sent.copy()
      want[r] = _bits(x)[r]  # (its own piece is copied, never sent)
      np.testing.assert_array_equal(_bits(got[r]), want, err_msg=f"rank {r}, count {count}")
  jaxll.check_errors()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_psum_scatter_is_the_all_reduce_piece(n, dtype, algorithm):
  _served(dtype, algorithm)
  for i, count in enumerate(COUNTS[:6]):
    x = _random((n, n, count), dtype, seed=200 * n + i)
    got = jt.virtual_psum_scatter(x, algorithm=algorithm)
    assert got.shape == (n, count) and got.dtype == x.dtype
    # the one-shot all-reduce of the same inputs, cut into pieces
    whole = jt.virtual_all_reduce(x.reshape(n, n * count), algorithm=algorithm)[0]
    for r in range(n):
      np.testing.assert_array_equal(_bits(got[r]), _bits(whole[r * count:(r + 1) * count]),
                                    err_msg=f"rank {r}, count {count}")
    want = x.astype(np.float64).sum(0)
    tol = {"float32": 2e-6, "bfloat16": 1.6e-2, "float16": 2e-3, "int32": 0}[np.dtype(dtype).name]
    scale = np.abs(x.astype(np.float64)).sum(0)
    for r in range(n):
      assert (np.abs(got[r].astype(np.float64) - want[r]) <= tol * scale[r]).all()
  jaxll.check_errors()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_through_shard_map_on_one_gpu(algorithm):
  # the FFI path (jaxll_gather_scatter custom calls, ordered with the all-reduce
  # chain) on a one-GPU mesh, forward and backward, against jax.lax
  import jax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P
  mesh = jax.make_mesh((1,), ("tp",), devices=jax.devices("cuda")[:1])
  x = jax.device_put(_random((6, 5), np.float32, seed=7), NamedSharding(mesh, P("tp")))

  def body(gather, scatter):
    def f(v):
      g = gather(v, "tp", tiled=True, **kw(gather))
      s = scatter(g * g, "tp", tiled=True, **kw(scatter))
      return s + gather(v, "tp", **kw(gather))[0]
    return f

  kw = lambda fn: {"algorithm": algorithm} if fn in (jaxll.all_gather, jaxll.psum_scatter) else {}
  run = lambda f: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))
  ours = run(body(jaxll.all_gather, jaxll.psum_scatter))
  ref = run(body(jax.lax.all_gather, jax.lax.psum_scatter))
  sites = jaxll.explain(ours, x)
  assert sorted(s.op for s in sites) == ["all_gather", "all_gather", "psum_scatter"], sites
  assert all(s.algorithm == algorithm and s.workspace > 0 for s in sites), sites
  np.testing.assert_array_equal(np.asarray(ours(x)), np.asarray(ref(x)))
  with jax.set_mesh(mesh):
    g_ours = jax.jit(jax.grad(lambda v: ours(v).sum()))(x)
    g_ref = jax.jit(jax.grad(lambda v: ref(v).sum()))(x)
  np.testing.assert_allclose(np.asarray(g_ours), np.asarray(g_ref), rtol=1e-6)
  jaxll.check_errors()


# Gathers along any dimension: (per-rank shape, axis, tiled). The pieces lie in
# segments (one per index of the dimensions before the axis) that the kernel
# writes in place. The first rows' segments are whole numbers of 16-byte units
# for 4- and 2-byte elements (the last dimension has 8 or 16 elements); the
# rest are shorter than a unit or not a multiple of one, which the kernel
# moves element by element (the packed form of ffi/kernels/pieces.cuh).
GATHER_LAYOUTS = [((3, 5, 16), 0, True), ((3, 5, 16), 1, True), ((3, 5, 16), -1, True),
                  ((3, 5, 16), 0, False), ((3, 5, 16), 1, False), ((3, 5, 16), 2, False),
                  ((1, 7, 8), 1, True), ((2, 700, 16), 1, True), ((4, 9000, 8), -1, True),
                  ((3, 5), -1, True), ((3, 6), -1, True), ((3, 12), 1, True),
                  ((4, 7, 3), 2, False), ((2, 33, 5), 1, True), ((8, 1), 1, True),
                  ((5, 3, 1), 1, False), ((2, 3000, 3), 2, True)]


def _gathered(x, axis, tiled):
  """numpy's all_gather of the per-rank inputs x[r] (every rank's result alike)."""
  return np.concatenate(list(x), axis=axis) if tiled else np.stack(list(x), axis=axis)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_all_gather_along_any_dimension(n, dtype, algorithm):
  _served(dtype, algorithm)
  for i, (shape, axis, tiled) in enumerate(GATHER_LAYOUTS):
    x = _random((n, *shape), dtype, seed=300 * n + i)
    got = jt.virtual_all_gather(x, axis=axis, tiled=tiled, algorithm=algorithm)
    want = _gathered(x, axis, tiled)
    assert got.shape == (n, *want.shape), (shape, axis, tiled)
    for r in range(n):
      np.testing.assert_array_equal(_bits(got[r]), _bits(want),
                                    err_msg=f"rank {r}, {shape} axis {axis} tiled {tiled}")
  jaxll.check_errors()


def _scatter_by_rows(x, dim, tiled, algorithm):
  """The reduce-scatter along `dim` computed by the dimension-0 kernel on the
  same elements moved to the front: the reference a strided scatter must equal
  bit for bit (the same sums, in the same rank order)."""
  moved = np.moveaxis(x, 1 + dim, 1)
  y = jt.virtual_psum_scatter(np.ascontiguousarray(moved), scatter_dimension=0, tiled=tiled,
                              algorithm=algorithm)
  return np.moveaxis(y, 1, 1 + dim) if tiled else y


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.float16],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_psum_scatter_along_any_dimension(n, dtype, algorithm):
  # (per-rank shape as a function of n, dimension, tiled); from the seventh on,
  # segments that are not whole 16-byte units (moved element by element)
  layouts = [(lambda n: (3, 2 * n, 16), 1, True), (lambda n: (3, 5, 16 * n), -1, True),
             (lambda n: (3, n, 16), 1, False), (lambda n: (2, 5, n, 8), 2, False),
             (lambda n: (2 * n, 5, 8), 0, True), (lambda n: (2, 300 * n, 16), 1, True),
             (lambda n: (3, 5 * n), -1, True), (lambda n: (3, n, 1), 1, False),
             (lambda n: (2, 3 * n, 3), 1, True), (lambda n: (4, 1000 * n, 3), 1, True)]
  for i, (shape_of, dim, tiled) in enumerate(layouts):
    x = _random((n, *shape_of(n)), dtype, seed=400 * n + i)
    got = jt.virtual_psum_scatter(x, scatter_dimension=dim, tiled=tiled, algorithm=algorithm)
    want = _scatter_by_rows(x, dim % (x.ndim - 1), tiled, algorithm)
    assert got.shape == want.shape, (shape_of(n), dim, tiled)
    np.testing.assert_array_equal(_bits(got), _bits(want),
                                  err_msg=f"{shape_of(n)} dimension {dim} tiled {tiled}")
    # and the float64 sum, piece by piece, within rounding
    total = x.astype(np.float64).sum(0)
    pieces = (np.split(total, n, axis=dim) if tiled else
              [np.take(total, r, axis=dim) for r in range(n)])
    tol = {"float32": 2e-6, "bfloat16": 1.6e-2, "float16": 2e-3}[np.dtype(dtype).name]
    scale = np.abs(x.astype(np.float64)).sum(0).max()
    for r in range(n):
      assert np.abs(got[r].astype(np.float64) - pieces[r]).max() <= tol * scale
  jaxll.check_errors()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n", [2, 8])
def test_gather_gradient_is_the_scatter_along_its_dimension(n, algorithm):
  # autodiff's transpose of a gather along `axis` is the reduce-scatter along
  # the same dimension: the scatter kernel applied to cotangents shaped like
  # the gathered result gives back, on rank r, the sum of every rank's
  # cotangent at r's piece (jax.vjp of the gather, on the host, for reference)
  import jax
  for i, (shape, axis, tiled) in enumerate(GATHER_LAYOUTS[:6]):
    x = _random((n, *shape), np.float32, seed=500 * n + i)
    ct = _random((n, *_gathered(x, axis, tiled).shape), np.float32, seed=600 * n + i)
    got = jt.virtual_psum_scatter(ct, scatter_dimension=axis, tiled=tiled, algorithm=algorithm)
    cpu = jax.devices("cpu")[0]
    total = jax.device_put(ct.astype(np.float64).sum(0).astype(np.float32), cpu)
    _, vjp = jax.vjp(lambda *pieces: jnp.asarray(_gathered_jnp(pieces, axis, tiled)),
                     *[jax.device_put(p, cpu) for p in x])
    want = vjp(total)
    for r in range(n):
      np.testing.assert_allclose(got[r], np.asarray(want[r]), rtol=2e-5, atol=2e-5,
                                 err_msg=f"rank {r}, {shape} axis {axis} tiled {tiled}")
  jaxll.check_errors()


def _gathered_jnp(pieces, axis, tiled):
  return jnp.concatenate(pieces, axis=axis) if tiled else jnp.stack(pieces, axis=axis)


@pytest.mark.parametrize("fn", [jt.virtual_all_gather, jt.virtual_psum_scatter])
def test_sentinel_refuses_int32(fn):
  x = np.ones((2, 2, 8) if fn is jt.virtual_psum_scatter else (2, 8), np.int32)
  with pytest.raises(RuntimeError, match="no kernel for this algorithm and dtype"):
    fn(x, algorithm="oneshot_sentinel")


def test_kernel_timing_tool_runs():
  # the timing behind benchmarks/gather_scatter.py: positive times, no error
  for coll in ("all_gather", "psum_scatter"):
    for algorithm in ALGORITHMS:
      t = jt.gather_scatter_time_us(2, 4096, collective=coll, algorithm=algorithm, iters=20,
                                    reps=3)
      assert len(t) == 3 and all(v > 0 for v in t), (coll, algorithm, t)
  jaxll.check_errors()
