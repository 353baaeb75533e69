"""``jaxll.all_gather`` and ``jaxll.psum_scatter``: drop-ins for
``jax.lax.all_gather`` and ``jax.lax.psum_scatter`` inside ``jax.shard_map``.

Each is a primitive of its own (``jaxll_all_gather``, ``jaxll_psum_scatter``)
that borrows its typing from the JAX primitive the same call binds, so result
shapes, dtypes, ``check_vma`` types and error messages are theirs:
``all_gather`` (``to="varying"``), ``all_gather_invariant`` (``"invarying"``)
or ``all_gather_reduced`` (``"reduced"``); ``reduce_scatter``, or
``unreduced_reduce_scatter`` for an input typed ``unreduced`` over the axes.
Both are linear: all_gather transposes to psum_scatter over the same axes and
dimension (``to="reduced"`` to the unreduced psum_scatter; ``"invarying"`` to
this device's slice, without communication), and psum_scatter to all_gather
(of an unreduced input: ``to="reduced"``), each through jaxll's primitive (so
a backward pass reaches jaxll's kernels too). ``vmap`` follows JAX's rules: a
batch dimension is more data for the same collective, and a collective over
the vmapped axis itself is computed locally; like JAX, the explicit-sharding
forms (``to="reduced"``, unreduced inputs) are not batched.

Lowering: ``algorithm="oneshot_ll"`` (LL16, barrier-free),
``"oneshot_sentinel"`` (full-width stores into scratch that holds a NaN
pattern until written, barrier-free; floating types only: a gathered element
whose bits are all ones arrives as the canonical NaN) or ``"oneshot_barrier"``
(plain stores between two flag barriers, the baseline) runs jaxll's kernel
(``ffi/kernels/gather_scatter.cu``) where a workspace serves the axes, for
float32, bfloat16, float16 and int32, gathering along (or scattering) any
dimension in place (segments of whole transfer units move a unit an access,
others element by element into whole units: ``ffi/kernels/pieces.cuh``), and
raises AlgorithmUnavailableError elsewhere. Messages of any size go in rounds
of one scratch region per block, alternating the two scratch buffers by epoch
parity.
``"auto"`` takes a kernel where one can serve and every rank moves at most
jaxll.all_reduce's auto crossover (the gathered result, or the scattered
input), else XLA's collective (exactly what ``jax.lax`` emits); of the kernels,
LL16 for small pieces and the sentinel kernel from the piece size where that
one measured faster (``jaxll.choice.gather_scatter_auto``, from
``jaxll/tuning/gather_scatter.json``). ``"xla"`` always lowers to XLA's. Every
call site is recorded for ``jaxll.explain``.
"""

from __future__ import annotations

from functools import partial

import jax
import numpy as np
from jax import lax
from jax.interpreters import ad, batching

from jaxll import algorithms, choice, internals, ordering, placement, sites
# (ALGORITHMS and KERNEL_ALGORITHMS: the algorithms of these collectives, named here too)
from jaxll.collective_common import (ALGORITHMS, KERNEL_ALGORITHMS, KERNEL_DTYPES,  # noqa: F401
                                     SENTINEL_DTYPES, map_leaves, named_kernel,
                                     record_site, requested)
from jaxll.placement import AlgorithmUnavailableError

all_gather_p = internals.CollectivePrimitive("jaxll_all_gather")
psum_scatter_p = internals.CollectivePrimitive("jaxll_psum_scatter")

# all_gather's output types, as jax.lax.all_gather names them
GATHER_TO = ("varying", "invarying", "reduced")


