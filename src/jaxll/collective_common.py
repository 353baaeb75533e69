"""What jaxll's collectives share: the checks of a call (axis names, the
algorithm asked for, the dtypes), the mapping over a pytree's leaves, the
sizes of mesh axes, and the record of a call site for ``jaxll.explain``.
Imported by the modules of the collectives (all_reduce.py, gather_scatter.py,
exchange.py, ragged.py, rmsnorm.py), which import nothing of each other's for
these."""

from __future__ import annotations

import jax
import numpy as np
from jax import lax

from jaxll import algorithms, call_sites, internals, placement, sites

# The algorithms of the collectives that move pieces (gathers, scatters, exchanges).
KERNEL_ALGORITHMS = ("oneshot_ll", "oneshot_sentinel", "oneshot_barrier")
ALGORITHMS = ("auto", "xla") + KERNEL_ALGORITHMS
# The dtypes the kernels take (kept here for installs without kernels; a unit
# test checks them against the native table, jaxll.native.ext.has_gather_scatter_kernel).
KERNEL_DTYPES = frozenset(["float32", "bfloat16", "float16", "int32"])
# The sentinel protocol's pattern (all ones) is a NaN of each floating type and a
# valid int32.
SENTINEL_DTYPES = frozenset(["float32", "bfloat16", "float16"])


def requested(name: str, algorithm: str, deterministic: bool | None) -> str:
  """The algorithm a call of jaxll.`name` requests (checked; in deterministic
  mode, see algorithms.deterministic_request)."""
  if algorithm not in ALGORITHMS:
    raise ValueError(f"jaxll.{name}: algorithm must be one of {list(ALGORITHMS)}, "
                     f"got {algorithm!r}")
  return algorithms.deterministic_request(f"jaxll.{name}", algorithm, deterministic)


def map_leaves(name: str, x, axis_name, bind_leaf, skip_one_sized=False):
  """Checks the call and applies ``bind_leaf(v, axes, size, constant=...)`` to
  every leaf of ``x``: traced leaves (``constant=False``; bind_leaf inserts the
  pvary jax.lax's collective would), constants (``constant=True``: jax.lax
  computes those without communication). An empty axis tuple (after dropping
  the axes JAX drops, with ``skip_one_sized``) returns ``x``."""
  axes = normalize_axes(axis_name, f"jaxll.{name}")
  if skip_one_sized:
    axes = internals.skip_one_sized_axes(axes)
  if not axes:
    return x
  check_axes_bound(axes, f"jaxll.{name}")
  size = axis_size(axes)

  def leaf(v):
    if not isinstance(v, jax.core.Tracer):  # (checked as given: jax.lax sees the same)
      as_array(name, v)
      return bind_leaf(v, axes, size, constant=True)
    return bind_leaf(as_array(name, v), axes, size, constant=False)

  return jax.tree_util.tree_map(leaf, x)


def axis_size(axes: tuple) -> int:
  """Devices of the bound axes `axes` (while tracing)."""
  return int(lax.axis_size(axes))


def as_array(name: str, x):
  """`x` as an array of a dtype jaxll's collectives take (TypeError: an
  extended dtype), for jaxll.`name`."""
  if not hasattr(x, "dtype"):
    x = jax.numpy.asarray(x)
  if dtypes_extended(x.dtype):
    raise TypeError(f"jaxll.{name}: unsupported dtype {x.dtype}")
  return x


def normalize_axes(axis_name, who: str = "jaxll.all_reduce") -> tuple:
  """``axis_name`` as a tuple of axis names (``who``: the function the errors name)."""
  axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
  for a in axes:
    if isinstance(a, int):
      raise TypeError(
          f"{who} reduces over named mesh axes; got the positional "
          f"axis {a!r} (use jnp.sum for array axes)")
  if len(set(axes)) != len(axes):
    raise ValueError(f"{who}: axis names repeat in {axes}")
  return axes


def check_axes_bound(axes: tuple, who: str = "jaxll.all_reduce") -> None:
  """NameError, naming the axes bound here, unless every axis of `axes` is."""
  missing = [a for a in axes if not internals.axis_exists(a)]
  if missing:
    bound = internals.bound_axis_names()
    here = (f"the axes bound here are {', '.join(repr(a) for a in bound)}" if bound else
            "no named axis is bound here")
    raise NameError(
        f"{who}: unknown axis name {missing[0]!r} ({here}). Call it inside "
        f"jax.shard_map (or jax.vmap/pmap with axis_name=...) over a mesh that "
        f"has that axis.")


def collective_pvary(axes: tuple, x, who: str = "jaxll.all_reduce"):
  """``x`` made varying over ``axes`` under ``check_vma``, as jax.lax's
  collectives do before they bind (a no-op without ``check_vma``)."""
  try:
    return internals.insert_collective_pvary(axes, x)
  except AssertionError:
    raise NotImplementedError(
        f"{who} over {axes}: an axis is not one of the enclosing "
        f"shard_map's mesh axes (a jax.vmap axis_name?). With check_vma=True, "
        f"reductions over vmap axes inside shard_map are not supported (jax.lax.psum "
        f"fails there too, with a bare AssertionError); reduce the vmapped axis "
        f"with jnp.sum, or use shard_map(..., check_vma=False).") from None


def dtypes_extended(dtype) -> bool:
  """Whether `dtype` is one of JAX's extended dtypes (keys, ...)."""
  return jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


def mesh_axes_size(ctx, axes: tuple) -> int:
  """Devices of the mesh axes `axes` of the program `ctx` lowers (JAX's
  primitives carry no group size)."""
  shape = dict(ctx.module_context.axis_context.mesh.shape)
  return int(np.prod([shape[a] for a in axes], dtype=np.int64))


def record_site(ctx, out, op: str, axes: tuple, size: int, requested: str, ws: int,
                kernel: str, reason: str, dimension: int, path: str | None = None):
  """Records the call site `ctx` lowers (op, path and reason) for jaxll.explain,
  tagged onto its result `out`, and returns `out`. The path is `kernel` where
  `ws` names a workspace, else `path` or "xla"."""
  aval = ctx.avals_in[0]
  site = call_sites.CallSite(
      site=sites.site_of(ctx), axes=",".join(map(str, axes)), group_size=size,
      shape=str(tuple(aval.shape)), dtype=str(np.dtype(aval.dtype)),
      nbytes=int(aval.size) * np.dtype(aval.dtype).itemsize, op=op, requested=requested,
      algorithm=kernel if ws else (path or "xla"), reason=reason, workspace=ws,
      dimension=dimension)
  # (a group of one: XLA's lowering may return the operand, which no op produces)
  out = [internals.produced_by_an_op(v) for v in out]
  call_sites.tag(out, site)  # (jaxll.explain reads it back from the lowered text)
  call_sites.record(site)
  return out


def named_kernel(ctx, op: str, axes: tuple, algorithm: str, problem: str):
  """(workspace id, algorithm, reason) of a call that names kernel `algorithm`,
  where `problem` ("" if none) is why the kernel cannot take the call: its
  workspace, or AlgorithmUnavailableError naming the call site and why."""
  if not problem:
    ws, _, problem = placement.workspace_for(ctx, axes)
  if problem:
    raise placement.AlgorithmUnavailableError(
        f"jaxll.{op}(algorithm={algorithm!r}) cannot serve the call at "
        f"{sites.call_text(ctx, op, axes)}: {problem}")
  return ws, algorithm, sites.with_origin(f"algorithm={algorithm!r} requested", ctx, op, axes)
