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
``ppermute``                                      ``jaxll.ppermute``
``all_to_all``                                    ``jaxll.all_to_all``
``ragged_all_to_all``                             ``jaxll.ragged_all_to_all``
=============================================== ==================================

(``pmean`` is a psum and a division.) Each replaced collective is a jaxll call
site: ``auto`` picks a kernel or XLA as for a call written by hand,
``jaxll.explain`` lists it, and its typing (``check_vma``, explicit sharding),
differentiation and batching are the ones of jaxll's function, i.e. JAX's.

What a call costs. Only arrays are traced: ``jax.Array``, numpy arrays and
scalars, objects with ``__jax_array__``. Every other argument (Python numbers,
strings, None, configuration objects) reaches ``fun`` as given and is static,
as ``jax.jit``'s static arguments are: a new value is a new trace and compile.
Called with no traced argument (outside ``jit``, ``grad``, ``vmap``), the
routed function dispatches through a ``jax.jit`` of its own per signature (the
pytree structure, the static values and the algorithm requested), whose cache
keys the rest (shapes, dtypes, weak types, shardings, JAX's configuration):
``fun`` is traced and compiled once per signature, and a call that hits the
cache costs what a call of ``jax.jit(fun)`` costs. Inputs that a ``jax.jit``
inside ``fun`` donates at its top level are donated by that jit too. Called on
tracers (inside an outer ``jit``, ``grad``, ``vmap``), it traces ``fun`` inline,
once per trace of the caller.

Left alone, and logged once per routed function at INFO on the ``jaxll``
logger: collectives with ``axis_index_groups``, over positional (pmap) axes,
not in ``collectives``, and those jaxll has no kernel for (the asynchronous
``*_start`` forms, ``pbroadcast``, ...); a warning says when ``fun`` holds no collective over
mesh axes at all (a model sharded by annotations alone, whose collectives
XLA's partitioner adds after tracing). Not seen: collectives inside the
backward function of a ``custom_vjp`` that ``fun`` does not differentiate
itself (the backward is traced later, outside the scope: put ``jax.grad``
inside). docs/collectives.md, "What jaxll can and cannot serve", says what
each of these costs.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading

import jax
import numpy as np
from jax.extend import core as extend_core

from jaxll import algorithms, gather_scatter, internals, settings
from jaxll.all_reduce import all_reduce_p
from jaxll.exchange import all_to_all_p, ppermute_p
from jaxll.gather_scatter import all_gather_p, psum_scatter_p
from jaxll.ragged import ALGORITHMS as _RAGGED_ALGORITHMS, ragged_all_to_all_p

logger = logging.getLogger("jaxll")

# Jaxprs with their constants, and without: two classes in older jax, one in
# jax 0.12 (a jaxpr there carries its constants)
_CLOSED = extend_core.ClosedJaxpr
_OPEN = extend_core.Jaxpr

COLLECTIVES = ("psum", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute", "all_to_all",
               "ragged_all_to_all")

# JAX's collectives that jaxll has no kernel for, by primitive name (the
# asynchronous *_start forms included): XLA serves them
_NO_KERNEL = frozenset((
    "ppermute_start", "all_to_all_start",
    "pbroadcast", "pbroadcast_start", "pbroadcast_dynamic", "psend", "precv", "pxor",
    "pmax_scatter", "pmin_scatter", "psum_start", "psum_invariant_start",
    "unreduced_psum_start", "all_gather_start", "all_gather_reduced_start",
    "reduce_scatter_start", "unreduced_reduce_scatter_start"))

# Signatures a routed function keeps compiled (beyond it, the oldest is dropped)
_MAX_SIGNATURES = 1024

_DOCS = 'docs/collectives.md, "What jaxll can and cannot serve"'


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


def _ppermute_rule(eqn, axes):
  return ppermute_p, dict(axis_name=axes, perm=tuple(map(tuple, eqn.params["perm"])))


def _all_to_all_rule(eqn, axes):
  p = eqn.params
  return all_to_all_p, dict(axis_name=axes, split_axis=p["split_axis"],
                            concat_axis=p["concat_axis"], tiled=p["tiled"])


def _ragged_rule(eqn, axes):
  return ragged_all_to_all_p, dict(axis_name=axes, axis_index_groups=None)


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
    internals.ppermute_p: ("ppermute", _ppermute_rule),
    internals.all_to_all_p: ("all_to_all", _all_to_all_rule),
    internals.ragged_all_to_all_p: ("ragged_all_to_all", _ragged_rule),
}
# collectives of several operands that are one call (not one call per operand)
_WHOLE = frozenset(("ragged_all_to_all",))
for _op, _prim in internals.UNREDUCED_ALL_REDUCE.items():
  _RULES[_prim] = ("p" + _op, _all_reduce_rule(_op, True, True))


def route(fun=None, *, algorithm: str = "auto", collectives=COLLECTIVES,
          deterministic: bool | None = None):
  """Returns ``fun`` with its collectives over mesh axes lowered by jaxll.

  Use it around the whole step, gradients included, inside or outside
  ``jax.jit``::

    step = jax.jit(jaxll.route(train_step))   # or jaxll.route(jax.jit(train_step))

  Only array arguments are traced (``jax.Array``, numpy arrays and scalars,
  objects with ``__jax_array__``); the others (Python numbers, strings, None,
  configuration objects) reach ``fun`` as given and are static: a new value
  traces and compiles ``fun`` anew, as for ``jax.jit``'s static arguments.
  Called outside any trace, the routed function compiles once per signature
  and then costs what ``jax.jit(fun)`` costs per call plus a lookup of the
  call's signature in Python (a few µs; wrap it in ``jax.jit`` to drop that),
  keeping the donation of a donating ``jax.jit`` inside ``fun``; under an
  outer ``jit`` it is traced once per trace of the caller.

  Args:
    fun: the function; also usable as ``@jaxll.route`` or ``@jaxll.route(...)``.
    algorithm: ``"auto"`` (jaxll's measured choice per call site), ``"xla"``,
      or a kernel name, given to the routed collectives that have that kernel
      (the others take ``"auto"``).
    collectives: which to route, of ``"psum"`` (with pmean), ``"pmax"``,
      ``"pmin"``, ``"all_gather"``, ``"psum_scatter"``, ``"ppermute"``,
      ``"all_to_all"`` and ``"ragged_all_to_all"``.
    deterministic: as for :func:`jaxll.all_reduce`, for every routed
      collective (None: ``JAXLL_DETERMINISTIC``, read at each call).
  """
  unknown = [c for c in collectives if c not in COLLECTIVES]
  if isinstance(collectives, str) or unknown:
    raise ValueError(f"jaxll.route: collectives must be a sequence of {list(COLLECTIVES)}, "
                     f"got {collectives!r}")
  if algorithm not in set(algorithms.ALGORITHMS) | set(gather_scatter.ALGORITHMS):
    raise ValueError(f"jaxll.route: unknown algorithm {algorithm!r}; expected one of "
                     f"{sorted(set(algorithms.ALGORITHMS) | set(gather_scatter.ALGORITHMS))}")
  if deterministic is not None and not isinstance(deterministic, (bool, np.bool_)):
    raise TypeError(f"jaxll.route: deterministic must be True, False or None, "
                    f"got {deterministic!r}")
  if fun is None:
    return functools.partial(route, algorithm=algorithm, collectives=tuple(collectives),
                             deterministic=deterministic)
  router = _Router(fun, algorithm, frozenset(collectives), deterministic)

  @functools.wraps(fun)
  def routed(*args, **kwargs):
    return router.call(args, kwargs)

  return routed


def route_psums(fun=None, *, algorithm: str = "auto", deterministic: bool | None = None):
  """``jaxll.route`` for sums only (psum, pmean and the sums autodiff writes):
  ``jaxll.route(fun, algorithm=algorithm, collectives=("psum",), deterministic=deterministic)``."""
  if algorithm not in algorithms.ALGORITHMS:
    raise ValueError(f"jaxll.route_psums: unknown algorithm {algorithm!r}; "
                     f"expected one of {algorithms.ALGORITHMS}")
  return route(fun, algorithm=algorithm, collectives=("psum",), deterministic=deterministic)


# --- Calls: one trace and one compile per signature --------------------------------------

# What a leaf of the arguments is, by its type: traced (an array, a tracer, an
# object with __jax_array__) or static
_STATIC, _ARRAY, _TRACER, _PROTOCOL = 1, 2, 3, 4


class _Kinds(dict):
  """type -> _STATIC, _ARRAY, _TRACER or _PROTOCOL, filled in as types come."""

  def __missing__(self, t):
    if issubclass(t, jax.core.Tracer):
      kind = _TRACER
    elif issubclass(t, (jax.Array, np.ndarray, np.generic)):
      kind = _ARRAY
    elif hasattr(t, "__jax_array__"):
      kind = _PROTOCOL
    else:
      kind = _STATIC
    self[t] = kind
    return kind


_KINDS = _Kinds()


class _ByIdentity:
  """A static argument that cannot be hashed, keyed by identity (and kept alive)."""
  __slots__ = ("value",)

  def __init__(self, value):
    self.value = value

  def __hash__(self):
    return id(self.value)

  def __eq__(self, other):
    return isinstance(other, _ByIdentity) and other.value is self.value


def _static_key(v):
  """A static leaf's part of a signature: its type and value (floats by repr,
  so that -0.0 and nan key as themselves; the unhashable by identity)."""
  t = type(v)
  if t is float or t is complex:
    return t, repr(v)
  try:
    hash(v)
  except Exception:  # (jit and shard_map take such arguments as they are)
    return t, _ByIdentity(v)
  return t, v


@dataclasses.dataclass(frozen=True, eq=False)
class _Signature:
  """What a call fixes besides its arrays: the pytree of (args, kwargs), its
  static leaves (``template``, None where an array goes), where the arrays go,
  and the algorithm request, (requested, fallback)."""
  tree: object
  template: tuple
  dynamic: tuple
  request: tuple


@dataclasses.dataclass(frozen=True, eq=False)
class _Traced:
  """``fun`` traced for one signature and avals, its collectives routed."""
  jaxpr: object
  consts: tuple
  out_tree: object

  def in_avals(self):
    return [v.aval for v in self.jaxpr.invars]

  def has_tracer_consts(self) -> bool:
    return any(isinstance(c, jax.core.Tracer) for c in self.consts)

  def donation(self) -> tuple:
    """Per input, whether a jit at the top level of the jaxpr donates it."""
    index = {v: i for i, v in enumerate(self.jaxpr.invars)}
    donated = [False] * len(index)
    for eqn in self.jaxpr.eqns:
      for var, d in zip(eqn.invars, eqn.params.get("donated_invars") or ()):
        if d and isinstance(var, extend_core.Var) and var in index:
          donated[index[var]] = True
    return tuple(donated)

  def evaluate(self, arrays):
    out = jax.core.eval_jaxpr(self.jaxpr, self.consts, *arrays)
    return jax.tree.unflatten(self.out_tree, out)


class _Retrace(Exception):
  """Raised inside a jit's trace whose donation (or want of a jit at all: ``fun``
  closes over an outer trace's values) is not what the traced jaxpr needs."""

  def __init__(self, traced: _Traced):
    super().__init__("jaxll.route: dispatch changes")
    self.traced = traced


@dataclasses.dataclass
class _Entry:
  """A signature's dispatch: the jit per donation pattern, and the pattern the
  last trace found (None: evaluate inline, ``fun`` closes over tracers)."""
  signature: _Signature
  donation: tuple | None
  jits: dict


class _Router:
  """One routed function: its compiled signatures and what it has logged."""

  def __init__(self, fun, algorithm, chosen, deterministic):
    self.fun = fun
    self.algorithm = algorithm
    self.chosen = chosen
    self.deterministic = deterministic
    self.name = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None) or repr(fun)
    self.plain_request = (algorithm, algorithms.AUTO)
    self.entries: dict = {}
    self.handoff = threading.local()  # the jaxpr a first call traced, for its jit's trace
    self.warned = False
    self.noted: set = set()

  def request(self) -> tuple:
    """(requested, fallback): a kernel name goes to the collectives that have
    it, the others get auto, in deterministic mode its deterministic form."""
    deterministic = self.deterministic
    if deterministic is None:
      deterministic = settings.deterministic()
    if not deterministic:
      return self.plain_request
    return (algorithms.deterministic_request("jaxll.route", self.algorithm, True),
            algorithms.deterministic_request("jaxll.route", algorithms.AUTO, True))

  def call(self, args, kwargs):
    leaves, tree = jax.tree.flatten((args, kwargs))
    kinds = tuple(map(_KINDS.__getitem__, map(type, leaves)))
    request = self.request()
    if _STATIC in kinds or _PROTOCOL in kinds:
      arrays, dynamic, statics = [], [], []
      for i, (v, kind) in enumerate(zip(leaves, kinds)):
        if kind == _STATIC:
          statics.append(_static_key(v))
          continue
        if kind == _PROTOCOL:
          v = leaves[i] = v.__jax_array__()
          if isinstance(v, jax.core.Tracer):
            kinds = kinds[:i] + (_TRACER,) + kinds[i + 1:]
        arrays.append(v)
        dynamic.append(i)
      key = (tree, kinds, tuple(statics), request)
    else:
      arrays, dynamic, key = leaves, range(len(leaves)), (tree, kinds, request)
    if (_TRACER in kinds or _ARRAY not in kinds) and internals.in_eager_shard_map():
      # an eager shard_map body (outside jit): JAX runs it op by op on each
      # device's values, XLA's collectives included, and so does route
      return self.fun(*args, **kwargs)
    if _TRACER in kinds:  # under a trace of the caller: inline, once per trace of the caller
      return self.trace(self.signature(tree, leaves, dynamic, request), arrays).evaluate(arrays)
    entry = self.entries.get(key)
    if entry is None:
      return self.first_call(key, self.signature(tree, leaves, dynamic, request), arrays)
    if entry.donation is None:  # (the last trace closed over an outer trace's values)
      return self.dispatch(entry, arrays, self.trace(entry.signature, arrays))
    jitted = entry.jits.get(entry.donation)
    if jitted is None:
      jitted = self.jit(entry, entry.donation)
    try:
      return jitted(*arrays)
    except _Retrace as r:  # a trace for new avals needs another donation
      return self.dispatch(entry, arrays, r.traced)

  @staticmethod
  def signature(tree, leaves, dynamic, request) -> _Signature:
    template = list(leaves)
    for i in dynamic:
      template[i] = None
    return _Signature(tree, tuple(template), tuple(dynamic), request)

  def first_call(self, key, signature: _Signature, arrays):
    traced = self.trace(signature, arrays)
    entry = _Entry(signature, None, {})
    out = traced.evaluate(arrays) if traced.has_tracer_consts() else \
        self.dispatch(entry, arrays, traced)
    self.entries[key] = entry  # (only once the call succeeded)
    if len(self.entries) > _MAX_SIGNATURES:
      del self.entries[next(iter(self.entries))]
    return out

  def dispatch(self, entry: _Entry, arrays, traced: _Traced):
    """Calls the jit for `traced`'s donation, whose trace takes `traced` over."""
    for _ in range(3):
      if traced.has_tracer_consts():
        entry.donation = None
        return traced.evaluate(arrays)
      entry.donation = traced.donation()
      jitted = entry.jits.get(entry.donation)
      if jitted is None:
        jitted = self.jit(entry, entry.donation)
      self.handoff.value = (entry.signature, traced)
      try:
        return jitted(*arrays)
      except _Retrace as r:
        traced = r.traced
      finally:
        self.handoff.value = None
    raise RuntimeError(f"jaxll.route({self.name}): the donation of its inputs changes "
                       f"from trace to trace")

  def jit(self, entry: _Entry, donation: tuple):
    signature = entry.signature

    def body(*arrays):
      handed = getattr(self.handoff, "value", None)
      traced = None
      if handed is not None and handed[0] is signature:
        self.handoff.value = None
        if handed[1].in_avals() == [jax.typeof(a) for a in arrays]:
          traced = handed[1]
      if traced is None:
        traced = self.trace(signature, arrays)
        if traced.has_tracer_consts() or traced.donation() != donation:
          raise _Retrace(traced)
      return traced.evaluate(arrays)

    body.__name__ = getattr(self.fun, "__name__", "routed")
    body.__qualname__ = body.__name__
    jitted = jax.jit(body, donate_argnums=tuple(i for i, d in enumerate(donation) if d))
    entry.jits[donation] = jitted
    return jitted

  def trace(self, signature: _Signature, arrays) -> _Traced:
    """``fun`` traced on `arrays`' avals, with `signature`'s static leaves."""
    out_trees = []

    def flat_fun(*dynamic):
      leaves = list(signature.template)
      for i, v in zip(signature.dynamic, dynamic):
        leaves[i] = v
      a, k = jax.tree.unflatten(signature.tree, leaves)
      out, out_tree = jax.tree.flatten(self.fun(*a, **k))
      out_trees.append(out_tree)
      return out

    closed = jax.make_jaxpr(flat_fun)(*arrays)
    notes = _Notes()
    jaxpr = _route_jaxpr(closed.jaxpr, signature.request, self.chosen, notes)
    self.log(notes)
    return _Traced(jaxpr, tuple(closed.consts), out_trees[-1])

  def log(self, notes: "_Notes") -> None:
    left = sorted(notes.left - self.noted)
    if left:
      self.noted.update(left)
      logger.info("jaxll.route(%s) leaves to XLA: %s (%s)", self.name,
                  "; ".join(f"{prim}: {why}" for prim, why in left), _DOCS)
    if notes.over_mesh_axes == 0 and not self.warned:
      self.warned = True
      logger.warning(
          "jaxll.route(%s): tracing it found no collective over mesh axes, so jaxll serves "
          "none of its communication. Collectives that jax.jit's partitioner inserts for "
          "sharding annotations (sharded inputs, with_sharding_constraint, out_shardings) "
          "are added by XLA after tracing, outside shard_map, where jaxll cannot see them: "
          "XLA serves them. To have jaxll serve one, write it with jax.lax inside a "
          "jax.shard_map body. See %s.", self.name, _DOCS)