def all_gather(x, axis_name, *, axis: int = 0, tiled: bool = False, to: str = "varying",
               algorithm: str = "auto", deterministic: bool | None = None):
  """Gathers ``x`` from every device of the mesh axis (or axes) ``axis_name``.

  Use it inside ``jax.shard_map`` where you would use ``jax.lax.all_gather``:
  the result, its shape and dtype, its type under ``check_vma``, ``jit``,
  ``grad`` and ``vmap`` behave the same. With ``tiled=False`` the gathered
  pieces are stacked along a new axis at position ``axis``; with
  ``tiled=True`` they are concatenated along the existing axis ``axis``. For
  several axis names the pieces are in row-major order over the names as given.
  ``x`` may be a pytree; an empty ``axis_name`` tuple returns ``x``.

  Args:
    x: array (or pytree of arrays), the per-device value.
    axis_name: a mesh axis name, or a tuple of them.
    axis: where the pieces go (see above).
    tiled: concatenate (True) or stack (False).
    to: the result's type over ``axis_name`` under ``check_vma``, as in
      ``jax.lax.all_gather``: ``"varying"``, ``"invarying"`` (the same on
      every device) or ``"reduced"`` (explicit sharding; ``x`` must vary).
    algorithm: ``"oneshot_ll"``, ``"oneshot_sentinel"`` or
      ``"oneshot_barrier"``: jaxll's kernel (float32, bfloat16, float16,
      int32, sentinel not int32; along any dimension; raises
      AlgorithmUnavailableError where it cannot serve); ``"auto"``: the LL16
      or sentinel kernel (as measured faster) where one serves and the
      gathered result is at most the auto crossover, else XLA's all-gather
      (module docstring); ``"xla"``: XLA's.
    deterministic: as for :func:`jaxll.all_reduce`. A gather's result is
      the same bits on every path, so the choice is auto's; what it changes
      is the reduce-scatter its gradient takes, and ``"xla"`` raises
      ValueError. ``None``: ``JAXLL_DETERMINISTIC``.
  """
  algorithm = requested("all_gather", algorithm, deterministic)
  if to not in GATHER_TO:
    raise ValueError(f"jaxll.all_gather: to must be one of {list(GATHER_TO)}, got {to!r}")

  def bind(v, axes, size, constant):
    if constant:
      return lax.all_gather(v, axes, axis=axis, tiled=tiled, to=to)
    if to == "varying":
      v = internals.insert_collective_pvary(axes, v)
    elif to == "invarying" and internals.GATHER_INVARIANT_CASTS and internals.auto_pcast():
      missing = tuple(a for a in axes if a not in jax.typeof(v).mat.varying)
      v = internals.pvary(v, missing) if missing else v
    dim = _canonical_axis("all_gather", axis, np.ndim(v) if tiled else np.ndim(v) + 1)
    return all_gather_p.bind(v, all_gather_dimension=dim, axis_name=axes, axis_size=size,
                             tiled=bool(tiled), to=to, algorithm=algorithm)

  return map_leaves("all_gather", x, axis_name, bind)


def psum_scatter(x, axis_name, *, scatter_dimension: int = 0, tiled: bool = False,
                 algorithm: str = "auto", deterministic: bool | None = None):
  """Sums ``x`` over the mesh axis (or axes) ``axis_name`` and keeps this
  device's piece of the sum along ``scatter_dimension``.

  Use it inside ``jax.shard_map`` where you would use ``jax.lax.psum_scatter``:
  results, shapes, dtypes, ``check_vma`` types, ``jit``, ``grad`` and ``vmap``
  behave the same. With ``tiled=False`` dimension ``scatter_dimension`` must
  have the group's size and is removed from the result; with ``tiled=True`` it
  must be a multiple of the group's size and is divided by it. ``x`` may be a
  pytree; an empty ``axis_name`` tuple returns ``x``.

  Args:
    x: array (or pytree of arrays), the per-device value.
    axis_name: a mesh axis name, or a tuple of them.
    scatter_dimension: the dimension the sum is split along.
    tiled: keep (True) or remove (False) the scattered dimension.
    algorithm: ``"oneshot_ll"``, ``"oneshot_sentinel"`` or
      ``"oneshot_barrier"``: jaxll's kernel (float32, bfloat16, float16,
      int32, sentinel not int32; along any dimension; the sum
      in rank order, as jaxll.all_reduce; raises AlgorithmUnavailableError
      where it cannot serve); ``"auto"``: the LL16 or sentinel kernel (as
      measured faster) where one serves and ``x`` is at most the auto
      crossover, else XLA's reduce-scatter (module docstring); ``"xla"``: XLA's.
    deterministic: as for :func:`jaxll.all_reduce`: ``"auto"`` takes a
      kernel at every size, and lowering raises AlgorithmUnavailableError
      where none serves. ``None``: ``JAXLL_DETERMINISTIC``.
  """
  algorithm = requested("psum_scatter", algorithm, deterministic)

  def bind(v, axes, size, constant):
    if constant:
      return lax.psum_scatter(v, axes, scatter_dimension=scatter_dimension, tiled=tiled)
    if np.ndim(v) == 0:
      raise ValueError("jaxll.psum_scatter: x must have at least one dimension to scatter")
    unreduced = internals.unreduced_over(v, axes, "jaxll.psum_scatter")
    if not unreduced:
      v = internals.insert_collective_pvary(axes, v)
    dim = _canonical_axis("psum_scatter", scatter_dimension, np.ndim(v))
    return psum_scatter_p.bind(v, scatter_dimension=dim, axis_name=axes, axis_size=size,
                               tiled=bool(tiled), unreduced=unreduced, algorithm=algorithm)

  return map_leaves("psum_scatter", x, axis_name, bind, skip_one_sized=True)


