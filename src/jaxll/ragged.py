"""``jaxll.ragged_all_to_all``: a drop-in for ``jax.lax.ragged_all_to_all``
inside ``jax.shard_map``.

A primitive of its own (``jaxll_ragged_all_to_all``) with the parameters of
JAX's, whose typing it borrows (result type, ``check_vma``, JAX's errors for
offsets and sizes that are not integer vectors). It is linear in the operand
and the output jointly, and differentiates as JAX's does: the tangents take
the same exchange, and the transpose sends the cotangent's received rows back
(a ragged all-to-all with the offsets exchanged by an all-to-all) and zeroes
them in the output's cotangent, through jaxll's primitives. ``vmap`` over
another axis folds the batch into the rows, as JAX's rule does.

Lowering: ``algorithm="oneshot_ll"`` runs jaxll's kernel
(``ffi/kernels/ragged.cu``): barrier-free LL16, the sizes and output offsets
of every slice sent in front of its rows, so a receiver learns what comes and
where it goes from the packets it waits on, with no round trip before the
data; the result is the output buffer, updated in place. It serves float32,
bfloat16, float16 and int32 rows of any shape, up to ``MAX_SLICES`` slices a
peer, where a workspace serves the axes, and raises AlgorithmUnavailableError
elsewhere. ``"auto"`` takes it where it serves and the operand is at most the
auto crossover, else XLA's ragged all-to-all (what ``jax.lax`` emits); on the
CPU, which XLA does not give one, jaxll lowers the call to an all-to-all of
each slice padded to the operand's rows followed by a scatter into the output
(``"composed"`` in ``jaxll.explain``), so programs that use it run and test
on CPUs. ``"xla"`` takes XLA's op (the composition on the CPU). A slice out
of its operand's or output's rows, or sizes that ranks disagree on (send_sizes
must be ``all_to_all(recv_sizes)``), is an error the kernel records, as a
timeout is (docs/faults.md); XLA's op leaves them undefined.
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.interpreters import ad, batching, mlir

from jaxll import algorithms, choice, internals, ordering, placement, sites
from jaxll.collective_common import (KERNEL_DTYPES, as_array, check_axes_bound, mesh_axes_size,
                                     normalize_axes, named_kernel, record_site)
from jaxll.exchange import all_to_all

ragged_all_to_all_p = internals.CollectivePrimitive("jaxll_ragged_all_to_all")

ALGORITHMS = ("auto", "xla", "oneshot_ll")
#: Most slices a rank sends each peer that the kernel takes (ffi/kernels/ragged.h).
MAX_SLICES = 32
_OFFSETS = ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")


def ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *,
                      axis_name, axis_index_groups=None, algorithm: str = "auto",
                      deterministic: bool | None = None):
  """Sends slices of rows of ``operand`` to the devices of the mesh axis (or
  axes) ``axis_name`` and writes the slices received into ``output``, as
  ``jax.lax.ragged_all_to_all`` does.

  Use it inside ``jax.shard_map`` where you would use
  ``jax.lax.ragged_all_to_all``: the same arguments, result, typing under
  ``check_vma``, ``jit``, ``grad`` and ``vmap``. With K entries in each of
  the four integer vectors (a multiple of the group's size N), entry
  i = d x K/N + k describes slice k for device d: rows ``[input_offsets[i],
  + send_sizes[i])`` of ``operand`` go to rows ``[output_offsets[i],
  + send_sizes[i])`` of device d's output, and device d expects
  ``recv_sizes`` rows in its entry for this device. The result is ``output``
  with those rows replaced.

  Args:
    operand: the rows to send, shape (rows, ...).
    output: the array the received rows are written into, shape (rows', ...)
      with the operand's trailing shape and dtype.
    input_offsets, send_sizes, output_offsets, recv_sizes: integer vectors of
      K entries (see above; sizes and offsets are converted to int32).
    axis_name: a mesh axis name, or a tuple of them (row-major).
    axis_index_groups: as JAX's (groups of the axis exchanging among
      themselves); XLA's op serves such calls.
    algorithm: ``"oneshot_ll"``: jaxll's kernel (float32, bfloat16, float16,
      int32; at most MAX_SLICES slices a peer; raises
      AlgorithmUnavailableError where it cannot serve); ``"auto"``: the
      kernel where it serves and ``operand`` is at most the auto crossover,
      else XLA's op (module docstring); ``"xla"``: XLA's op (on the CPU,
      jaxll's composition of an all-to-all and a scatter).
    deterministic: as for :func:`jaxll.all_gather`: the exchange moves bits,
      so the choice is auto's, and ``"xla"`` raises ValueError. ``None``:
      ``JAXLL_DETERMINISTIC``.
  """
  who = "jaxll.ragged_all_to_all"
  if algorithm not in ALGORITHMS:
    raise ValueError(f"{who}: algorithm must be one of {list(ALGORITHMS)}, got {algorithm!r}")
  algorithm = algorithms.deterministic_request(who, algorithm, deterministic)
  axes = normalize_axes(axis_name, who)
  if not axes:
    raise ValueError(f"{who}: axis_name names no mesh axis")
  check_axes_bound(axes, who)
  groups = None
  if axis_index_groups is not None:
    groups = tuple(tuple(int(i) for i in g) for g in axis_index_groups)
  operand = as_array("ragged_all_to_all", operand)
  output = as_array("ragged_all_to_all", output)
  if np.ndim(operand) < 1 or np.ndim(output) != np.ndim(operand) or (
      operand.shape[1:] != output.shape[1:]) or operand.dtype != output.dtype:
    raise ValueError(f"{who}: operand and output must be arrays of one dtype whose rows (every "
                     f"dimension but the first) have one shape, got {operand.dtype}"
                     f"{list(operand.shape)} and {output.dtype}{list(output.shape)}")
  vectors = []
  for name, v in zip(_OFFSETS, (input_offsets, send_sizes, output_offsets, recv_sizes)):
    v = jnp.asarray(v)
    if not jnp.issubdtype(v.dtype, jnp.integer) or v.ndim != 1 or v.shape[0] < 1:
      raise ValueError(f"{who}: {name} must be a non-empty integer vector, got "
                       f"{v.dtype}{list(v.shape)}")
    vectors.append(v.astype(jnp.int32))
  if len({v.shape[0] for v in vectors}) != 1:
    raise ValueError(f"{who}: input_offsets, send_sizes, output_offsets and recv_sizes must "
                     f"have one length, got {[v.shape[0] for v in vectors]}")
  size = int(lax.axis_size(axes)) if groups is None else len(groups[0])
  if vectors[0].shape[0] % size:
    raise ValueError(f"{who}: the offset and size vectors hold {vectors[0].shape[0]} entries, "
                     f"not a multiple of the group size {size} (one slice or more per device)")
  args = internals.ragged_operands(axes, operand, output, *vectors)
  return ragged_all_to_all_p.bind(*args, axis_name=axes, axis_index_groups=groups,
                                  algorithm=algorithm)


# --- Typing: JAX's own primitive ------------------------------------------------------

def _abstract_eval(*avals, axis_name, axis_index_groups, algorithm):
  del algorithm
  return internals.ragged_all_to_all_p.abstract_eval(*avals, axis_name=axis_name,
                                                     axis_index_groups=axis_index_groups)


ragged_all_to_all_p.def_effectful_abstract_eval(_abstract_eval)
ragged_all_to_all_p.def_impl(partial(internals.apply_primitive, ragged_all_to_all_p))


# --- Differentiation (JAX's rules, through jaxll's primitives) ------------------------

def _jvp(primals, tangents, **params):
  operand, output, *vectors = primals
  operand_dot, output_dot, *_ = tangents
  result = ragged_all_to_all_p.bind(operand, output, *vectors, **params)
  if type(operand_dot) is type(output_dot) is ad.Zero:
    return result, internals.zero_tangent(result)
  operand_dot = ad.instantiate_zeros(operand_dot)
  output_dot = ad.instantiate_zeros(output_dot)
  return result, ragged_all_to_all_p.bind(operand_dot, output_dot, *vectors, **params)


def _offsets_exchanged(v, axis_name, axis_index_groups, algorithm):
  if axis_index_groups is not None:
    return lax.all_to_all(v, axis_name, 0, 0, tiled=True,
                          axis_index_groups=[list(g) for g in axis_index_groups])
  return all_to_all(v, axis_name, 0, 0, tiled=True,
                    algorithm="auto" if algorithm != "xla" else "xla")


def _transpose(t, operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *,
               axis_name, axis_index_groups, algorithm):
  if type(t) is ad.Zero:
    operand_t = ad.Zero(operand.aval) if ad.is_undefined_primal(operand) else None
    output_t = ad.Zero(output.aval) if ad.is_undefined_primal(output) else None
    return [operand_t, output_t] + [None] * 4
  operand_t = output_t = None
  exchanged = partial(_offsets_exchanged, axis_name=axis_name,
                      axis_index_groups=axis_index_groups, algorithm=algorithm)
  output_offsets_ = exchanged(output_offsets)
  if ad.is_undefined_primal(operand):
    # the cotangent's received rows go back to where they came from
    operand_t = ragged_all_to_all_p.bind(
        t, internals.zeros_like_aval(operand.aval), output_offsets_, recv_sizes,
        exchanged(input_offsets), send_sizes, axis_name=axis_name,
        axis_index_groups=axis_index_groups, algorithm=algorithm)
  if ad.is_undefined_primal(output):
    # rows the exchange overwrote take no cotangent (counted, not set: an empty
    # update starts and ends on one row, which may start another)
    covered = jnp.cumsum(jnp.zeros(t.shape[0], jnp.int32).at[output_offsets_].add(1)
                         .at[output_offsets_ + recv_sizes].add(-1)) > 0
    covered = lax.broadcast_in_dim(covered, t.shape, (0,))
    output_t = jnp.where(covered, jnp.zeros_like(t), t)
  return [operand_t, output_t] + [None] * 4


ad.primitive_jvps[ragged_all_to_all_p] = _jvp
ad.primitive_transposes[ragged_all_to_all_p] = _transpose


# --- Batching (JAX's rule: the batch folded into the rows) ----------------------------

def _batch(axis_data, vals_in, dims_in, *, axis_name, axis_index_groups, algorithm):
  params = dict(axis_name=axis_name, axis_index_groups=axis_index_groups, algorithm=algorithm)
  if all(d is None for d in dims_in) and axis_data.name not in axis_name:
    return ragged_all_to_all_p.bind(*vals_in, **params), None
  if axis_data.name in axis_name:
    raise NotImplementedError("jaxll.ragged_all_to_all over a vmapped axis of its own (nor "
                              "does JAX batch ragged_all_to_all so)")
  size = axis_data.size

  def at_second(v, d):  # (K, size): slice i of batch element b
    if d is None:
      return batching.broadcast(v, size, 1, None)
    return v if d == 1 else v.T

  operand, output = (batching.bdim_at_front(v, d, size) for v, d in zip(vals_in[:2], dims_in[:2]))
  rows, out_rows = operand.shape[1], output.shape[1]
  io, ss, oo, rs = (at_second(v, d) for v, d in zip(vals_in[2:], dims_in[2:]))
  io = io + lax.iota(io.dtype, size)[None, :] * rows
  oo = oo + lax.iota(oo.dtype, size)[None, :] * out_rows
  # (batch element b of slice i becomes slice i * size + b: the same device)
  merged = [v.reshape(-1, *v.shape[2:]) for v in (operand, output, io, ss, oo, rs)]
  result = ragged_all_to_all_p.bind(*merged, **params)
  return result.reshape(size, -1, *result.shape[1:]), 0


batching.fancy_primitive_batchers[ragged_all_to_all_p] = _batch


# --- Lowering: jaxll's kernel, XLA's op, or the composition on the CPU ------------------

def _problem(ctx, axes, groups, size: int) -> str:
  """Why the kernel cannot serve the call, or ""."""
  operand, output, offsets = ctx.avals_in[0], ctx.avals_in[1], ctx.avals_in[2]
  if groups is not None:
    return "axis_index_groups: XLA's ragged all-to-all serves groups"
  if np.dtype(operand.dtype).name not in KERNEL_DTYPES:
    return f"no ragged_all_to_all kernel for {np.dtype(operand.dtype)}"
  if operand.size == 0 or output.size == 0:
    return "empty array"
  if offsets.shape[0] % size:
    return f"{offsets.shape[0]} slices, not a multiple of the group size {size}"
  if offsets.shape[0] // size > MAX_SLICES:
    return (f"{offsets.shape[0] // size} slices a peer, more than the kernel's {MAX_SLICES}")
  return ""


def _decide(ctx, axes: tuple, groups, algorithm: str, size: int) -> tuple[int, str, str]:
  """(workspace id, kernel, reason): the kernel's workspace, or 0 for XLA's op."""
  op = "ragged_all_to_all"
  if algorithm == "xla":
    return 0, "xla", sites.with_origin("algorithm='xla' requested", ctx, op, axes)
  if algorithm not in ("auto", algorithms.DETERMINISTIC):
    reason = placement.disabled_reason(ctx, algorithm, op)
    if reason:
      return 0, "xla", sites.with_origin(reason, ctx, op, axes)
  problem = _problem(ctx, axes, groups, size)
  if algorithm in ("auto", algorithms.DETERMINISTIC):
    mode = ("deterministic: a collective that moves bits is alike on every path; "
            if algorithm == algorithms.DETERMINISTIC else "")
    n, unserved = placement.unserved(ctx, axes)
    why = problem or unserved
    kernel, reason = "xla", why
    if not why:
      aval = ctx.avals_in[0]
      kernel, reason = choice.ragged_auto(n, int(aval.size) * np.dtype(aval.dtype).itemsize)
    if kernel != "xla":
      ws, _, why = placement.workspace_for(ctx, axes)
      if not why:
        return ws, kernel, sites.with_origin(mode + reason, ctx, op, axes)
      reason = why
    return 0, "xla", sites.with_origin(mode + reason, ctx, op, axes)
  return named_kernel(ctx, op, axes, algorithm, problem)


def composed(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *,
             axis_name, axis_index_groups=None):
  """``jax.lax.ragged_all_to_all``'s result from an all-to-all and a scatter,
  for backends with no ragged all-to-all of XLA's (the CPU): every slice is
  padded to the operand's rows, the padded slices exchanged, and the rows
  each device expects (its recv_sizes) scattered into its output at the
  offsets the senders name. Rows past the output, or slices out of the
  operand, are dropped, not wrapped."""
  groups = None if axis_index_groups is None else [list(g) for g in axis_index_groups]
  exchange = partial(lax.all_to_all, axis_name=axis_name, split_axis=0, concat_axis=0,
                     axis_index_groups=groups, tiled=True)
  k, rows, out_rows = input_offsets.shape[0], operand.shape[0], output.shape[0]
  r = jnp.arange(rows, dtype=jnp.int32)[None, :]
  src = input_offsets[:, None] + r                                   # (K, rows)
  sent = (r < send_sizes[:, None]) & (src >= 0) & (src < rows)
  slices = jnp.take(operand, jnp.clip(src, 0, rows - 1).reshape(-1), axis=0)
  trail = (1,) * (operand.ndim - 1)
  slices = jnp.where(sent.reshape(-1, *trail), slices, jnp.zeros_like(slices))
  received = exchange(slices.reshape(k, rows, *operand.shape[1:]))
  dst = exchange(output_offsets)[:, None] + r
  kept = (r < recv_sizes[:, None]) & (dst >= 0) & (dst < out_rows)
  dst = jnp.where(kept, dst, out_rows).reshape(-1)
  return output.at[dst].set(received.reshape(k * rows, *output.shape[1:]), mode="drop")


def _lowering(ctx, *args, axis_name, axis_index_groups, algorithm):
  size = mesh_axes_size(ctx, axis_name) if axis_index_groups is None else len(axis_index_groups[0])
  ws, kernel, reason = _decide(ctx, axis_name, axis_index_groups, algorithm, size)
  op = "ragged_all_to_all"
  if ws:
    int32 = [a.update(dtype=np.dtype(np.int32)) for a in ctx.avals_in[2:]]
    vectors = [v if a.dtype == np.int32 else mlir.convert_hlo(ctx, v, a, b)
               for v, a, b in zip(args[2:], ctx.avals_in[2:], int32)]
    call_ctx = ctx.replace(avals_in=[*ctx.avals_in[:2], *int32])
    out = ordering.emit_ordered_call(
        call_ctx, "jaxll_ragged_all_to_all", [*args[:2], *vectors], workspace=ws,
        algorithm=np.int64(algorithms.SPECS[kernel].code), uses_pdl=True,
        operand_output_aliases={1: 0})
  elif "cpu" in placement.platforms(ctx):
    kernel = "composed"
    reason = sites.with_origin(
        "XLA:CPU has no ragged all-to-all: an all_to_all of the padded slices and a scatter; "
        + reason, ctx, op, axis_name)

    def run(*vals):
      with internals.checking_vma(False):
        return composed(*vals, axis_name=axis_name, axis_index_groups=axis_index_groups)

    out = mlir.lower_fun(run, multiple_results=False)(ctx, *args)
  else:
    out = internals.xla_lowering(internals.ragged_all_to_all_p, placement.platforms(ctx))(
        ctx, *args, axis_name=axis_name, axis_index_groups=axis_index_groups)
  return record_site(ctx, out, op, axis_name, size, algorithm, ws, kernel, reason, 0,
                     path="composed" if kernel == "composed" else None)


internals.register_lowering(ragged_all_to_all_p, _lowering)
