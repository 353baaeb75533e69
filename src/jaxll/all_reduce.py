"""``jaxll.all_reduce``: a drop-in for ``jax.lax.psum`` (and pmax/pmin) inside
``jax.shard_map``, lowered to jaxll's kernels where they can serve.

The primitive ``jaxll_all_reduce`` borrows its typing from psum's own
primitives (so ``check_vma`` types, effects and error messages match psum's)
and has the same differentiation and batching behaviour: sum is linear, its
tangent is all-reduced the same way, and it transposes as psum does (to a
no-op ``pvary`` under ``check_vma``, to another all-reduce without it). An
input typed ``unreduced`` over the axes (explicit sharding: partial sums still
to be added) is all-reduced the same way and typed, transposed and batched as
JAX's ``unreduced_psum`` (``unreduced_pmax``/``pmin`` where jax has them): the result
is invariant, its cotangent is cast to ``reduced``.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import numpy as np
from jax import lax
from jax.interpreters import ad, batching

from jaxll import algorithms, call_sites, choice, internals, native, ordering, placement, sites
from jaxll.collective_common import (check_axes_bound, collective_pvary, dtypes_extended,
                                     normalize_axes)

all_reduce_p = internals.CollectivePrimitive("jaxll_all_reduce")

_REFERENCE = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}
OPS = ("sum", "max", "min", "mean")


def all_reduce(x, axis_name, *, op: str = "sum", algorithm: str = "auto",
               deterministic: bool | None = None):
  """All-reduces ``x`` over the mesh axis (or axes) ``axis_name``.

  Use it inside ``jax.shard_map`` where you would use ``jax.lax.psum``
  (``op="sum"``), ``jax.lax.pmax`` (``op="max"``), ``jax.lax.pmin``
  (``op="min"``) or ``jax.lax.pmean`` (``op="mean"``: the sum divided by the
  group size, as pmean computes it): results and their dtypes, output types
  under ``check_vma``, ``jit``, ``grad`` and ``vmap`` behave the same. ``x``
  may be a pytree; an empty ``axis_name`` tuple returns ``x`` as psum does.

  Args:
    x: array (or pytree of arrays), the per-device value.
    axis_name: a mesh axis name, or a tuple of them.
    op: ``"sum"``, ``"max"``, ``"min"`` or ``"mean"``.
    algorithm: ``"auto"`` picks per call site from measurements (``jaxll.choice``);
      ``"xla"`` forces XLA's own all-reduce; a kernel name (one of
      ``jaxll.ALGORITHMS``, e.g. ``"oneshot_ll"`` or ``"twoshot_sentinel"``)
      forces that kernel and raises
      :class:`AlgorithmUnavailableError` at lowering if it cannot serve the call.
    deterministic: ``True`` holds the call to jaxll's determinism contract
      (docs/determinism.md): its result is bitwise the same whatever the
      kernel, the message size or the process layout. ``"auto"`` then takes a
      kernel at every size (no crossover to XLA); where no kernel can serve the
      call, lowering raises :class:`AlgorithmUnavailableError` (``"xla"`` and
      ``"twoshot_ll128_atomic"`` raise ValueError at once). ``None`` (default):
      ``JAXLL_DETERMINISTIC``, read when tracing.

  Where no kernel can serve a call (CPU or other backends, a group spanning
  hosts, a cross-process setup that failed, peers without peer access, an
  unsupported dtype or op, ``JAXLL_DISABLE``, or with ``"auto"`` a message past
  the measured crossover), it lowers to XLA's all-reduce, exactly as ``psum``
  would. ``jaxll.explain(f, *args)`` shows which path each call site took.
  """
  if op not in OPS:
    raise ValueError(f"jaxll.all_reduce: op must be one of {list(OPS)}, got {op!r}")
  if algorithm not in algorithms.ALGORITHMS:
    raise ValueError(f"jaxll.all_reduce: algorithm must be one of "
                     f"{list(algorithms.ALGORITHMS)}, got {algorithm!r}")
  algorithm = algorithms.deterministic_request("jaxll.all_reduce", algorithm, deterministic)
  axes = internals.skip_one_sized_axes(normalize_axes(axis_name))
  if not axes:
    # psum(x, ()) is x; pmean(x, ()) is x / 1 (float for integers)
    return jax.tree_util.tree_map(lambda v: v / 1, x) if op == "mean" else x
  check_axes_bound(axes)
  if op == "mean":
    # pmean: the sum over the group, divided by the group size (a constant)
    size = lax.axis_size(axes)
    return jax.tree_util.tree_map(
        lambda v: v / size,
        jax.tree_util.tree_map(partial(_all_reduce_leaf, axes=axes, op="sum",
                                       algorithm=algorithm), x))
  return jax.tree_util.tree_map(partial(_all_reduce_leaf, axes=axes, op=op,
                                        algorithm=algorithm), x)


def _all_reduce_leaf(x, *, axes, op, algorithm):
  dtype = getattr(x, "dtype", None)
  if dtype is None:
    dtype = np.asarray(x).dtype  # (a Python scalar or list: a constant)
  if dtypes_extended(dtype) or not (jax.numpy.issubdtype(dtype, jax.numpy.number)
                                    or dtype == np.bool_):
    raise TypeError(f"jaxll.all_reduce: unsupported dtype {dtype}; it reduces "
                    f"numeric arrays (and bool, summed as int32, like psum)")
  if not isinstance(x, jax.core.Tracer):
    # A constant: psum & co. compute it without any communication.
    return _REFERENCE[op](x, axes)
  if dtype == np.bool_:
    # psum sums bools as int32; pmax/pmin keep them bool (any / all)
    y = _all_reduce_leaf(lax.convert_element_type(x, np.int32), axes=axes, op=op,
                         algorithm=algorithm)
    return y if op == "sum" else lax.convert_element_type(y, np.bool_)
  check_vma = internals.check_vma()
  unreduced = internals.unreduced_over(x, axes, "jaxll.all_reduce")
  if unreduced:
    if op not in internals.UNREDUCED_ALL_REDUCE:
      return _REFERENCE[op](x, axes)  # (this jax has no such collective: its own error)
  else:
    x = collective_pvary(axes, x)
  return all_reduce_p.bind(x, axes=axes, op=op, algorithm=algorithm, check_vma=check_vma,
                           unreduced=unreduced)


# --- Typing ---------------------------------------------------------------------

def _reference(op: str, check_vma: bool, unreduced: bool):
  """(JAX's primitive this call types as, its parameters besides the operand)."""
  if unreduced:
    return internals.UNREDUCED_ALL_REDUCE[op], {}
  if op == "sum" and check_vma:
    return internals.psum_invariant_p, {}
  prim = {"sum": internals.psum_p, "max": internals.pmax_p, "min": internals.pmin_p}[op]
  return prim, {"axis_index_groups": None}


def _abstract_eval(aval, *, axes, op, algorithm, check_vma, unreduced):
  del algorithm
  ref, params = _reference(op, check_vma, unreduced)
  with internals.checking_vma(check_vma):
    return ref.abstract_eval(aval, axes=axes, **params)


all_reduce_p.def_effectful_abstract_eval(_abstract_eval)
# (jax 0.12.1's high values: the low value varies over the unreduced axes)
all_reduce_p.lo_params = lambda in_avals, params: dict(params, unreduced=False)
all_reduce_p.def_impl(partial(internals.apply_primitive, all_reduce_p))


# --- Differentiation ------------------------------------------------------------

def _transpose(ct, x, *, axes, op, algorithm, check_vma, unreduced):
  del x
  if unreduced:
    # Like unreduced_psum: the invariant cotangent becomes reduced (a cast).
    return (internals.preduced(ct, axes),)
  if check_vma:
    # Like psum_invariant: the cotangent of an invariant output is invariant;
    # every device's input contributed to it, so it only changes type.
    return (internals.pvary(ct, axes),)
  # Like psum without check_vma (psum followed by an implicit broadcast).
  return (all_reduce_p.bind(ct, axes=axes, op=op, algorithm=algorithm,
                            check_vma=check_vma, unreduced=False),)


ad.deflinear2(all_reduce_p, _transpose)
_linear_jvp = ad.primitive_jvps[all_reduce_p]


def _jvp(primals, tangents, *, axes, op, algorithm, check_vma, unreduced):
  if op != "sum":
    raise NotImplementedError(
        f"jaxll.all_reduce(op={op!r}) is not differentiable (neither is "
        f"jax.lax.p{op}); only op='sum' is.")
  return _linear_jvp(primals, tangents, axes=axes, op=op, algorithm=algorithm,
                     check_vma=check_vma, unreduced=unreduced)


ad.primitive_jvps[all_reduce_p] = _jvp


# --- Batching -------------------------------------------------------------------

def _batch(axis_data, vals_in, dims_in, *, axes, op, algorithm, check_vma, unreduced):
  if unreduced:
    raise NotImplementedError(
        "jaxll.all_reduce of an unreduced input under jax.vmap (nor does JAX batch "
        "unreduced_psum)")
  (x,), (d,) = vals_in, dims_in
  params = dict(op=op, algorithm=algorithm, check_vma=check_vma, unreduced=False)
  if axis_data.name not in axes:
    # The batch dimension is just more data for the same collective.
    return all_reduce_p.bind(x, axes=axes, **params), d
  # The reduction includes the vmapped axis itself: reduce it locally first.
  rest = tuple(a for a in axes if a != axis_data.name)
  if d is None:
    y = x * np.array(axis_data.size, dtype=x.dtype) if op == "sum" else x
  else:
    reducer = {"sum": jax.numpy.sum, "max": jax.numpy.max, "min": jax.numpy.min}[op]
    y = reducer(x, axis=d)
  if rest:
    y = all_reduce_p.bind(y, axes=rest, **params)
  return y, None


batching.fancy_primitive_batchers[all_reduce_p] = _batch

# --- Lowering ---------------------------------------------------------------------
# The decision needs what only the lowering knows: the platform, the concrete
# mesh (which devices form each reduction group) and the per-device message
# size. The workspace a kernel needs is built here, before the program runs.

@dataclasses.dataclass
class Decision:
  """The path of one call site: a kernel and its workspace, or XLA's all-reduce."""
  algorithm: str
  reason: str
  workspace: int = 0
  group_size: int = 0


def _xla_lowering(ctx, x, *, axes, op, unreduced):
  """XLA's all-reduce, as JAX lowers psum, pmax or pmin (its unreduced forms
  lower to the same op; from jax 0.12.1 they reach lowering as those)."""
  del unreduced
  prim, params = _reference(op, False, False)
  return internals.xla_lowering(prim, placement.platforms(ctx))(ctx, x, axes=axes, **params)


def decide(ctx, aval, axes: tuple, op: str, requested: str) -> Decision:
  """Chooses the path of one call site; raises AlgorithmUnavailableError when a
  forced kernel cannot serve it (or, in deterministic mode, when no kernel can),
  naming the call, and what it is where autodiff or check_vma wrote it."""
  nbytes = int(aval.size) * np.dtype(aval.dtype).itemsize
  deterministic = requested == algorithms.DETERMINISTIC

  def xla(reason: str, group_size: int = 0) -> Decision:
    if requested not in (algorithms.AUTO, algorithms.XLA):
      asked = "deterministic=True" if deterministic else f"algorithm={requested!r}"
      raise placement.AlgorithmUnavailableError(
          f"jaxll.all_reduce({asked}) cannot serve the call at "
          f"{sites.call_text(ctx, op, axes)}: {reason}")
    return Decision(algorithms.XLA, reason, 0, group_size)

  mesh, groups = placement.mesh_groups(ctx, axes)
  n = len(groups[0]) if groups else 0
  if requested == algorithms.XLA:
    return Decision(algorithms.XLA, "algorithm='xla' requested", 0, n)
  if deterministic and n == 1:
    return Decision(algorithms.XLA, "deterministic: group of one device: the result is the "
                    "input, on every path", 0, n)
  reason = placement.disabled_reason(ctx, requested, "all-reduce")
  if reason:
    return xla(reason, n) if deterministic else Decision(algorithms.XLA, reason, 0, n)
  platforms = placement.platforms(ctx)
  if platforms != ("cuda",):
    return xla(f"lowering for {'/'.join(platforms)}; jaxll kernels run on CUDA GPUs", n)
  if native.ext is None:
    placement.warn_no_kernels_once()
    return xla(native.NO_KERNELS_REASON, n)
  if aval.size == 0:
    return xla("empty array", n)
  if mesh is None:
    return xla(placement.no_mesh_reason(ctx))

  if requested in (algorithms.AUTO, algorithms.DETERMINISTIC):
    name, reason = choice.choose_auto(n, nbytes, aval.dtype, op, deterministic)
    if name == algorithms.XLA:
      return xla(reason, n) if deterministic else Decision(algorithms.XLA, reason, 0, n)
  else:
    name, reason = requested, f"algorithm={requested!r} requested"
    problem = algorithms.kernel_limits(name, aval.dtype, op)
    if problem:
      return xla(problem, n)

  if name == algorithms.TWOSHOT_LL128_ATOMIC:
    problem = placement.peer_atomics_problem(groups)
    if problem:
      return xla(problem, n)
  ws_id, problem = placement.workspace_for_groups(groups)
  if problem:
    return xla(problem, n)
  return Decision(name, reason, ws_id, n)


def emit_kernel_call(ctx, x, *, workspace: int, algorithm: str, op: str):
  """The ``jaxll_all_reduce`` custom call (see ordering.emit_ordered_call)."""
  (y,) = ordering.emit_ordered_call(ctx, "jaxll_all_reduce", [x], workspace=workspace,
                           algorithm=np.int64(algorithms.SPECS[algorithm].code),
                           op=np.int64(algorithms.OP_CODES[op]), uses_pdl=True)
  return y


def lower_all_reduce(ctx, x, *, axes, op, algorithm, check_vma, unreduced):
  """The lowering rule: the decision, then the kernel call or XLA's all-reduce, recorded."""
  del check_vma
  aval = ctx.avals_in[0]
  decision = decide(ctx, aval, axes, op, algorithm)
  if decision.algorithm == algorithms.XLA:
    results = _xla_lowering(ctx, x, axes=axes, op=op, unreduced=unreduced)
  else:
    results = [emit_kernel_call(ctx, x, workspace=decision.workspace,
                                algorithm=decision.algorithm, op=op)]
  site = call_sites.CallSite(
      site=sites.site_of(ctx), axes=",".join(map(str, axes)), group_size=decision.group_size,
      shape=str(tuple(aval.shape)), dtype=str(np.dtype(aval.dtype)),
      nbytes=int(aval.size) * np.dtype(aval.dtype).itemsize, op=op, requested=algorithm,
      algorithm=decision.algorithm,
      reason=sites.with_origin(decision.reason, ctx, op, axes),
      workspace=decision.workspace)
  call_sites.tag(results, site)
  call_sites.record(site)
  return results


# Not cacheable: each call site is lowered (and recorded) on its own, and the
# decision depends on the mesh in the lowering context.
internals.register_lowering(all_reduce_p, lower_all_reduce)
