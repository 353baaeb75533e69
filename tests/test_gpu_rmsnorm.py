"""GPU tier, one GPU: the fused all-reduce + residual add + RMSNorm on N
virtual ranks (every exchange and kernel against a float64 reference, its
refusals, auto's choice). Marked ``gpu``: skipped where JAX sees no CUDA GPU."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxll
from jaxll.native import ext
from jaxll.tools import testing as jt

pytestmark = pytest.mark.gpu


def _rmsnorm_reference(x, residual, weight, eps):
  """jaxll.all_reduce_rmsnorm's numerics in numpy: the rank-order float32 sum
  rounded once, the residual added in float32 and rounded, the norm in
  float32 (float64 here) rounded, times the weight."""
  dt = x.dtype
  s = x[0].astype(np.float32)
  for r in range(1, x.shape[0]):
    s = s + x[r].astype(np.float32)
  new = (s.astype(dt).astype(np.float32) + residual.astype(np.float32)).astype(dt)
  h = new.astype(np.float64)
  inv = 1 / np.sqrt(np.mean(h * h, -1, keepdims=True) + eps)
  normed = ((h * inv).astype(dt).astype(np.float32) * weight.astype(np.float32)).astype(dt)
  return normed, new


def _assert_fused(normed, new, want, tol):
  """A virtual fused call's outputs against _rmsnorm_reference's `want`: every
  rank's new_residual exactly the reference's bits, normed the same bits on
  every rank and within `tol` (relative and absolute) of the reference."""
  want_normed, want_new = want
  bits = np.uint16 if want_new.dtype.itemsize == 2 else np.uint32
  for r in range(len(new)):
    np.testing.assert_array_equal(new[r].view(bits), want_new.view(bits))
    np.testing.assert_array_equal(normed[r].view(bits), normed[0].view(bits))
  np.testing.assert_allclose(normed[0].astype(np.float64), want_normed.astype(np.float64),
                             rtol=tol, atol=tol)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("tokens,hidden,dtype", [
    (1, 4096, jnp.bfloat16), (7, 128, np.float32), (3, 5120, np.float32),
    (64, 16384, jnp.bfloat16), (16, 8192, np.float16), (5, 12, np.float32)])
@pytest.mark.parametrize("scratch", [None, 2048])
def test_fused_all_reduce_rmsnorm_on_virtual_ranks(n, tokens, hidden, dtype, scratch):
  # the fused kernel (ffi/kernels/all_reduce_rmsnorm.cu); 2 KiB scratch cuts
  # every row but the smallest into several rounds
  rng = np.random.default_rng(n * tokens + hidden)
  x = rng.standard_normal((n, tokens, hidden)).astype(dtype)
  residual = rng.standard_normal((tokens, hidden)).astype(dtype)
  weight = (1 + 0.1 * rng.standard_normal(hidden)).astype(dtype)
  cfg = jaxll.WorkspaceConfig(scratch_bytes=scratch) if scratch else None
  normed, new = jt.virtual_all_reduce_rmsnorm(x, residual, weight, eps=1e-5, config=cfg)
  tol = {2: 1.6e-2 if dtype == jnp.bfloat16 else 2e-3, 4: 2e-6}[np.dtype(dtype).itemsize]
  _assert_fused(normed, new, _rmsnorm_reference(x, residual, weight, 1e-5), 2 * tol)
  jaxll.check_errors()


# The fused kernel on the sentinel exchange (protocol="sentinel"): the shapes
# it serves (a row's bytes a multiple of 16, one round of the decode-shape
# kernel). 16 x 8192 at 8 ranks is such a cut only where a rank's grid bound
# holds 2 blocks a row (128 SMs or more: H100/H200).
_SENTINEL_SHAPES = [(1, 4096, jnp.bfloat16), (7, 128, np.float32), (3, 5120, np.float32),
                    (16, 8192, jnp.bfloat16), (8, 8192, np.float16), (5, 12, np.float32)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("tokens,hidden,dtype", _SENTINEL_SHAPES)
def test_fused_rmsnorm_on_the_sentinel_exchange(n, tokens, hidden, dtype):
  if (n, tokens) == (8, 16) and jax.devices("cuda")[0].core_count < 128:
    pytest.skip("16 x 8192 at 8 ranks is one round only with 128 SMs or more")
  rng = np.random.default_rng(n * tokens + hidden + 1)
  x = rng.standard_normal((n, tokens, hidden)).astype(dtype)
  residual = rng.standard_normal((tokens, hidden)).astype(dtype)
  weight = (1 + 0.1 * rng.standard_normal(hidden)).astype(dtype)
  tol = {2: 1.6e-2 if dtype == jnp.bfloat16 else 2e-3, 4: 2e-6}[np.dtype(dtype).itemsize]
  # four calls, each with other inputs: the third and fourth reuse scratch slots
  # an earlier call read and reset (a slot left holding old data would show as
  # the old call's values); the LL16 kernel between them shares the epochs
  for k, protocol in enumerate(("sentinel", "ll", "sentinel", "sentinel")):
    xk = (x.astype(np.float32) + k).astype(dtype)
    normed, new = jt.virtual_all_reduce_rmsnorm(xk, residual, weight, eps=1e-5,
                                                protocol=protocol)
    _assert_fused(normed, new, _rmsnorm_reference(xk, residual, weight, 1e-5), 2 * tol)
  jaxll.check_errors()


def test_fused_sentinel_between_sentinel_all_reduces_and_all_ones_inputs():
  # the fused sentinel kernel and the one-shot sentinel all-reduce share the
  # sentinel scratch: alternate them; an input element whose bits are the
  # sentinel pattern (all ones: a NaN) arrives as the canonical NaN and does
  # not stall the exchange; every other element stays exact
  n, tokens, hidden = 4, 4, 8192
  rng = np.random.default_rng(11)
  x = rng.standard_normal((n, tokens, hidden)).astype(jnp.bfloat16)
  residual = rng.standard_normal((tokens, hidden)).astype(jnp.bfloat16)
  weight = np.ones(hidden, jnp.bfloat16)
  want_normed, want_new = _rmsnorm_reference(x, residual, weight, 1e-5)
  y = rng.standard_normal((n, 4096)).astype(np.float32)
  for _ in range(3):
    normed, new = jt.virtual_all_reduce_rmsnorm(x, residual, weight, eps=1e-5,
                                                protocol="sentinel")
    np.testing.assert_array_equal(new[2].view(np.uint16), want_new.view(np.uint16))
    got = np.asarray(jt.virtual_all_reduce(y, algorithm="oneshot_sentinel"))
    np.testing.assert_allclose(got[0], y.astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)
  poisoned = x.copy()
  poisoned.view(np.uint16)[1, 2, 100] = 0xFFFF
  normed, new = jt.virtual_all_reduce_rmsnorm(poisoned, residual, weight, eps=1e-5,
                                              protocol="sentinel")
  others = np.arange(hidden) != 100
  for r in range(n):
    # (the canonical NaN plus the residual: a NaN, the same bits on every rank)
    assert np.isnan(new[r][2, 100].astype(np.float32))
    assert new[r].view(np.uint16)[2, 100] == new[0].view(np.uint16)[2, 100]
    np.testing.assert_array_equal(new[r][2, others].view(np.uint16),
                                  want_new[2, others].view(np.uint16))
    assert np.isnan(normed[r][2].astype(np.float32)).all()  # (its row's norm is NaN)
    for t in (0, 1, 3):
      np.testing.assert_array_equal(new[r][t].view(np.uint16), want_new[t].view(np.uint16))
      np.testing.assert_array_equal(normed[r][t].view(np.uint16), normed[0][t].view(np.uint16))
  jaxll.check_errors()


# The two-shot fused kernel (protocol="twoshot_sentinel" / "twoshot_ll"): shapes
# of one row-wave. 32 x 8192 bf16 at 8 ranks is a whole row a block, 2 units a
# thread (where a rank's grid bound holds 32 blocks: 128 SMs or more).
_TWOSHOT_SHAPES = [(1, 4096, jnp.bfloat16), (7, 128, np.float32), (3, 5120, np.float32),
                   (16, 8192, jnp.bfloat16), (8, 8192, np.float16), (5, 12, np.float32),
                   (32, 8192, jnp.bfloat16)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("tokens,hidden,dtype", _TWOSHOT_SHAPES)
@pytest.mark.parametrize("protocol", ["twoshot_sentinel", "twoshot_ll"])
def test_fused_rmsnorm_two_shot(n, tokens, hidden, dtype, protocol):
  if tokens >= 16 and jax.devices("cuda")[0].core_count < 128:
    pytest.skip("16 and 32 rows of 8192 are one row-wave only with 128 SMs or more")
  rng = np.random.default_rng(n * tokens + hidden + 2)
  x = rng.standard_normal((n, tokens, hidden)).astype(dtype)
  residual = rng.standard_normal((tokens, hidden)).astype(dtype)
  weight = (1 + 0.1 * rng.standard_normal(hidden)).astype(dtype)
  if (tokens, protocol) == (32, "twoshot_ll") and n > 1:
    # (2048 LL16 units a row: a whole row a block is beyond 2 units a thread, so
    # the cut needs 2 segments a row, 64 blocks, and an owner's chunk of at most
    # 2 units a thread: served at N=2, refused where the rank's grid bound holds
    # fewer blocks, as at N=8 on 132 SMs; a refused call must raise, a served
    # one is checked below)
    ws = jt.virtual_workspace(n)
    plan = jt.rmsnorm_plan(n, tokens, hidden, dtype=dtype, protocol=protocol)
    if n == 2:
      assert plan["blocks"] == 2 * tokens and plan["segments"] == 2, plan
    if ext.workspace_info(ws.id)["max_blocks"] < 2 * tokens:
      assert plan["blocks"] == 0, plan
    if plan["blocks"] == 0:
      with pytest.raises(ValueError, match="cannot serve this call"):
        jt.virtual_all_reduce_rmsnorm(x, residual, weight, protocol=protocol)
      return
  tol = {2: 1.6e-2 if dtype == jnp.bfloat16 else 2e-3, 4: 2e-6}[np.dtype(dtype).itemsize]
  # four calls with other inputs each (the later ones reuse slots an earlier
  # one read), the one-shot sentinel and LL16 kernels between them
  for k, proto in enumerate((protocol, "ll", protocol, "sentinel", protocol)):
    if proto == "sentinel" and (np.dtype(dtype).itemsize * hidden % 16 or tokens > 16):
      continue
    xk = (x.astype(np.float32) + k).astype(dtype)
    normed, new = jt.virtual_all_reduce_rmsnorm(xk, residual, weight, eps=1e-5, protocol=proto)
    _assert_fused(normed, new, _rmsnorm_reference(xk, residual, weight, 1e-5), 2 * tol)
  jaxll.check_errors()


@pytest.mark.parametrize("protocol", ["twoshot_sentinel", "twoshot_ll"])
def test_fused_two_shot_adds_each_ranks_own_residual(protocol):
  # the owner of a chunk sends the sum, not sum + its residual: with residuals
  # that differ across ranks, rank r's new_residual is the sum plus its own
  # (what the one-shot kernel and the composition give); jitted, 3 calls
  n, tokens, hidden = 8, 4, 8192
  rng = np.random.default_rng(21)
  x = rng.standard_normal((n, tokens, hidden)).astype(jnp.bfloat16)
  res = rng.standard_normal((n, tokens, hidden)).astype(jnp.bfloat16)
  w = (1 + 0.1 * rng.standard_normal(hidden)).astype(jnp.bfloat16)
  f = jax.jit(lambda a, b, c: jt.virtual_fused_rmsnorm(a, b, c, eps=1e-5, protocol=protocol))
  for k in range(3):
    xk = (x.astype(np.float32) * (k + 1)).astype(jnp.bfloat16)
    normed, new = (np.asarray(v) for v in f(xk, res, w))
    for r in range(n):
      want_normed, want_new = _rmsnorm_reference(xk, res[r], w, 1e-5)
      np.testing.assert_array_equal(new[r].view(np.uint16), want_new.view(np.uint16))
      np.testing.assert_allclose(normed[r].astype(np.float64), want_normed.astype(np.float64),
                                 rtol=3.2e-2, atol=3.2e-2)
  jaxll.check_errors()


def test_fused_two_shot_refuses_what_it_cannot_serve():
  rng = np.random.default_rng(4)
  # more rows than a row-wave holds (at most 64 blocks a rank)
  with pytest.raises(ValueError, match="cannot serve this call"):
    jt.rmsnorm_kernel_time_us(2, 128, 16384, iters=2, reps=1, protocol="twoshot_sentinel")
  with pytest.raises(ValueError, match="cannot serve this call"):
    jt.rmsnorm_kernel_time_us(8, 128, 8192, iters=2, reps=1, protocol="twoshot_ll")
  # a row of 24 bytes: LL16's two-shot serves it, sentinel's does not
  x = rng.standard_normal((4, 2, 12)).astype(jnp.bfloat16)
  res, w = x[0].copy(), np.ones(12, jnp.bfloat16)
  with pytest.raises(ValueError, match="cannot serve this call"):
    jt.virtual_all_reduce_rmsnorm(x, res, w, protocol="twoshot_sentinel")
  normed, new = jt.virtual_all_reduce_rmsnorm(x, res, w, protocol="twoshot_ll")
  want_normed, want_new = _rmsnorm_reference(x, res, w, 1e-6)
  np.testing.assert_array_equal(new[3].view(np.uint16), want_new.view(np.uint16))
  jaxll.check_errors()


def test_fused_auto_takes_the_two_shot_kernel_where_it_measured_faster():
  # the measured choice of exchange (jaxll.choice.fused_exchange, from
  # jaxll/tuning/all_reduce_rmsnorm.json): two-shot on sentinel in groups of 8
  # from 128 KiB of x per rank, and for calls of 64 KiB and more that no
  # decode-shape cut serves; else one-shot, on sentinel in groups of 2 from the
  # smallest call and in larger groups from 64 KiB, on LL16 below that
  def plan(n, tokens, hidden):
    p = jt.rmsnorm_plan(n, tokens, hidden)
    return ("twoshot" if p["twoshot"] else "oneshot") + "_" + p["protocol"]
  assert plan(8, 4, 8192) != "twoshot_sentinel"       # 64 KiB: one-shot
  assert plan(8, 8, 8192) == "twoshot_sentinel"       # 128 KiB
  assert plan(8, 16, 8192) == "twoshot_sentinel"      # 256 KiB
  assert plan(4, 8, 8192) == "oneshot_sentinel"       # (a group of 4: one-shot)
  assert plan(4, 16, 8192) == "oneshot_sentinel"      # (a group of 4: the decode-shape cut)
  assert plan(2, 64, 8192) == "twoshot_sentinel"      # beyond the decode-shape cuts
  assert plan(2, 1, 8192) == "oneshot_sentinel"      # a group of 2: sentinel from 1 row
  assert plan(4, 1, 8192) == "oneshot_ll"             # 16 KiB in a group of 4: LL16
  assert plan(8, 2, 8192) == "oneshot_ll"             # 32 KiB in a group of 8: LL16
  # and the call runs: a jitted auto call of 16 x 8192 on 8 ranks
  rng = np.random.default_rng(5)
  x = rng.standard_normal((8, 16, 8192)).astype(jnp.bfloat16)
  res = rng.standard_normal((16, 8192)).astype(jnp.bfloat16)
  w = np.ones(8192, jnp.bfloat16)
  normed, new = jt.virtual_all_reduce_rmsnorm(x, res, w)
  want_normed, want_new = _rmsnorm_reference(x, res, w, 1e-6)
  for r in range(8):
    np.testing.assert_array_equal(new[r].view(np.uint16), want_new.view(np.uint16))
  jaxll.check_errors()


def test_fused_decode_cut_keeps_a_grid_that_launches_early():
  # 4 rows of 8192 bf16 on 8 ranks: a block per 128 sentinel units would be 32
  # blocks, more than half this rank's grid bound, so the call would not launch
  # early (PDL); the cut takes fewer, longer segments instead (one unit a thread,
  # the signature warp spare) where that grid launches early
  if os.environ.get("JAXLL_PDL") == "0" or jax.devices("cuda")[0].core_count < 128:
    pytest.skip("needs PDL and an H100/H200-sized grid bound")
  ws = jt.virtual_workspace(8)
  half = ext.workspace_info(ws.id)["max_blocks"] // 2
  for proto in ("sentinel", "twoshot_sentinel"):
    p = jt.rmsnorm_plan(8, 4, 8192, protocol=proto)
    assert p["waves"] == 1 and p["pdl"] and p["blocks"] <= half, (proto, p)
    assert p["segments"] < 8 and p["threads"] >= 1024 // p["segments"] + 32, (proto, p)
  # and where no such grid exists (8 rows: 512-unit segments leave no spare
  # warp), the cut of a block per 128 units stays
  p = jt.rmsnorm_plan(8, 8, 8192, protocol="sentinel")
  assert p["segments"] == 4 and not p["pdl"], p
  rng = np.random.default_rng(11)
  x = rng.standard_normal((8, 4, 8192)).astype(jnp.bfloat16)
  res = rng.standard_normal((4, 8192)).astype(jnp.bfloat16)
  w = (1 + 0.1 * rng.standard_normal(8192)).astype(jnp.bfloat16)
  want = _rmsnorm_reference(x, res, w, 1e-6)
  for proto in ("sentinel", "twoshot_sentinel"):
    normed, new = jt.virtual_all_reduce_rmsnorm(x, res, w, protocol=proto)
    _assert_fused(normed, new, want, 1.6e-2)
  jaxll.check_errors()


def test_fused_sentinel_refuses_what_it_cannot_serve():
  rng = np.random.default_rng(3)
  # a row of 24 bytes (not a multiple of 16)
  x = rng.standard_normal((2, 2, 12)).astype(jnp.bfloat16)
  res, w = x[0].copy(), np.ones(12, jnp.bfloat16)
  with pytest.raises(ValueError, match="cannot serve this call"):
    jt.virtual_all_reduce_rmsnorm(x, res, w, protocol="sentinel")
  normed, new = jt.virtual_all_reduce_rmsnorm(x, res, w)  # auto: LL16 serves it
  want_normed, want_new = _rmsnorm_reference(x, res, w, 1e-6)
  np.testing.assert_array_equal(new[1].view(np.uint16), want_new.view(np.uint16))
  # more than one round of the decode-shape kernel
  with pytest.raises(ValueError, match="cannot serve this call"):
    jt.rmsnorm_kernel_time_us(2, 128, 16384, iters=2, reps=1, protocol="sentinel")
  with pytest.raises(ValueError, match="protocol must be one of"):
    jt.virtual_all_reduce_rmsnorm(x, res, w, protocol="ll128")
  with pytest.raises(jax.errors.JaxRuntimeError, match="cannot serve this call"):
    jax.block_until_ready(jt.virtual_fused_rmsnorm(x, np.asarray(x), w, protocol="sentinel"))
  jaxll.check_errors()
