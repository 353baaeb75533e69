"""``jaxll.ppermute`` and ``jaxll.all_to_all``: drop-ins for
``jax.lax.ppermute`` and ``jax.lax.all_to_all`` inside ``jax.shard_map``.

Each is a primitive of its own (``jaxll_ppermute``, ``jaxll_all_to_all``)
with the parameters of the JAX primitive it stands for, whose typing it
borrows, so result shapes, dtypes, ``check_vma`` types and error messages are
JAX's. Both are linear: a ppermute transposes to the ppermute of the inverse
permutation, an all-to-all to the all-to-all with the split and concat
dimensions swapped, each through jaxll's primitive (a backward pass reaches
jaxll's kernels too). ``vmap`` follows JAX's rules: a batch dimension is more
data for the same collective; over the vmapped axis itself a ppermute is a
local gather along the batch, and an all-to-all is what JAX's own batching
rule makes of it (JAX's primitives for the axes left).

Lowering: ``algorithm="oneshot_ll"`` (LL16, barrier-free),
``"oneshot_sentinel"`` (full-width stores into scratch that holds a NaN
pattern until written; floating types only: an element whose bits are all ones
arrives as the canonical NaN) or ``"oneshot_barrier"`` (plain stores between
two flag barriers, the baseline) runs jaxll's kernel
(``ffi/kernels/exchange.cu``) where a workspace serves the axes, for float32,
bfloat16, float16 and int32, and raises AlgorithmUnavailableError elsewhere.
An all-to-all along any split and concat dimensions moves its pieces in place
(no transposes): runs of a piece that are whole transfer units of the protocol
(8 bytes for LL16, 16 otherwise) move a unit an access, shorter or ragged runs
element by element into whole units (``ffi/kernels/pieces.cuh``). A ppermute
sends one way: a rank writes only to its destination's scratch and reads only
its source's, and exchanges a 16-byte call signature with every peer each
round (``ffi/include/jaxll/round.cuh``, "One-way collectives"), which keeps
the scratch safe to reuse with no barrier. Messages of any size go in rounds.
``"auto"`` takes a kernel where one can serve and the operand is at most
jaxll.all_reduce's auto crossover (``jaxll.choice.exchange_auto``), else XLA's
collective, exactly what ``jax.lax`` emits; ``"xla"`` always lowers to XLA's.
Every call site is recorded for ``jaxll.explain``.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from jax import lax
from jax.interpreters import ad, batching

from jaxll import algorithms, choice, internals, ordering, placement, sites
from jaxll.collective_common import (KERNEL_DTYPES, SENTINEL_DTYPES, map_leaves, mesh_axes_size,
                                     named_kernel, record_site, requested)

ppermute_p = internals.CollectivePrimitive("jaxll_ppermute")
all_to_all_p = internals.CollectivePrimitive("jaxll_all_to_all")


def ppermute(x, axis_name, perm, *, algorithm: str = "auto",
             deterministic: bool | None = None):
  """Sends ``x`` from each device of the mesh axis (or axes) ``axis_name`` to
  another, as ``perm`` says.

  Use it inside ``jax.shard_map`` where you would use ``jax.lax.ppermute``:
  the result, its shape and dtype, its type under ``check_vma``, ``jit``,
  ``grad`` (the transpose is the inverse permutation) and ``vmap`` behave the
  same. A device that no pair sends to gets zeros. For several axis names the
  indices are row-major over the names as given. ``x`` may be a pytree; an
  empty ``axis_name`` tuple returns ``x``.

  Args:
    x: array (or pytree of arrays), the per-device value.
    axis_name: a mesh axis name, or a tuple of them.
    perm: pairs ``(source, destination)`` of indices along ``axis_name``; no
      two with the same source or the same destination.
    algorithm: ``"oneshot_ll"``, ``"oneshot_sentinel"`` or
      ``"oneshot_barrier"``: jaxll's kernel (float32, bfloat16, float16,
      int32, sentinel not int32; raises AlgorithmUnavailableError where it
      cannot serve); ``"auto"``: the LL16 or sentinel kernel where one serves
      and ``x`` is at most the auto crossover, else XLA's collective-permute;
      ``"xla"``: XLA's.
    deterministic: as for :func:`jaxll.all_gather`: a ppermute moves bits, so
      the choice is auto's, and ``"xla"`` raises ValueError. ``None``:
      ``JAXLL_DETERMINISTIC``.
  """
  algorithm = requested("ppermute", algorithm, deterministic)
  try:
    pairs = tuple((int(s), int(d)) for s, d in perm)
  except (TypeError, ValueError):
    raise TypeError(f"jaxll.ppermute: perm must be pairs of ints (source, destination), "
                    f"got {perm!r}") from None

  def bind(v, axes, size, constant):
    if constant:
      return lax.ppermute(v, axes, pairs)
    v = internals.insert_collective_pvary(axes, v)
    return ppermute_p.bind(v, axis_name=axes, perm=pairs, algorithm=algorithm)

  return map_leaves("ppermute", x, axis_name, bind)


def all_to_all(x, axis_name, split_axis: int, concat_axis: int, *, tiled: bool = False,
               algorithm: str = "auto", deterministic: bool | None = None):
  """Splits ``x`` along ``split_axis`` into one piece per device of the mesh
  axis (or axes) ``axis_name``, sends piece j to device j, and concatenates
  the pieces received along ``concat_axis``, in the senders' order.

  Use it inside ``jax.shard_map`` where you would use ``jax.lax.all_to_all``:
  results, shapes, dtypes, ``check_vma`` types, ``jit``, ``grad`` and
  ``vmap`` behave the same (negative dimensions count from the end, which
  jax.lax.all_to_all does not take). With ``tiled=False`` dimension ``split_axis`` must
  have the group's size; it is removed, and a dimension of the group's size is
  inserted at ``concat_axis``. With ``tiled=True`` it must be a multiple of
  the group's size: it is divided by it, and ``concat_axis`` multiplied. ``x``
  may be a pytree; an empty ``axis_name`` tuple returns ``x``.

  Args:
    x: array (or pytree of arrays), the per-device value.
    axis_name: a mesh axis name, or a tuple of them.
    split_axis, concat_axis: see above.
    tiled: keep the number of dimensions (True) or move one (False).
    algorithm: ``"oneshot_ll"``, ``"oneshot_sentinel"`` or
      ``"oneshot_barrier"``: jaxll's kernel (float32, bfloat16, float16,
      int32, sentinel not int32; any split and concat dimensions, module
      docstring; raises AlgorithmUnavailableError where it cannot serve);
      ``"auto"``: the LL16 or sentinel kernel where one serves
      and ``x`` is at most the auto crossover, else XLA's all-to-all;
      ``"xla"``: XLA's.
    deterministic: as for :func:`ppermute`.
  """
  algorithm = requested("all_to_all", algorithm, deterministic)
  for name, value in (("split_axis", split_axis), ("concat_axis", concat_axis)):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
      raise TypeError(f"jaxll.all_to_all: {name} must be an int, got {value!r}")

  def bind(v, axes, size, constant):
    if constant:
      return lax.all_to_all(v, axes, split_axis, concat_axis, tiled=tiled)
    ndim = np.ndim(v)
    for value in (split_axis, concat_axis):
      if not -ndim <= value < max(ndim, 1):
        raise ValueError(f"jaxll.all_to_all: dimension {value} is out of range for {ndim} "
                         "dimensions")
    split, concat = int(split_axis) % ndim, int(concat_axis) % ndim
    # (as jax.lax.all_to_all: the checks, and the dimension moved by reshapes)
    if tiled:
      if v.shape[split] % size != 0:
        raise ValueError(f"The size of all_to_all split_axis ({v.shape[split]}) has to be "
                         f"divisible by the size of the named axis {axes} ({size})")
    else:
      if size != v.shape[split]:
        raise ValueError("all_to_all requires the size of the mapped axis axis_name to equal "
                         f"x.shape[split_axis], but they are {size} and {v.shape[split]} "
                         "respectively.")
      if split < concat:
        concat += 1
        v = lax.expand_dims(v, (concat,))
      elif split > concat:
        v = lax.expand_dims(v, (concat,))
        split += 1
    v = internals.insert_collective_pvary(axes, v)
    out = all_to_all_p.bind(v, split_axis=split, concat_axis=concat, axis_name=axes,
                            tiled=bool(tiled), algorithm=algorithm)
    if not tiled and split != concat:
      out = lax.squeeze(out, (split,))
    return out

  return map_leaves("all_to_all", x, axis_name, bind)


# --- Typing: JAX's own primitives ---------------------------------------------------

def _ppermute_abstract_eval(aval, *, axis_name, perm, algorithm):
  del algorithm
  return internals.ppermute_p.abstract_eval(aval, axis_name=axis_name, perm=perm)


def _all_to_all_abstract_eval(aval, *, split_axis, concat_axis, axis_name, tiled, algorithm):
  del algorithm
  return internals.all_to_all_p.abstract_eval(aval, split_axis=split_axis,
                                              concat_axis=concat_axis, axis_name=axis_name,
                                              axis_index_groups=None, tiled=tiled)


ppermute_p.def_effectful_abstract_eval(_ppermute_abstract_eval)
all_to_all_p.def_effectful_abstract_eval(_all_to_all_abstract_eval)
ppermute_p.def_impl(partial(internals.apply_primitive, ppermute_p))
all_to_all_p.def_impl(partial(internals.apply_primitive, all_to_all_p))


# --- Differentiation: the inverse permutation; split and concat swapped --------------

def _ppermute_transpose(ct, x, *, axis_name, perm, algorithm):
  del x
  if type(ct) is ad.Zero:
    return (None,)
  inverse = tuple((d, s) for s, d in perm)
  return (ppermute_p.bind(ct, axis_name=axis_name, perm=inverse, algorithm=algorithm),)


def _all_to_all_transpose(ct, x, *, split_axis, concat_axis, axis_name, tiled, algorithm):
  del x
  if type(ct) is ad.Zero:
    return (None,)
  return (all_to_all_p.bind(ct, split_axis=concat_axis, concat_axis=split_axis,
                            axis_name=axis_name, tiled=tiled, algorithm=algorithm),)


ad.deflinear2(ppermute_p, _ppermute_transpose)
ad.deflinear2(all_to_all_p, _all_to_all_transpose)


# --- Batching (JAX's rules) ---------------------------------------------------------

def _ppermute_batch(axis_data, vals_in, dims_in, *, axis_name, perm, algorithm):
  (v,), (d,) = vals_in, dims_in
  if axis_data.name not in axis_name:
    return ppermute_p.bind(v, axis_name=axis_name, perm=perm, algorithm=algorithm), d
  rest = tuple(a for a in axis_name if a != axis_data.name)
  if rest:  # (JAX's rule: the same pairs over the axes left)
    return ppermute_p.bind(v, axis_name=rest, perm=perm, algorithm=algorithm), d
  if d is None:
    return v, d
  # over the vmapped axis itself: batch element j takes the source's
  take = np.zeros(axis_data.size, dtype=int)
  for src, dst in perm:
    take[dst] = src
  return v.take(take, d), d


def _all_to_all_batch(axis_data, vals_in, dims_in, *, split_axis, concat_axis, axis_name,
                      tiled, algorithm):
  (x,), (d,) = vals_in, dims_in
  if axis_data.name in axis_name:
    # over the vmapped axis itself: JAX's rule (local moves, and JAX's
    # all_to_all over any other axes named)
    return batching.fancy_primitive_batchers[internals.all_to_all_p](
        axis_data, vals_in, dims_in, axis_name=axis_name, split_axis=split_axis,
        concat_axis=concat_axis, axis_index_groups=None, tiled=tiled)
  params = dict(axis_name=axis_name, tiled=tiled, algorithm=algorithm)
  if d is None:
    return all_to_all_p.bind(x, split_axis=split_axis, concat_axis=concat_axis, **params), None
  return all_to_all_p.bind(x, split_axis=split_axis + (d <= split_axis),
                           concat_axis=concat_axis + (d <= concat_axis), **params), d


batching.fancy_primitive_batchers[ppermute_p] = _ppermute_batch
batching.fancy_primitive_batchers[all_to_all_p] = _all_to_all_batch


# --- Lowering: jaxll's kernel or XLA's collective, recorded for explain --------------

def all_to_all_segments(shape, split_axis: int, concat_axis: int,
                        group_size: int) -> tuple[int, int]:
  """(input segment, output segment): elements of one contiguous run of a
  piece in the input (pieces split along `split_axis` of `shape`) and in the
  output (concatenated along `concat_axis`); a piece is count / segment such
  runs, group_size runs apart (ffi/kernels/exchange.h)."""
  out = list(shape)
  out[split_axis] //= group_size
  out[concat_axis] *= group_size
  inner_in = int(np.prod(shape[split_axis:], dtype=np.int64))
  inner_out = int(np.prod(out[concat_axis:], dtype=np.int64))
  return inner_in // group_size, inner_out // group_size


def normalized_perm(perm, group_size: int) -> tuple:
  """`perm` with indices taken modulo the group size, as JAX's lowering takes
  them; ValueError (JAX's) for a repeated source or destination."""
  pairs = tuple((s % group_size, d % group_size) for s, d in perm)
  srcs, dsts = [s for s, _ in pairs], [d for _, d in pairs]
  if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts):
    raise ValueError(f"ppermute sources and destinations must be unique, got {perm}.")
  return pairs


