"""GPU tier, one GPU, virtual ranks: the ragged all-to-all kernel
(ffi/kernels/ragged.cu) on N = 1, 2, 3, 4, 8 ranks, every dtype with a
kernel, rows of any size (1 element to several KiB, not whole 8-byte units),
one and several slices a peer, empty slices, uniform and skewed sizes, and
messages of several rounds; sizes that ranks disagree on, slices out of range
and a rank that never calls; the scratch shared with the other collectives'
calls.

It moves bits: every rank's output is exactly what numpy's exchange of the
same slices gives, rows no slice writes keeping their values. Marked ``gpu``."""

import numpy as np
import pytest

import jax.numpy as jnp
import jaxll
from jaxll.tools import testing as jt

pytestmark = pytest.mark.gpu

DTYPES = [np.float32, jnp.bfloat16, np.float16, np.int32]


def _bits(a):
  a = np.asarray(a)
  return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _random(shape, dtype, rng):
  if np.dtype(dtype) == np.int32:
    return rng.integers(-1000, 1000, size=shape).astype(np.int32)
  x = (rng.standard_normal(shape) * 3).astype(dtype)
  bits = _bits(x).reshape(-1)
  bits[::7] = np.iinfo(bits.dtype).max  # all-ones bits (a NaN with a payload) move as they are
  return x


