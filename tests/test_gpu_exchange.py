"""GPU tier, one GPU, virtual ranks: the ppermute and all-to-all kernels
(ffi/kernels/exchange.cu) on N = 1, 2, 3, 4, 8 ranks, LL16, sentinel and
barrier protocols, every dtype with a kernel, odd sizes and sizes of several
rounds, pieces along any split and concat dimensions; a rank that never calls,
a permutation that differs between ranks; the scratch reused across calls of
every kind in a row.

Both move bits: every rank's output is exactly what numpy's permutation or
exchange of the inputs gives (NaN payloads, signed zeros and all), except that
under the sentinel protocol a peer's element whose bits are all ones arrives
as the canonical NaN. Marked ``gpu``."""

import numpy as np
import pytest

import jax.numpy as jnp
import jaxll
from jaxll.tools import testing as jt

pytestmark = pytest.mark.gpu

DTYPES = [np.float32, jnp.bfloat16, np.float16, np.int32]
ALGORITHMS = ["oneshot_ll", "oneshot_sentinel", "oneshot_barrier"]
CANONICAL_NAN = {"float32": 0x7FC00000, "bfloat16": 0x7FC0, "float16": 0x7E00}
# up to several rounds of the default 512 KiB scratch over the grid
COUNTS = [1, 3, 17, 1000, 4097, 65_539, 300_001]


def _served(dtype, algorithm):
  if algorithm == "oneshot_sentinel" and np.dtype(dtype) == np.int32:
    pytest.skip("no sentinel kernel for int32 (all ones is a valid int32)")


def _bits(a):
  a = np.asarray(a)
  return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _random(shape, dtype, seed):
  rng = np.random.default_rng(seed)
  if np.dtype(dtype) == np.int32:
    x = rng.integers(-1000, 1000, size=shape).astype(np.int32)
  else:
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    bits = _bits(x).reshape(shape[0], -1)
    bits[:, 0] = np.iinfo(bits.dtype).max  # all-ones: a NaN with a payload
    if bits.shape[1] > 1:
      bits[:, 1] = bits.dtype.type(1 << (8 * bits.dtype.itemsize - 1))  # -0.0
  return x


def _sent(x, algorithm):
  """Bits of x as a peer receives them."""
  b = _bits(x).copy()
  if algorithm == "oneshot_sentinel":
    b[b == np.iinfo(b.dtype).max] = CANONICAL_NAN[np.dtype(x.dtype).name]
  return b


def _perms(n):
  out = {"ring": [(i, (i + 1) % n) for i in range(n)],
         "partial": [(0, n - 1)] + ([(n - 1, 1)] if n > 2 else []),
         "identity": [(i, i) for i in range(n)]}
  if n % 2 == 0:
    out["swap"] = [(i, i ^ 1) for i in range(n)]
  return out


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_ppermute_moves_every_bit(n, dtype, algorithm):
  _served(dtype, algorithm)
  for name, perm in _perms(n).items():
    for i, count in enumerate(COUNTS if name == "ring" else COUNTS[:5]):
      x = _random((n, count), dtype, seed=300 * n + i)
      got = jt.virtual_ppermute(x, perm, algorithm=algorithm)
      want = np.zeros_like(_bits(x))
      sent = _sent(x, algorithm)
      for s, d in perm:
        want[d] = _bits(x)[s] if s == d else sent[s]
      np.testing.assert_array_equal(_bits(got), want, err_msg=f"{name}, count {count}")
  jaxll.check_errors()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_all_to_all_moves_every_bit(n, dtype, algorithm):
  _served(dtype, algorithm)
  for i, per_peer in enumerate(COUNTS[:6]):
    x = _random((n, n * per_peer), dtype, seed=400 * n + i)
    got = jt.virtual_all_to_all(x, 0, 0, algorithm=algorithm)
    sent = _sent(x, algorithm)
    for r in range(n):
      want = np.concatenate([(_bits(x) if j == r else sent)[j].reshape(n, per_peer)[r]
                             for j in range(n)])
      np.testing.assert_array_equal(_bits(got[r]), want, err_msg=f"rank {r}, piece {per_peer}")
  jaxll.check_errors()