def _canonical_axis(name: str, axis, ndim: int) -> int:
  if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
    raise TypeError(f"jaxll.{name}: the dimension must be an int, got {axis!r}")
  if not -ndim <= axis < ndim:
    raise ValueError(f"jaxll.{name}: dimension {axis} is out of range for {ndim} dimensions")
  return int(axis) % ndim


# --- Typing: JAX's own primitives ---------------------------------------------------

def _gather_abstract_eval(aval, *, all_gather_dimension, axis_name, axis_size, tiled, to,
                          algorithm):
  del algorithm
  params = dict(all_gather_dimension=all_gather_dimension, axis_name=axis_name,
                axis_size=axis_size, tiled=tiled)
  if to == "varying":
    return internals.all_gather_p.abstract_eval(aval, axis_index_groups=None, **params)
  prim = internals.all_gather_invariant_p if to == "invarying" else internals.all_gather_reduced_p
  return prim.abstract_eval(aval, **params)


def _scatter_abstract_eval(aval, *, scatter_dimension, axis_name, axis_size, tiled, unreduced,
                           algorithm):
  del algorithm
  params = dict(scatter_dimension=scatter_dimension, axis_name=axis_name,
                axis_size=axis_size, tiled=tiled)
  if unreduced:
    return internals.unreduced_reduce_scatter_p.abstract_eval(aval, **params)
  return internals.reduce_scatter_p.abstract_eval(aval, axis_index_groups=None, **params)


all_gather_p.def_effectful_abstract_eval(_gather_abstract_eval)
psum_scatter_p.def_effectful_abstract_eval(_scatter_abstract_eval)
# (jax 0.12.1's high values: leading dimensions for unreduced axes of the global sharding)
all_gather_p.lo_params = lambda in_avals, params: dict(
    params, all_gather_dimension=params["all_gather_dimension"]
    + internals.leading_unreduced_dims(in_avals[0]))
psum_scatter_p.lo_params = lambda in_avals, params: dict(
    params, unreduced=False, scatter_dimension=params["scatter_dimension"]
    + internals.leading_unreduced_dims(in_avals[0]))
all_gather_p.def_impl(partial(internals.apply_primitive, all_gather_p))
psum_scatter_p.def_impl(partial(internals.apply_primitive, psum_scatter_p))


# --- Differentiation: each is the other's transpose ---------------------------------

def _gather_transpose(ct, x, *, all_gather_dimension, axis_name, axis_size, tiled, to,
                      algorithm):
  del x
  if type(ct) is ad.Zero:
    return (None,)
  if to == "invarying":
    # Every device holds the whole gathered value; its own piece is its cotangent.
    piece = ct.shape[all_gather_dimension] // axis_size
    out = lax.dynamic_slice_in_dim(ct, lax.axis_index(axis_name) * piece, piece,
                                   axis=all_gather_dimension)
    return (out if tiled else lax.squeeze(out, [all_gather_dimension]),)
  return (psum_scatter_p.bind(ct, scatter_dimension=all_gather_dimension,
                              axis_name=axis_name, axis_size=axis_size, tiled=tiled,
                              unreduced=to == "reduced", algorithm=algorithm),)


def _scatter_transpose(ct, x, *, scatter_dimension, axis_name, axis_size, tiled, unreduced,
                       algorithm):
  del x
  if type(ct) is ad.Zero:
    return (None,)
  return (all_gather_p.bind(ct, all_gather_dimension=scatter_dimension,
                            axis_name=axis_name, axis_size=axis_size, tiled=tiled,
                            to="reduced" if unreduced else "varying", algorithm=algorithm),)


ad.deflinear2(all_gather_p, _gather_transpose)
ad.deflinear2(psum_scatter_p, _scatter_transpose)


# --- Batching -------------------------------------------------------------------------

