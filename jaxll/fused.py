"""``jaxll.all_reduce_rmsnorm``: the all-reduce that ends a row-parallel layer,
followed by the residual add and the RMSNorm of the next layer's input, the
pattern of every tensor-parallel decoder block.

Today it is the composition of :func:`jaxll.all_reduce` (its kernels, its auto
choice, its XLA fallback) and the norm math, which XLA fuses into one kernel of
its own: two kernels per call where a GPU serves the all-reduce. The single
kernel that does all three on the barrier-free one-shot path is not built yet
(open issue "The low-latency device API ... fused all-reduce + residual +
RMSNorm"); when it is, this function keeps its signature and numerics.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxll.all_reduce import all_reduce

_FLOATS = (np.dtype(np.float32), np.dtype(jnp.bfloat16), np.dtype(np.float16))


def all_reduce_rmsnorm(x, residual, weight, axis_name, *, eps: float = 1e-6,
                       algorithm: str = "auto"):
  """``(normed, new_residual)`` with ``new_residual = all_reduce(x) + residual``
  and ``normed = rmsnorm(new_residual) * weight`` over the last axis.

  Use it inside ``jax.shard_map`` at the end of a row-parallel layer, where a
  model would write ``h = psum(partial, "tp") + residual`` and then normalize
  ``h`` for the next layer.

  Numerics (those of the Hugging Face Llama blocks, for float32, bfloat16 and
  float16): the all-reduce sums ``x`` over the group as :func:`jaxll.all_reduce`
  does (rank order on the kernels); ``new_residual`` is the sum and ``residual``
  added in float32 and rounded once to ``x.dtype``; ``normed`` is
  ``new_residual`` in float32 times ``rsqrt(mean(new_residual**2) + eps)``,
  rounded to ``x.dtype``, times ``weight`` (cast to ``x.dtype``) in ``x.dtype``.

  Args:
    x: this rank's partial sums, shape ``(..., hidden)``.
    residual: the residual stream, the shape and dtype of ``x``.
    weight: the norm's scale, shape ``(hidden,)``.
    axis_name: mesh axis name (or tuple of names) to reduce over.
    eps: added to the mean square before the reciprocal square root.
    algorithm: the all-reduce's algorithm, as in :func:`jaxll.all_reduce`.

  Differentiable in ``x``, ``residual`` and ``weight`` (the all-reduce's
  transpose is psum's). ``jaxll.explain`` lists its all-reduce as a call site
  of the caller's line.
  """
  x = jnp.asarray(x)
  residual = jnp.asarray(residual)
  weight = jnp.asarray(weight)
  if x.dtype not in _FLOATS:
    raise TypeError(f"jaxll.all_reduce_rmsnorm: x must be float32, bfloat16 or "
                    f"float16, got {x.dtype}")
  if x.ndim < 1:
    raise ValueError("jaxll.all_reduce_rmsnorm: x needs a last (hidden) axis; got a scalar")
  if residual.shape != x.shape or residual.dtype != x.dtype:
    raise ValueError(f"jaxll.all_reduce_rmsnorm: residual must have x's shape and dtype "
                     f"{x.shape} {x.dtype}, got {residual.shape} {residual.dtype}")
  if weight.shape != x.shape[-1:]:
    raise ValueError(f"jaxll.all_reduce_rmsnorm: weight must have shape "
                     f"{x.shape[-1:]} (the hidden size), got {weight.shape}")
  if not eps >= 0:
    raise ValueError(f"jaxll.all_reduce_rmsnorm: eps must be >= 0, got {eps}")
  reduced = all_reduce(x, axis_name, algorithm=algorithm)
  new_residual = (reduced.astype(jnp.float32) + residual.astype(jnp.float32)).astype(x.dtype)
  h = new_residual.astype(jnp.float32)
  inv = jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + jnp.float32(eps))
  normed = (h * inv).astype(x.dtype) * weight.astype(x.dtype)
  return normed, new_residual