# (per-rank shape as a function of n, split, concat): the first seven move
# pieces in runs of whole transfer units for 4-byte elements; the rest have
# runs shorter than a unit or not a multiple of one (moved element by element,
# the packed form of ffi/kernels/pieces.cuh), among them the shapes JAX
# programs make: a split or concat over the last dimension of a few elements.
A2A_LAYOUTS = [
    (lambda n: (8, 2 * n), 1, 0), (lambda n: (n, 16), 0, 1), (lambda n: (4, 8, 4 * n), 2, 0),
    (lambda n: (2, 2 * n, 64), 1, 2), (lambda n: (8 * n, 4, 8), 0, 2), (lambda n: (2 * n, 24), 0, 0),
    (lambda n: (3, n, 64), 1, 1),
    (lambda n: (8, 8, n), 2, 0), (lambda n: (8, 8, 2 * n), 2, 1), (lambda n: (n, 3), 0, 1),
    (lambda n: (3, 5 * n), 1, 0), (lambda n: (5, n, 3), 1, 2), (lambda n: (n, 7, 1), 0, 2),
    (lambda n: (2, 3 * n, 5), 1, 1), (lambda n: (600 * n, 3), 0, 1), (lambda n: (3, 3 * n), 1, 1)]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_all_to_all_along_any_dimensions(n, dtype, algorithm):
  _served(dtype, algorithm)
  for i, (shape_of, split, concat) in enumerate(A2A_LAYOUTS):
    x = _random((n, *shape_of(n)), dtype, seed=700 * n + i)
    got = jt.virtual_all_to_all(x, split, concat, algorithm=algorithm)
    sent = _sent(x, algorithm).reshape(x.shape)
    for r in range(n):
      want = np.concatenate([np.split((_bits(x) if j == r else sent)[j], n, axis=split)[r]
                             for j in range(n)], axis=concat)
      np.testing.assert_array_equal(_bits(got[r]), want,
                                    err_msg=f"rank {r}, {shape_of(n)} {split} -> {concat}")
  jaxll.check_errors()


def test_calls_of_every_kind_share_the_scratch():
  # One-way calls between all-pairs ones, in one workspace, many times: the
  # scratch's parity and signature slots stay in step whatever runs next.
  n = 4
  rng = np.random.default_rng(11)
  for k in range(60):
    count = int(rng.choice([1, 40, 3000, 70_000]))
    x = rng.standard_normal((n, count * n)).astype(np.float32)
    kind = k % 4
    if kind == 0:
      got = jt.virtual_ppermute(x, [(0, 2), (3, 0)])
      want = np.zeros_like(x)
      want[2], want[0] = x[0], x[3]
    elif kind == 1:
      got = jt.virtual_all_to_all(x, 0, 0)
      want = np.stack([np.concatenate([x[j].reshape(n, -1)[r] for j in range(n)])
                       for r in range(n)])
    elif kind == 2:
      got = jt.virtual_all_gather(x[:, :count])
      want = np.broadcast_to(x[:, :count], (n, n, count))
    else:
      got = jt.virtual_ppermute(x, [(i, (i + 3) % n) for i in range(n)],
                                algorithm="oneshot_sentinel")
      want = np.roll(x, 3, axis=0)
    np.testing.assert_array_equal(got, want, err_msg=f"call {k}, kind {kind}")
  jaxll.check_errors()


@pytest.mark.parametrize("collective", ["ppermute", "all_to_all"])
@pytest.mark.parametrize("algorithm", ["oneshot_ll", "oneshot_sentinel"])
def test_an_absent_rank_times_out_and_poisons(collective, algorithm):
  n = 4
  config = jaxll.WorkspaceConfig(timeout_ms=200)
  x = np.ones((n, 4 * 256), np.float32)
  if collective == "ppermute":
    y, error = jt.virtual_ppermute(x, [(i, (i + 1) % n) for i in range(n)], algorithm=algorithm,
                                   absent=2, config=config)
  else:
    y, error = jt.virtual_all_to_all(x, 0, 0, algorithm=algorithm, absent=2, config=config)
  assert "for rank 2" in error and "gave up" in error, error
  for r in (0, 1, 3):  # every present rank gave up and poisoned its output
    assert np.all(_bits(y[r]) == 0xFFFFFFFF), (r, y[r][:4])
  jaxll.reset()
  # the workspace serves again after reset
  got = jt.virtual_ppermute(x, [(0, 1)], config=config)
  np.testing.assert_array_equal(got[1], x[0])
  jaxll.check_errors()
