"""``jaxll.route(fun)``: every collective inside ``fun``, including the ones JAX
writes itself, lowered through jaxll's decision.

Autodiff and ``check_vma`` insert collectives the user never wrote: the
transpose of an implicit ``pvary`` (a replicated activation meeting a sharded
weight) is a ``psum``, the transpose of an ``all_gather`` a ``psum_scatter``,
and the reduction of gradients of weights replicated over a mesh axis a
``psum``. They are bound as JAX's own primitives, so jaxll's functions never
see them, and neither do collectives written with ``jax.lax``. ``route`` traces
``fun`` (with its autodiff, when ``fun`` computes gradients) to a jaxpr,
replaces every collective primitive over named mesh axes by jaxll's, nested
ones included (``shard_map`` bodies, loops, conditionals, ``jit``), and
evaluates the result:

=============================================== ==================================
JAX's primitive                                 jaxll's
=============================================== ==================================
``psum``, ``psum_invariant``, ``unreduced_psum``  ``jaxll.all_reduce`` (``op="sum"``)
``pmax``, ``pmin`` (and their unreduced forms)    ``jaxll.all_reduce`` (``op="max"``, ``"min"``)
``all_gather``, ``all_gather_invariant``,         ``jaxll.all_gather`` (``to=`` the same)
``all_gather_reduced``
``reduce_scatter``, ``unreduced_reduce_scatter``  ``jaxll.psum_scatter``
=============================================== ==================================

(``pmean`` is a psum and a division.) Each replaced collective is a jaxll call
site: ``auto`` picks a kernel or XLA as for a call written by hand,
``jaxll.explain`` lists it, and its typing (``check_vma``, explicit sharding),
differentiation and batching are the ones of jaxll's function, i.e. JAX's.

Left alone: collectives with ``axis_index_groups``, over positional (pmap)
axes, or not in ``collectives``; collectives inside the backward function of a
``custom_vjp`` that ``fun`` does not differentiate itself (the backward is
traced later, outside the scope: put ``jax.grad`` inside).
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.extend import core as extend_core

from jaxll import algorithms, gather_scatter, internals
from jaxll.all_reduce import all_reduce_p
from jaxll.gather_scatter import all_gather_p, psum_scatter_p

# Jaxprs with their constants, and without: two classes in older jax, one in
# jax 0.12 (a jaxpr there carries its constants)
_CLOSED = extend_core.ClosedJaxpr
_OPEN = extend_core.Jaxpr

COLLECTIVES = ("psum", "pmax", "pmin", "all_gather", "psum_scatter")


def _all_reduce_rule(op: str, check_vma, unreduced: bool):
  def rule(eqn, axes):
    vma = check_vma
    if vma is None:  # (pmax/pmin: under check_vma, jax.lax made the operand vary over axes)
      vma = bool(set(axes) & set(eqn.invars[0].aval.mat.varying))
    return all_reduce_p, dict(axes=axes, op=op, check_vma=vma, unreduced=unreduced)
  return rule


def _gather_scatter_rule(prim, dimension: str, **typed):
  """all_gather's or psum_scatter's: JAX's shape parameters, and its typed form."""
  def rule(eqn, axes):
    p = eqn.params
    return prim, dict(axis_name=axes, axis_size=p["axis_size"], tiled=p["tiled"],
                      **{dimension: p[dimension]}, **typed)
  return rule


_gather = functools.partial(_gather_scatter_rule, all_gather_p, "all_gather_dimension")
_scatter = functools.partial(_gather_scatter_rule, psum_scatter_p, "scatter_dimension")

# JAX's primitive -> (collective, rule: (eqn, axes) -> jaxll's primitive, its parameters
# but the algorithm)
_RULES = {
    internals.psum_p: ("psum", _all_reduce_rule("sum", False, False)),
    internals.psum_invariant_p: ("psum", _all_reduce_rule("sum", True, False)),
    internals.pmax_p: ("pmax", _all_reduce_rule("max", None, False)),
    internals.pmin_p: ("pmin", _all_reduce_rule("min", None, False)),
    internals.all_gather_p: ("all_gather", _gather(to="varying")),
    internals.all_gather_invariant_p: ("all_gather", _gather(to="invarying")),
    internals.all_gather_reduced_p: ("all_gather", _gather(to="reduced")),
    internals.reduce_scatter_p: ("psum_scatter", _scatter(unreduced=False)),
    internals.unreduced_reduce_scatter_p: ("psum_scatter", _scatter(unreduced=True)),
}
for _op, _prim in internals.UNREDUCED_ALL_REDUCE.items():
  _RULES[_prim] = ("p" + _op, _all_reduce_rule(_op, True, True))


