"""``jaxll.all_reduce_rmsnorm``: the all-reduce that ends a row-parallel layer,
followed by the residual add and the RMSNorm of the next layer's input, the
pattern of every tensor-parallel decoder block.

By default (``algorithm="auto"`` or a jaxll.all_reduce algorithm) it is the
composition of :func:`jaxll.all_reduce` (its kernels, its auto choice, its XLA
fallback) and the norm math, which XLA fuses into one kernel of its own: two
kernels per call where a GPU serves the all-reduce. ``algorithm="fused"``
asks for the single kernel that does all three on the one-shot LL16 path
(``ffi/kernels/all_reduce_rmsnorm.cu``); where it cannot serve the call (CPU,
no workspace, hidden size whose bytes are not a multiple of 8, ...) the
composition serves it. ``auto`` never picks the fused kernel: it beats the
composition only for decode steps of a few tokens (``benchmarks/README.md``,
"Fused all-reduce + RMSNorm").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core
from jax._src.interpreters import mlir

from jaxll import call_sites, lowering
from jaxll.all_reduce import _check_axes_bound, _normalize_axes, all_reduce

FUSED = "fused"

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
    algorithm: the all-reduce's algorithm, as in :func:`jaxll.all_reduce`, or
      ``"fused"``: one kernel for all three steps where a jaxll workspace
      serves the axes (float32/bfloat16/float16, the hidden size's bytes a
      multiple of 8), else the composition. Opt-in: it wins for a few tokens
      per step (see ``benchmarks/README.md``).

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
  if algorithm != FUSED:
    return _composed(x, residual, weight, axis_name, eps=eps, algorithm=algorithm)
  axes = _normalize_axes(axis_name)
  if not axes:
    return _composed(x, residual, weight, axis_name, eps=eps, algorithm="auto")
  _check_axes_bound(axes)
  return _fused(x, residual, weight.astype(x.dtype), axes, float(eps))


def _composed(x, residual, weight, axis_name, *, eps, algorithm):
  reduced = all_reduce(x, axis_name, algorithm=algorithm)
  new_residual = (reduced.astype(jnp.float32) + residual.astype(jnp.float32)).astype(x.dtype)
  h = new_residual.astype(jnp.float32)
  inv = jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + jnp.float32(eps))
  normed = (h * inv).astype(x.dtype) * weight.astype(x.dtype)
  return normed, new_residual


# --- The fused kernel ------------------------------------------------------------------
# A primitive with two results; its derivative is the composition's (so the
# backward pass reduces through jaxll.all_reduce), and its lowering emits the
# kernel where a workspace serves the axes, else the composition.

all_reduce_rmsnorm_p = core.Primitive("jaxll_all_reduce_rmsnorm")
all_reduce_rmsnorm_p.multiple_results = True


def _fused(x, residual, weight, axes, eps):
  fn = jax.custom_jvp(lambda x, r, w: tuple(
      all_reduce_rmsnorm_p.bind(x, r, w, axes=axes, eps=eps)))
  fn.defjvp(lambda p, t: (fn(*p), jax.jvp(
      lambda x, r, w: _composed(x, r, w, axes, eps=eps, algorithm="auto"), p, t)[1]))
  return fn(x, residual, weight)


def _abstract_eval(x, residual, weight, *, axes, eps):
  del eps
  vma = getattr(x, "vma", None)
  if vma is None:
    out = core.ShapedArray(x.shape, x.dtype)
    return [out, out]
  out_vma = (frozenset(vma) - set(axes)) | frozenset(residual.vma) | frozenset(weight.vma)
  out = x.update(vma=out_vma)
  return [out, out]


all_reduce_rmsnorm_p.def_abstract_eval(_abstract_eval)


def _composed_lowering(ctx, x, residual, weight, *, axes, eps):
  return mlir.lower_fun(
      lambda a, r, w: list(_composed(a, r, w, axes, eps=eps, algorithm="auto")),
      multiple_results=True)(ctx, x, residual, weight)


def _fused_lowering(ctx, x, residual, weight, *, axes, eps):
  aval = ctx.avals_in[0]
  ws, group_size, reason = lowering.workspace_for(ctx, axes)
  hidden = aval.shape[-1] if aval.shape else 0
  if ws and np.dtype(aval.dtype) not in _FLOATS:
    ws, reason = 0, f"no fused kernel for {np.dtype(aval.dtype)}"
  if ws and (hidden * np.dtype(aval.dtype).itemsize) % 8:
    ws, reason = 0, "the hidden size's bytes are not a multiple of 8"
  if ws:
    results = lowering.emit_ordered_call(ctx, "jaxll_all_reduce_rmsnorm",
                                         [x, residual, weight], workspace=ws,
                                         eps=np.float32(eps))
    algorithm, reason = "fused_oneshot_ll", "algorithm='fused' requested"
  else:
    results = _composed_lowering(ctx, x, residual, weight, axes=axes, eps=eps)
    algorithm = "xla+composed"
  site = call_sites.CallSite(
      site=lowering._site(ctx), axes=",".join(map(str, axes)), group_size=group_size,
      shape=str(tuple(aval.shape)), dtype=str(np.dtype(aval.dtype)),
      nbytes=int(aval.size) * np.dtype(aval.dtype).itemsize, op="sum+rmsnorm",
      requested=FUSED, algorithm=algorithm, reason=reason, workspace=ws)
  if ws:
    lowering._tag(results, site)
  call_sites.record(site)
  return results


mlir.register_lowering(all_reduce_rmsnorm_p, _composed_lowering, cacheable=False)
mlir.register_lowering(all_reduce_rmsnorm_p, _fused_lowering, platform="cuda", cacheable=False)