def _gather_batch(axis_data, vals_in, dims_in, *, all_gather_dimension, axis_name,
                  axis_size, tiled, to, algorithm):
  if to == "reduced":
    raise NotImplementedError("jaxll.all_gather(to='reduced') under jax.vmap (nor does "
                              "JAX batch all_gather_reduced)")
  (x,), (d,) = vals_in, dims_in
  params = dict(axis_name=axis_name, axis_size=axis_size, tiled=tiled, to=to,
                algorithm=algorithm)
  if axis_data.name not in axis_name:
    if d is None:
      return all_gather_p.bind(x, all_gather_dimension=all_gather_dimension, **params), None
    # The batch dimension is more data for the same gather: keep it where it is
    # in the output (a stacked gather inserts a dimension before or after it).
    dim = all_gather_dimension + 1 if d <= all_gather_dimension else all_gather_dimension
    out_d = d if (tiled or d < dim) else d + 1
    return all_gather_p.bind(x, all_gather_dimension=dim, **params), out_d
  # A gather over the vmapped axis itself is a local stack (or concatenation).
  if len(axis_name) > 1:
    raise NotImplementedError(
        "jaxll.all_gather over a vmapped axis together with other axes is not "
        "supported (nor is it by jax.lax.all_gather)")
  if d is None:
    shape = list(np.shape(x))
    shape.insert(all_gather_dimension, axis_size)
    dims = [i for i in range(len(shape)) if i != all_gather_dimension]
    y = lax.broadcast_in_dim(x, shape, dims)
  else:
    y = jax.numpy.moveaxis(x, d, all_gather_dimension)
  if tiled:
    shape = list(y.shape)
    merged = shape[all_gather_dimension] * shape[all_gather_dimension + 1]
    y = y.reshape(shape[:all_gather_dimension] + [merged] + shape[all_gather_dimension + 2:])
  return y, None


def _scatter_batch(axis_data, vals_in, dims_in, *, scatter_dimension, axis_name,
                   axis_size, tiled, unreduced, algorithm):
  if unreduced:
    raise NotImplementedError("jaxll.psum_scatter of an unreduced input under jax.vmap (nor "
                              "does JAX batch unreduced_reduce_scatter)")
  (x,), (d,) = vals_in, dims_in
  params = dict(axis_name=axis_name, axis_size=axis_size, tiled=tiled, unreduced=False,
                algorithm=algorithm)
  if axis_data.name not in axis_name:
    if d is None:
      return psum_scatter_p.bind(x, scatter_dimension=scatter_dimension, **params), None
    dim = scatter_dimension + 1 if d <= scatter_dimension else scatter_dimension
    out_d = d if (tiled or d < dim) else d - 1
    return psum_scatter_p.bind(x, scatter_dimension=dim, **params), out_d
  # A reduce-scatter over the vmapped axis itself: the sum over the batch,
  # whose pieces along scatter_dimension become the batch.
  if len(axis_name) > 1:
    raise NotImplementedError(
        "jaxll.psum_scatter over a vmapped axis together with other axes is not "
        "supported (nor is it by jax.lax.psum_scatter)")
  if d is None:
    y = x * np.array(axis_size, dtype=x.dtype)
  else:
    y = jax.numpy.sum(x, axis=d, dtype=x.dtype)
  if tiled:
    shape = list(y.shape)
    piece = shape[scatter_dimension] // axis_size
    y = y.reshape(shape[:scatter_dimension] + [axis_size, piece] + shape[scatter_dimension + 1:])
  return y, scatter_dimension


batching.fancy_primitive_batchers[all_gather_p] = _gather_batch
batching.fancy_primitive_batchers[psum_scatter_p] = _scatter_batch


# --- Lowering: jaxll's kernel or XLA's collective, recorded for explain --------------

def segment_of(op: str, shape, dim: int, group_size: int) -> int:
  """Elements of one contiguous segment of a rank's piece: a gather along
  `dim` (tiled, or stacked at `dim`) writes each rank's piece as
  prod(shape[:dim]) segments of prod(shape[dim:]) elements, group_size
  segments apart; a reduce-scatter along `dim` reads rank j's piece the same
  way from its input. Along dimension 0 (or past leading dimensions of size 1)
  a piece is one segment."""
  inner = int(np.prod(shape[dim:], dtype=np.int64))
  return inner if op == "all_gather" else inner // group_size


