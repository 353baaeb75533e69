"""Tensor-parallel region helpers: the two conjugate operators of Megatron-style
tensor parallelism, with every reduction of forward *and* backward going
through :func:`jaxll.all_reduce`.

With ``check_vma=True``, JAX makes a replicated activation "varying" itself
(an implicit ``pvary``) where it meets a sharded weight, and the transpose of
that pvary in the backward pass is a plain ``psum``: XLA's all-reduce, not
jaxll's. Marking the entry into the tensor-parallel region with
:func:`copy_to_parallel_region` replaces it with an explicit operator whose
backward is ``jaxll.all_reduce``. :func:`reduce_from_parallel_region` marks the
exit (the all-reduce of partial results) with the matching backward.

  h = jaxll.copy_to_parallel_region(x, "tp")      # forward: identity
  a = jax.nn.gelu(h @ w_in)                       # column-parallel (w_in sharded on columns)
  y = jaxll.reduce_from_parallel_region(a @ w_out, "tp")   # row-parallel partial sums

Gradients are those of the same block written with ``jax.lax.psum`` (tested
bitwise on CPU, where both lower to XLA's all-reduce).
"""

from __future__ import annotations

from functools import partial

import jax

from jaxll import internals
from jaxll.all_reduce import all_reduce


def _to_varying(x, axes):
  if not internals.check_vma():
    return x
  return jax.tree_util.tree_map(partial(internals.insert_collective_pvary, axes), x)


def _axes(axis_name):
  return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


@partial(jax.custom_vjp, nondiff_argnums=(1,))
def copy_to_parallel_region(x, axis_name):
  """Identity forward (the value becomes varying over `axis_name` under
  ``check_vma``); backward, the all-reduce of the cotangent over `axis_name`
  through :func:`jaxll.all_reduce` where JAX's implicit pvary would have
  transposed to XLA's psum (Megatron's "f"). Without ``check_vma`` JAX inserts
  no pvary, and the cotangent passes through unchanged, as with psum."""
  return _to_varying(x, _axes(axis_name))


def _copy_fwd(x, axis_name):
  return _to_varying(x, _axes(axis_name)), None


def _copy_bwd(axis_name, _, ct):
  if not internals.check_vma():
    # no implicit pvary without check_vma, so psum-based code reduces nothing
    # here either
    return (ct,)
  return (all_reduce(ct, axis_name),)


copy_to_parallel_region.defvjp(_copy_fwd, _copy_bwd)


def reduce_from_parallel_region(x, axis_name):
  """All-reduce over `axis_name` (Megatron's "g"): :func:`jaxll.all_reduce`
  itself, whose backward is already psum's (under ``check_vma`` the cotangent
  only becomes varying again; without it, another jaxll all-reduce)."""
  return all_reduce(x, axis_name)