# --- The rewrite ---------------------------------------------------------------------------

@dataclasses.dataclass
class _Notes:
  """What one rewrite met: how many collectives over mesh axes (routed, left
  alone, or jaxll's already), and (primitive, why) of those left alone."""
  over_mesh_axes: int = 0
  left: set = dataclasses.field(default_factory=set)


def _axes_of(params) -> tuple:
  axes = params.get("axes", params.get("axis_name", ()))
  return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


def _algorithm_for(prim, request: tuple[str, str]) -> str:
  """The algorithm a routed collective takes: the one requested where it has
  it, else the fallback (auto, or in deterministic mode its deterministic form)."""
  algorithm, fallback = request
  names = (algorithms.DETERMINISTIC,) + (
      algorithms.ALGORITHMS if prim is all_reduce_p else
      _RAGGED_ALGORITHMS if prim is ragged_all_to_all_p else gather_scatter.ALGORITHMS)
  return algorithm if algorithm in names else fallback


def _note_other(eqn, notes: _Notes) -> None:
  """Counts jaxll's own collectives and notes JAX's that jaxll has no kernel for."""
  if isinstance(eqn.primitive, internals.CollectivePrimitive):
    notes.over_mesh_axes += 1
  elif eqn.primitive.name in _NO_KERNEL:
    axes = _axes_of(eqn.params)
    if axes and all(isinstance(a, str) for a in axes):
      notes.over_mesh_axes += 1
      notes.left.add((eqn.primitive.name, "jaxll has no kernel for it"))
    else:
      notes.left.add((eqn.primitive.name, "positional (pmap) axes"))