def _decide(ctx, op: str, axes: tuple, algorithm: str):
  """(workspace id, kernel algorithm, reason): the kernel's workspace, or 0 for
  XLA's collective. (A kernel moves pieces of any layout: their runs need not
  be whole transfer units.)"""
  if algorithm == "xla":
    return 0, "xla", sites.with_origin("algorithm='xla' requested", ctx, op, axes)
  if algorithm not in ("auto", algorithms.DETERMINISTIC):
    reason = placement.disabled_reason(ctx, algorithm, op)
    if reason:
      return 0, "xla", sites.with_origin(reason, ctx, op, axes)
  aval = ctx.avals_in[0]
  itemsize = np.dtype(aval.dtype).itemsize
  problem = ""
  dtypes = SENTINEL_DTYPES if algorithm == "oneshot_sentinel" else KERNEL_DTYPES
  if np.dtype(aval.dtype).name not in dtypes:
    problem = f"no {op} kernel for {np.dtype(aval.dtype)}"
  elif aval.size == 0:
    problem = "empty array"
  if algorithm in ("auto", algorithms.DETERMINISTIC):
    mode = ("deterministic: a collective that moves bits is alike on every path; "
            if algorithm == algorithms.DETERMINISTIC else "")
    n, unserved = placement.unserved(ctx, axes)

    def xla(why: str):
      return 0, "xla", sites.with_origin(mode + why, ctx, op, axes)

    if problem or unserved:
      return xla(problem or unserved)
    kernel, reason = choice.exchange_auto(op, n, int(aval.size) * itemsize, aval.dtype)
    if kernel == "xla":
      return xla(reason)
    ws, _, problem = placement.workspace_for(ctx, axes)
    return xla(problem) if problem else (
        ws, kernel, sites.with_origin(mode + reason, ctx, op, axes))
  return named_kernel(ctx, op, axes, algorithm, problem)