def _decide(ctx, op: str, axes: tuple, algorithm: str) -> tuple[int, str, str]:
  """(workspace id, kernel algorithm, reason): the kernel's workspace, or 0 for
  XLA's collective. (A kernel gathers or scatters along any dimension: the
  segments of a piece need not be whole transfer units.)"""
  if algorithm == "xla":
    return 0, "xla", sites.with_origin("algorithm='xla' requested", ctx, op, axes)
  if algorithm != "auto" and algorithm != algorithms.DETERMINISTIC:
    # (auto: workspace_for below says why, as before)
    reason = placement.disabled_reason(ctx, algorithm, op)
    if reason:
      return 0, "xla", sites.with_origin(reason, ctx, op, axes)
  aval = ctx.avals_in[0]
  problem = ""
  dtypes = SENTINEL_DTYPES if algorithm == "oneshot_sentinel" else KERNEL_DTYPES
  if np.dtype(aval.dtype).name not in dtypes:
    problem = f"no {op} kernel for {np.dtype(aval.dtype)}"
  elif aval.size == 0:
    problem = "empty array"
  itemsize = np.dtype(aval.dtype).itemsize
  if algorithm in ("auto", algorithms.DETERMINISTIC):
    # Deterministic mode: a reduce-scatter that no kernel serves raises (but
    # for a group of one device and an empty array: nothing is summed); an
    # all-gather moves the same bits on every path and chooses as auto.
    deterministic = algorithm == algorithms.DETERMINISTIC
    strict = deterministic and op != "all_gather"
    mode = "" if not deterministic else "deterministic: " if strict else (
        "deterministic: an all-gather moves bits, alike on every path; ")
    # (the size before the workspace: a call that goes to XLA builds none)
    n, unserved = placement.unserved(ctx, axes)

    def xla(why: str):
      if strict and n != 1 and aval.size:
        raise AlgorithmUnavailableError(
            f"jaxll.{op}(deterministic=True) cannot serve the call at "
            f"{sites.call_text(ctx, op, axes)}: {why}")
      return 0, "xla", sites.with_origin(mode + why, ctx, op, axes)

    if problem or unserved:
      return xla(problem or unserved)
    kernel, reason = choice.gather_scatter_auto(op, n, int(aval.size) * itemsize, aval.dtype,
                                                deterministic=strict)
    if kernel == "xla":
      return xla(reason)
    ws, _, problem = placement.workspace_for(ctx, axes)
    return xla(problem) if problem else (
        ws, kernel, sites.with_origin(mode + reason, ctx, op, axes))
  return named_kernel(ctx, op, axes, algorithm, problem)


def _lower(ctx, x, prim, op: str, dim: int, axes: tuple, size: int, algorithm: str, params):
  aval = ctx.avals_in[0]
  ws, kernel, reason = _decide(ctx, op, axes, algorithm)
  if ws:
    segment = segment_of(op, aval.shape, dim, size)
    out = ordering.emit_ordered_call(
        ctx, "jaxll_gather_scatter", [x], workspace=ws,
        collective=np.int64(algorithms.COLLECTIVE_CODES[op]),
        algorithm=np.int64(algorithms.SPECS[kernel].code), segment=np.int64(segment),
        uses_pdl=True)
  else:
    # (every typed form of the collective lowers to the same XLA op as this one)
    out = internals.xla_lowering(prim, placement.platforms(ctx))(
        ctx, x, axis_name=axes, axis_index_groups=None, axis_size=size, **params)
  return record_site(ctx, out, op, axes, size, algorithm, ws, kernel, reason, dim)


def _gather_lowering(ctx, x, *, all_gather_dimension, axis_name, axis_size, tiled, to,
                     algorithm):
  del to
  return _lower(ctx, x, internals.all_gather_p, "all_gather", all_gather_dimension, axis_name,
                axis_size, algorithm,
                dict(all_gather_dimension=all_gather_dimension, tiled=tiled))


def _scatter_lowering(ctx, x, *, scatter_dimension, axis_name, axis_size, tiled, unreduced,
                      algorithm):
  del unreduced
  return _lower(ctx, x, internals.reduce_scatter_p, "psum_scatter", scatter_dimension, axis_name,
                axis_size, algorithm, dict(scatter_dimension=scatter_dimension, tiled=tiled))


internals.register_lowering(all_gather_p, _gather_lowering)
internals.register_lowering(psum_scatter_p, _scatter_lowering)