def _left_alone(entry, eqn, axes, chosen) -> str | None:
  """Why a collective JAX binds stays JAX's, or None to route it."""
  if entry[0] not in chosen:
    return f"{entry[0]!r} is not in collectives="
  if eqn.params.get("axis_index_groups") is not None:
    return "axis_index_groups"
  if not axes or any(not isinstance(a, str) for a in axes):
    return "positional (pmap) axes"
  if len(eqn.invars) != len(eqn.outvars) and entry[0] not in _WHOLE:
    return "operands and results differ in number"
  return None


def _route_eqn(eqn, algorithm: tuple[str, str], chosen, notes: _Notes) -> list:
  entry = _RULES.get(eqn.primitive)
  if entry is None:
    _note_other(eqn, notes)
    params = {k: _route_param(v, algorithm, chosen, notes) for k, v in eqn.params.items()}
    return [eqn.replace(params=params) if params != eqn.params else eqn]
  axes = _axes_of(eqn.params)
  if axes and all(isinstance(a, str) for a in axes):
    notes.over_mesh_axes += 1
  why = _left_alone(entry, eqn, axes, chosen)
  if why is not None:
    notes.left.add((eqn.primitive.name, why))
    return [eqn]
  if entry[0] in _WHOLE:
    prim, params = entry[1](eqn, axes)
    params["algorithm"] = _algorithm_for(prim, algorithm)
    return [eqn.replace(primitive=prim, params=params)]
  # one jaxll call per operand (psum binds a whole pytree as one primitive)
  out = []
  for invar, outvar in zip(eqn.invars, eqn.outvars):
    one = eqn.replace(invars=[invar], outvars=[outvar])
    prim, params = entry[1](one, axes)
    params["algorithm"] = _algorithm_for(prim, algorithm)  # (a kernel the collective has)
    out.append(one.replace(primitive=prim, params=params))
  return out


def _route_param(value, algorithm: tuple[str, str], chosen, notes: _Notes):
  if _CLOSED is not _OPEN and isinstance(value, _CLOSED):
    new = _route_jaxpr(value.jaxpr, algorithm, chosen, notes)
    return value if new is value.jaxpr else _CLOSED(new, value.consts)
  if isinstance(value, _OPEN):
    return _route_jaxpr(value, algorithm, chosen, notes)
  if isinstance(value, tuple) and any(isinstance(v, (_OPEN, _CLOSED)) for v in value):
    return tuple(_route_param(v, algorithm, chosen, notes) for v in value)
  return value


def _route_jaxpr(jaxpr, algorithm: tuple[str, str], chosen, notes: _Notes):
  eqns = [new for e in jaxpr.eqns for new in _route_eqn(e, algorithm, chosen, notes)]
  if len(eqns) == len(jaxpr.eqns) and all(a is b for a, b in zip(eqns, jaxpr.eqns)):
    return jaxpr
  return jaxpr.replace(eqns=eqns)