def _ppermute_lowering(ctx, x, *, axis_name, perm, algorithm):
  size = mesh_axes_size(ctx, axis_name)
  pairs = normalized_perm(perm, size)
  ws, kernel, reason = _decide(ctx, "ppermute", axis_name, algorithm)
  if ws:
    dests = senders = 0
    for s, d in pairs:
      dests |= d << (4 * s)
      senders |= 1 << s
    out = ordering.emit_ordered_call(
        ctx, "jaxll_ppermute", [x], workspace=ws,
        algorithm=np.int64(algorithms.SPECS[kernel].code),
        dests=np.array(dests, dtype=np.uint64).view(np.int64)[()], senders=np.int64(senders),
        uses_pdl=True)
  else:
    out = internals.xla_lowering(internals.ppermute_p, placement.platforms(ctx))(
        ctx, x, axis_name=axis_name, perm=perm)
  return record_site(ctx, out, "ppermute", axis_name, size, algorithm, ws, kernel, reason, -1)


def _all_to_all_lowering(ctx, x, *, split_axis, concat_axis, axis_name, tiled, algorithm):
  aval = ctx.avals_in[0]
  size = mesh_axes_size(ctx, axis_name)
  ws, kernel, reason = _decide(ctx, "all_to_all", axis_name, algorithm)
  if ws:
    segments = all_to_all_segments(aval.shape, split_axis, concat_axis, size)
    out = ordering.emit_ordered_call(
        ctx, "jaxll_all_to_all", [x], workspace=ws,
        algorithm=np.int64(algorithms.SPECS[kernel].code), in_segment=np.int64(segments[0]),
        out_segment=np.int64(segments[1]), uses_pdl=True)
  else:
    out = internals.xla_lowering(internals.all_to_all_p, placement.platforms(ctx))(
        ctx, x, split_axis=split_axis, concat_axis=concat_axis, axis_name=axis_name,
        axis_index_groups=None, tiled=tiled)
  return record_site(ctx, out, "all_to_all", axis_name, size, algorithm, ws, kernel, reason,
                     split_axis)


internals.register_lowering(ppermute_p, _ppermute_lowering)
internals.register_lowering(all_to_all_p, _all_to_all_lowering)
