"""``jaxll.route_psums(fun)``: every psum inside ``fun``, including the ones JAX
writes itself, lowered through jaxll's decision.

Autodiff and ``check_vma`` insert reductions the user never wrote: the
transpose of an implicit ``pvary`` (a replicated activation meeting a sharded
weight) is a ``psum``, and so is the reduction of gradients of weights
replicated over a mesh axis. They are bound as JAX's own ``psum`` primitives,
so :func:`jaxll.all_reduce` never sees them. ``route_psums`` traces ``fun`` (with
its autodiff, when ``fun`` computes gradients) to a jaxpr, replaces every
sum-reduction primitive over named mesh axes (``psum``, ``psum_invariant``) by
jaxll's all-reduce, nested ones included (``shard_map`` bodies, loops,
conditionals, ``jit``), and evaluates the result. Each replaced reduction is a
jaxll call site: ``auto`` picks a kernel or XLA as for a call written by hand,
``jaxll.explain`` lists it, and its typing (``check_vma``), differentiation and
batching are the ones of ``jaxll.all_reduce``, i.e. psum's.

Left alone: reductions with ``axis_index_groups``, over positional (pmap) axes,
or with several operands in one primitive; pmax/pmin; reductions inside the
backward function of a ``custom_vjp`` that ``fun`` does not differentiate itself
(the backward is traced later, outside the scope: put ``jax.grad`` inside).
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax._src import core
from jax.extend import core as extend_core
from jax._src.lax import parallel

from jaxll import algorithms
from jaxll.all_reduce import all_reduce_p

# Jaxprs with their constants, and without: two classes in older jax, one in
# jax 0.12 (a jaxpr there carries its constants)
_CLOSED = extend_core.ClosedJaxpr
_OPEN = extend_core.Jaxpr

_SUMS = {parallel.psum_invariant_p: True, parallel.psum_p: False}  # -> check_vma


def route_psums(fun=None, *, algorithm: str = "auto"):
  """Returns ``fun`` with its sum-reductions over mesh axes lowered by jaxll.

  Use it around the whole step, gradients included, inside or outside
  ``jax.jit``::

    step = jax.jit(jaxll.route_psums(train_step))

  ``algorithm`` is given to every routed reduction (``"auto"``: jaxll's measured
  choice per call site). Also usable as ``@jaxll.route_psums`` or
  ``@jaxll.route_psums(algorithm=...)``.
  """
  if algorithm not in algorithms.ALGORITHMS:
    raise ValueError(f"jaxll.route_psums: unknown algorithm {algorithm!r}; "
                     f"expected one of {algorithms.ALGORITHMS}")
  if fun is None:
    return functools.partial(route_psums, algorithm=algorithm)

  @functools.wraps(fun)
  def routed(*args, **kwargs):
    leaves, in_tree = jax.tree.flatten((args, kwargs))
    dynamic = [i for i, v in enumerate(leaves) if _is_array(v)]

    def flat_fun(*arrays):
      full = list(leaves)  # other leaves (strings, None-like objects) stay static
      for i, v in zip(dynamic, arrays):
        full[i] = v
      a, k = jax.tree.unflatten(in_tree, full)
      return fun(*a, **k)

    arrays = [leaves[i] for i in dynamic]
    closed, out_shape = jax.make_jaxpr(flat_fun, return_shape=True)(*arrays)
    jaxpr = _route_jaxpr(closed.jaxpr, algorithm)
    out = core.eval_jaxpr(jaxpr, closed.consts, *arrays)
    return jax.tree.unflatten(jax.tree.structure(out_shape), out)

  return routed


def _is_array(v) -> bool:
  return isinstance(v, (jax.Array, np.ndarray, np.generic, bool, int, float, complex,
                        core.Tracer)) or hasattr(v, "__jax_array__")


def _route_eqn(eqn, algorithm: str):
  check_vma = _SUMS.get(eqn.primitive)
  if check_vma is None:
    params = {k: _route_param(v, algorithm) for k, v in eqn.params.items()}
    return eqn.replace(params=params) if params != eqn.params else eqn
  axes = eqn.params.get("axes", ())
  axes = axes if isinstance(axes, tuple) else (axes,)
  if (eqn.params.get("axis_index_groups") is not None or not axes
      or any(not isinstance(a, str) for a in axes)
      or len(eqn.invars) != 1 or len(eqn.outvars) != 1):
    return eqn
  return eqn.replace(primitive=all_reduce_p,
                     params=dict(axes=axes, op="sum", algorithm=algorithm,
                                 check_vma=check_vma))


def _route_param(value, algorithm: str):
  if _CLOSED is not _OPEN and isinstance(value, _CLOSED):
    new = _route_jaxpr(value.jaxpr, algorithm)
    return value if new is value.jaxpr else _CLOSED(new, value.consts)
  if isinstance(value, _OPEN):
    return _route_jaxpr(value, algorithm)
  if isinstance(value, tuple) and any(isinstance(v, (_OPEN, _CLOSED)) for v in value):
    return tuple(_route_param(v, algorithm) for v in value)
  return value


def _route_jaxpr(jaxpr, algorithm: str):
  eqns = [_route_eqn(e, algorithm) for e in jaxpr.eqns]
  if all(a is b for a, b in zip(eqns, jaxpr.eqns)):
    return jaxpr
  return jaxpr.replace(eqns=eqns)
