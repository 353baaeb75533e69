"""What the CPU tests of jaxll.all_reduce_rmsnorm share: the documented
numerics written with jax.lax.psum, inputs, and an 8-device shard_map."""

import numpy as np

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def reference(x, residual, weight, eps):
  """The documented numerics, written with jax.lax.psum."""
  s = jax.lax.psum(x, "tp")
  new_residual = (s.astype(jnp.float32) + residual.astype(jnp.float32)).astype(x.dtype)
  h = new_residual.astype(jnp.float32)
  inv = jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)
  return (h * inv).astype(x.dtype) * weight.astype(x.dtype), new_residual


def inputs(dtype, tokens=3, hidden=64, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((8 * tokens, hidden)).astype(dtype)       # per-rank partials
  residual = rng.standard_normal((tokens, hidden)).astype(dtype)     # replicated
  weight = (1 + 0.1 * rng.standard_normal(hidden)).astype(dtype)
  return x, residual, weight


def shard(mesh, fn, check_vma):
  return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P("tp"), P(), P()),
                               out_specs=(P(), P()), check_vma=check_vma))


def put(mesh, *arrays):
  specs = (P("tp"), P(), P())
  return [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(arrays, specs)]


def plan(blocks=4, protocol="ll", twoshot=False, lean=True) -> dict:
  """A native plan of the fused kernel (the keys the lowering reads)."""
  return {"blocks": blocks, "protocol": protocol, "twoshot": twoshot, "lean": lean}


def cuda_text(mesh, monkeypatch, hidden, body=None, sentinel_serves=True):
  """Lowered for CUDA (no GPU needed) with the workspace lookup forced to 7
  (and the kernel's plan: LL16 for ll; sentinel and the two-shot exchanges
  where asked for if `sentinel_serves`, else no plan)."""
  import sys

  import jaxll
  from jaxll import placement
  from jaxll import rmsnorm as fused_mod
  ALL_REDUCE = sys.modules["jaxll.all_reduce"]  # (the module; jaxll.all_reduce is the function)
  named = {"sentinel": ("sentinel", False), "twoshot_ll": ("ll", True),
           "twoshot_sentinel": ("sentinel", True)}

  def forced_plan(ws, dtype, tokens, hidden, exchange):
    assert ws == 7 and tokens * hidden > 0
    if exchange not in named:
      return plan()
    units, twoshot = named[exchange]
    return plan(4 if sentinel_serves else 0, units, twoshot)

  monkeypatch.setattr(fused_mod, "_kernel_plan", forced_plan)
  monkeypatch.setattr(placement, "workspace_for", lambda ctx, axes: (7, 8, ""))
  monkeypatch.setattr(ALL_REDUCE, "decide", lambda ctx, aval, axes, op, requested:
                      ALL_REDUCE.Decision("oneshot_ll", "forced by the test", 7, 8))
  x, residual, weight = inputs(np.float32, hidden=hidden)

  def default(x, r, w):
    a, b = jaxll.all_reduce_rmsnorm(x, r, w, "tp", algorithm="fused", eps=1e-5)
    return a, jaxll.all_reduce(b, "tp")

  f = shard(mesh, body or default, True)
  return f.trace(*put(mesh, x, residual, weight)).lower(lowering_platforms=("cuda",)).as_text()