def case(n, slices, rows, row_shape, dtype, rng, *, skew=False, empty=0.2):
  """Operand, output and (N, 4, K) sizes of a consistent call: rank r sends
  send[r, d, k] rows to rank d, slices packed in the operand in order, and
  each receiver packs what it receives in source order, leaving a gap."""
  send = rng.integers(0, max(1, rows // (n * slices)) + 1, size=(n, n, slices))
  if skew:  # most rows go to rank 0
    send[:, 0, :] = rows // (2 * slices)
    send[:, 1:, :] = rng.integers(0, 2, size=(n, n - 1, slices))
  send[rng.random(send.shape) < empty] = 0
  send = np.minimum(send, rows // slices)
  for r in range(n):  # (a rank's slices fit its operand)
    while send[r].sum() > rows:
      send[r].flat[np.argmax(send[r])] -= 1
  k = n * slices
  sizes = np.zeros((n, 4, k), np.int32)
  for r in range(n):
    pos = 0
    for d in range(n):
      for s in range(slices):
        sizes[r, 0, d * slices + s] = pos
        sizes[r, 1, d * slices + s] = send[r, d, s]
        pos += send[r, d, s]
  out_rows = 1
  for d in range(n):
    pos = 1  # (row 0 is never written)
    for r in range(n):
      for s in range(slices):
        sizes[r, 2, d * slices + s] = pos
        sizes[d, 3, r * slices + s] = send[r, d, s]
        pos += send[r, d, s]
    out_rows = max(out_rows, pos + 2)
  operand = _random((n, rows, *row_shape), dtype, rng)
  output = _random((n, out_rows, *row_shape), dtype, rng)
  return operand, output, sizes


def reference(operand, output, sizes):
  """numpy's ragged all-to-all of every rank's arguments (bits)."""
  n, k = sizes.shape[0], sizes.shape[2]
  slices = k // n
  want = _bits(output).copy()
  x = _bits(operand)
  for r in range(n):
    for i in range(k):
      d = i // slices
      io, ss, oo = sizes[r, 0, i], sizes[r, 1, i], sizes[r, 2, i]
      want[d, oo:oo + ss] = x[r, io:io + ss]
  return want


ROWS = [((), 1), ((3,), 2), ((5,), 1), ((8,), 3), ((7, 3), 2), ((1000,), 2), ((4096,), 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_ragged_moves_every_bit(n, dtype):
  rng = np.random.default_rng(100 * n + np.dtype(dtype).itemsize)
  for row_shape, slices in ROWS:
    for skew in (False, True):
      rows = 40 if np.prod(row_shape) < 1000 else 12
      operand, output, sizes = case(n, slices, rows, row_shape, dtype, rng, skew=skew)
      got = jt.virtual_ragged_all_to_all(operand, output, sizes)
      np.testing.assert_array_equal(_bits(got), reference(operand, output, sizes),
                                    err_msg=f"rows {row_shape}, {slices} slices, skew {skew}")
  jaxll.check_errors()


@pytest.mark.parametrize("n", [2, 8])
def test_messages_of_several_rounds(n):
  # rows of 16 KiB to every peer, hundreds of them: each pair's message is
  # several times one round of the default scratch; and a call where one pair
  # alone needs the rounds (every rank runs them)
  rng = np.random.default_rng(5)
  for skew in (False, True):
    operand, output, sizes = case(n, 2, 400, (4096,), np.float32, rng, skew=skew, empty=0)
    got = jt.virtual_ragged_all_to_all(operand, output, sizes)
    np.testing.assert_array_equal(_bits(got), reference(operand, output, sizes))
  operand, output, sizes = case(n, 1, 300, (4096,), np.float32, rng, empty=0)
  sizes[:, 1, :] = 0
  sizes[:, 3, :] = 0
  sizes[1, 1, 0] = 300  # rank 1 sends its whole operand to rank 0
  sizes[0, 3, 1] = 300
  sizes[1, 2, 0] = 0
  output = np.zeros((n, 301, 4096), np.float32)
  got = jt.virtual_ragged_all_to_all(operand, output, sizes)
  np.testing.assert_array_equal(_bits(got), reference(operand, output, sizes))
  jaxll.check_errors()


def test_ragged_calls_share_the_scratch_with_every_collective():
  # ragged calls of changing sizes (so changing rounds) between all-to-alls,
  # ppermutes and gathers on one workspace: epochs and parity stay in step
  n = 4
  rng = np.random.default_rng(11)
  for k in range(40):
    kind = k % 3
    if kind == 0:
      rows = int(rng.choice([3, 60, 700]))
      operand, output, sizes = case(n, 2, rows, (1024,), np.float32, rng)
      got = jt.virtual_ragged_all_to_all(operand, output, sizes)
      np.testing.assert_array_equal(_bits(got), reference(operand, output, sizes),
                                    err_msg=f"call {k}")
    elif kind == 1:
      x = rng.standard_normal((n, n * int(rng.choice([1, 3000])))).astype(np.float32)
      got = jt.virtual_all_to_all(x, 0, 0)
      want = np.stack([np.concatenate([x[j].reshape(n, -1)[r] for j in range(n)])
                       for r in range(n)])
      np.testing.assert_array_equal(got, want, err_msg=f"call {k}")
    else:
      x = rng.standard_normal((n, 5000)).astype(np.float32)
      np.testing.assert_array_equal(jt.virtual_ppermute(x, [(0, 3), (3, 0)])[3], x[0])
  jaxll.check_errors()


@pytest.mark.parametrize("problem", ["sizes", "input", "output"])
def test_bad_sizes_are_errors_that_name_the_slice(problem):
  n = 4
  rng = np.random.default_rng(3)
  operand, output, sizes = case(n, 2, 40, (8,), np.float32, rng, empty=0)
  if problem == "sizes":
    sizes[2, 3, 1 * 2 + 1] += 1  # rank 2 expects one row more of rank 1's slice 1
    want = "rank 2 expects"
  elif problem == "input":
    sizes[1, 0, 0], sizes[1, 1, 0] = 39, 5  # rank 1's slice 0 for rank 0: rows 39..43 of 40
    sizes[0, 3, 1 * 2 + 0] = 5
    want = "reads rows [39, 44) of an operand of 40 rows"
  else:
    # rank 3's slice 0 for rank 1 runs past rank 1's output
    sizes[3, 1, 1 * 2 + 0], sizes[1, 3, 3 * 2 + 0] = 3, 3
    sizes[3, 2, 1 * 2 + 0] = output.shape[1] - 1
    want = f"of an output of {output.shape[1]} rows"
  # (absent past the group: every rank calls, and the error comes back)
  y, error = jt.virtual_ragged_all_to_all(operand, output, sizes, absent=n + 1)
  messages = "\n".join(jaxll.errors())
  assert error and want in messages, messages
  with pytest.raises(jaxll.RaggedSizeError, match="ragged_all_to_all"):
    jaxll.check_errors()
  assert any(np.all(_bits(y[r]) == 0xFFFFFFFF) for r in range(n))  # poisoned
  jaxll.reset()
  operand, output, sizes = case(n, 2, 40, (8,), np.float32, rng)
  got = jt.virtual_ragged_all_to_all(operand, output, sizes)
  np.testing.assert_array_equal(_bits(got), reference(operand, output, sizes))
  jaxll.check_errors()


def test_an_absent_rank_times_out_and_poisons():
  n = 4
  config = jaxll.WorkspaceConfig(timeout_ms=200)
  rng = np.random.default_rng(4)
  operand, output, sizes = case(n, 1, 40, (16,), np.float32, rng, empty=0)
  y, error = jt.virtual_ragged_all_to_all(operand, output, sizes, absent=2, config=config)
  assert "for rank 2" in error and "gave up" in error, error
  for r in (0, 1, 3):
    assert np.all(_bits(y[r]) == 0xFFFFFFFF), r
  jaxll.reset()
  got = jt.virtual_ragged_all_to_all(operand, output, sizes, config=config)
  np.testing.assert_array_equal(_bits(got), reference(operand, output, sizes))
  jaxll.check_errors()


def test_timing_tool_runs():
  rng = np.random.default_rng(6)
  _, _, sizes = case(4, 2, 64, (512,), np.float32, rng)
  t = jt.ragged_time_us(4, 64, 80, 512, sizes, dtype="float32", iters=20, reps=3)
  assert len(t) == 3 and all(v > 0 for v in t), t
  jaxll.check_errors()
