"""A small Megatron-style tensor-parallel model for the drop-in tests: residual
layers of a column-parallel and a row-parallel matmul (``w_in`` split over
``tp`` on its columns, ``w_out`` on its rows), the batch split over ``dp``.
Forward, the gradient of a loss reduced over ``dp``, and a decode loop
(``fori_loop`` feeding each output back), each written three ways:

  psum      jax.lax.psum for the row-parallel sums (the reference)
  helpers   jaxll.copy_to_parallel_region / reduce_from_parallel_region
  route     the psum version inside jaxll.route_psums

plus the same math in float64 numpy. Used by tests/test_routing_cpu.py (8 CPU
devices) and tests/mp_scripts/tp_block.py (processes on GPUs).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll

LAYERS, D, F = 2, 32, 64
SPECS = (P(None, None, "tp"), P(None, "tp", None), P("dp", None))  # w_in, w_out, x
VARIANTS = ("psum", "helpers", "route")


def init(seed=0, batch=4):
  rng = np.random.default_rng(seed)
  w_in = (rng.standard_normal((LAYERS, D, F)) / np.sqrt(D)).astype(np.float32)
  w_out = (rng.standard_normal((LAYERS, F, D)) / np.sqrt(F)).astype(np.float32)
  x = rng.standard_normal((batch, D)).astype(np.float32)
  return w_in, w_out, x


def _ops(variant):
  if variant == "helpers":
    return (lambda v: jaxll.reduce_from_parallel_region(v, "tp"),
            lambda v: jaxll.copy_to_parallel_region(v, "tp"))
  return lambda v: jax.lax.psum(v, "tp"), lambda v: v


def _forward(w_in, w_out, x, reduce, copy):
  for layer in range(LAYERS):
    a = jnp.tanh(copy(x) @ w_in[layer])      # column-parallel
    x = x + reduce(a @ w_out[layer])         # row-parallel partial sums
  return x


def programs(mesh, variant, *, check_vma=True, steps=8):
  """(forward, grad, decode) jitted over `mesh` for one variant."""
  reduce, copy = _ops(variant)

  def forward(w_in, w_out, x):
    return _forward(w_in, w_out, x, reduce, copy)

  def loss(w_in, w_out, x):
    y = forward(w_in, w_out, x)
    return jax.lax.psum(jnp.sum(y * y), "dp")

  def decode(w_in, w_out, x):
    return jax.lax.fori_loop(0, steps, lambda i, v: jnp.tanh(forward(w_in, w_out, v)), x)

  grad = jax.grad(loss, argnums=(0, 1, 2))
  out = []
  for fn, out_specs in ((forward, SPECS[2]), (grad, SPECS), (decode, SPECS[2])):
    body = jax.shard_map(fn, mesh=mesh, in_specs=SPECS, out_specs=out_specs,
                         check_vma=check_vma)
    out.append(jax.jit(jaxll.route_psums(body) if variant == "route" else body))
  return out


def place(mesh, w_in, w_out, x):
  """The global arrays, each device's block cut from the full array on the host
  (no cross-process transfer: jax.device_put of a global array checks that the
  processes agree through XLA's NCCL, which cannot pair processes sharing a GPU)."""
  out = []
  for a, spec in zip((w_in, w_out, x), SPECS):
    sharding = NamedSharding(mesh, spec)
    idx = sharding.addressable_devices_indices_map(a.shape)
    out.append(jax.make_array_from_single_device_arrays(
        a.shape, sharding, [jax.device_put(a[idx[d]], d) for d in idx]))
  return out


# --- float64 reference ----------------------------------------------------------------

def ref_forward(w_in, w_out, x):
  x = np.asarray(x, np.float64)
  for layer in range(LAYERS):
    x = x + np.tanh(x @ w_in[layer].astype(np.float64)) @ w_out[layer].astype(np.float64)
  return x


def ref_grad(w_in, w_out, x):
  """Gradients of sum(forward(x)^2) by hand (backpropagation in float64)."""
  w_in = w_in.astype(np.float64)
  w_out = w_out.astype(np.float64)
  xs, acts = [np.asarray(x, np.float64)], []
  for layer in range(LAYERS):
    acts.append(np.tanh(xs[-1] @ w_in[layer]))
    xs.append(xs[-1] + acts[-1] @ w_out[layer])
  g = 2 * xs[-1]
  g_in, g_out = np.zeros_like(w_in), np.zeros_like(w_out)
  for layer in reversed(range(LAYERS)):
    a = acts[layer]
    g_out[layer] = a.T @ g
    ga = (g @ w_out[layer].T) * (1 - a * a)
    g_in[layer] = xs[layer].T @ ga
    g = g + ga @ w_in[layer].T
  return g_in, g_out, g


def ref_decode(w_in, w_out, x, steps=8):
  x = np.asarray(x, np.float64)
  for _ in range(steps):
    x = np.tanh(ref_forward(w_in, w_out, x))
  return x


def tp_sites(sites):
  """The call sites that reduce over tp."""
  return [s for s in sites if "tp" in s.axes.split(",")]