def route(fun=None, *, algorithm: str = "auto", collectives=COLLECTIVES,
          deterministic: bool | None = None):
  """Returns ``fun`` with its collectives over mesh axes lowered by jaxll.

  Use it around the whole step, gradients included, inside or outside
  ``jax.jit``::

    step = jax.jit(jaxll.route(train_step))

  Args:
    fun: the function; also usable as ``@jaxll.route`` or ``@jaxll.route(...)``.
    algorithm: ``"auto"`` (jaxll's measured choice per call site), ``"xla"``,
      or a kernel name, given to the routed collectives that have that kernel
      (the others take ``"auto"``).
    collectives: which to route, of ``"psum"`` (with pmean), ``"pmax"``,
      ``"pmin"``, ``"all_gather"`` and ``"psum_scatter"``.
    deterministic: as for :func:`jaxll.all_reduce`, for every routed
      collective (None: ``JAXLL_DETERMINISTIC``, read when tracing).
  """
  unknown = [c for c in collectives if c not in COLLECTIVES]
  if isinstance(collectives, str) or unknown:
    raise ValueError(f"jaxll.route: collectives must be a sequence of {list(COLLECTIVES)}, "
                     f"got {collectives!r}")
  if algorithm not in set(algorithms.ALGORITHMS) | set(gather_scatter.ALGORITHMS):
    raise ValueError(f"jaxll.route: unknown algorithm {algorithm!r}; expected one of "
                     f"{sorted(set(algorithms.ALGORITHMS) | set(gather_scatter.ALGORITHMS))}")
  if fun is None:
    return functools.partial(route, algorithm=algorithm, collectives=tuple(collectives),
                             deterministic=deterministic)
  chosen = frozenset(collectives)

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
    requested = algorithms.deterministic_request("jaxll.route", algorithm, deterministic)
    # (a kernel name goes to the collectives that have it, the others get auto,
    # in deterministic mode its deterministic form)
    fallback = algorithms.deterministic_request("jaxll.route", algorithms.AUTO, deterministic)
    jaxpr = _route_jaxpr(closed.jaxpr, (requested, fallback), chosen)
    out = jax.core.eval_jaxpr(jaxpr, closed.consts, *arrays)
    return jax.tree.unflatten(jax.tree.structure(out_shape), out)

  return routed


def route_psums(fun=None, *, algorithm: str = "auto", deterministic: bool | None = None):
  """``jaxll.route`` for sums only (psum, pmean and the sums autodiff writes):
  ``jaxll.route(fun, algorithm=algorithm, collectives=("psum",), deterministic=deterministic)``."""
  if algorithm not in algorithms.ALGORITHMS:
    raise ValueError(f"jaxll.route_psums: unknown algorithm {algorithm!r}; "
                     f"expected one of {algorithms.ALGORITHMS}")
  return route(fun, algorithm=algorithm, collectives=("psum",), deterministic=deterministic)


def _is_array(v) -> bool:
  return isinstance(v, (jax.Array, np.ndarray, np.generic, bool, int, float, complex,
                        jax.core.Tracer)) or hasattr(v, "__jax_array__")


def _algorithm_for(prim, request: tuple[str, str]) -> str:
  """The algorithm a routed collective takes: the one requested where it has
  it, else the fallback (auto, or in deterministic mode its deterministic form)."""
  algorithm, fallback = request
  names = (algorithms.DETERMINISTIC,) + (
      algorithms.ALGORITHMS if prim is all_reduce_p else gather_scatter.ALGORITHMS)
  return algorithm if algorithm in names else fallback


def _route_eqn(eqn, algorithm: tuple[str, str], chosen) -> list:
  entry = _RULES.get(eqn.primitive)
  if entry is None or entry[0] not in chosen:
    params = {k: _route_param(v, algorithm, chosen) for k, v in eqn.params.items()}
    return [eqn.replace(params=params) if params != eqn.params else eqn]
  p = eqn.params
  axes = p.get("axes", p.get("axis_name", ()))
  axes = tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)
  if (p.get("axis_index_groups") is not None or not axes
      or any(not isinstance(a, str) for a in axes) or len(eqn.invars) != len(eqn.outvars)):
    return [eqn]
  # one jaxll call per operand (psum binds a whole pytree as one primitive)
  out = []
  for invar, outvar in zip(eqn.invars, eqn.outvars):
    one = eqn.replace(invars=[invar], outvars=[outvar])
    prim, params = entry[1](one, axes)
    params["algorithm"] = _algorithm_for(prim, algorithm)  # (a kernel the collective has)
    out.append(one.replace(primitive=prim, params=params))
  return out


def _route_param(value, algorithm: tuple[str, str], chosen):
  if _CLOSED is not _OPEN and isinstance(value, _CLOSED):
    new = _route_jaxpr(value.jaxpr, algorithm, chosen)
    return value if new is value.jaxpr else _CLOSED(new, value.consts)
  if isinstance(value, _OPEN):
    return _route_jaxpr(value, algorithm, chosen)
  if isinstance(value, tuple) and any(isinstance(v, (_OPEN, _CLOSED)) for v in value):
    return tuple(_route_param(v, algorithm, chosen) for v in value)
  return value


def _route_jaxpr(jaxpr, algorithm: tuple[str, str], chosen):
  eqns = [new for e in jaxpr.eqns for new in _route_eqn(e, algorithm, chosen)]
  if len(eqns) == len(jaxpr.eqns) and all(a is b for a, b in zip(eqns, jaxpr.eqns)):
    return jaxpr
  return jaxpr.replace(eqns=eqns)
