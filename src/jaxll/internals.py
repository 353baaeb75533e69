"""Every private JAX name jaxll uses, in one place.

jaxll's collectives must type, differentiate, batch and lower exactly as JAX's
own, and some of what that takes has no public name: the primitives of
explicit-sharding collectives (``unreduced_psum``, ``all_gather_reduced``,
...), the pvary that jax.lax's collectives insert, the ``check_vma`` state,
the XLA lowering rule of a JAX primitive, and the devices a jit program is
lowered for. The rest of jaxll uses public modules (``jax.extend.core``,
``jax.interpreters.{ad,batching,mlir}``, ``jax.core``) and reaches private
ones only through this module. ``tests/test_internals_cpu.py`` checks every
name here on the installed jax; CI runs it on jax 0.10.2 and 0.12.0.1, the GPU
machines on 0.11.2.
"""

from __future__ import annotations

import sys

import numpy as np
from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import distributed as _distributed
from jax._src import mesh as _mesh
from jax._src import sharding_impls as _sharding_impls
from jax._src.interpreters import mlir as _mlir
from jax._src.lax import parallel as _parallel
from jax._src.lib.mlir import ir  # noqa: F401  (MLIR bindings, as JAX's lowering uses them)

# --- Primitives of JAX's collectives (typing and XLA's lowering are borrowed) -----------
psum_p = _parallel.psum_p
psum_invariant_p = _parallel.psum_invariant_p
pmax_p = _parallel.pmax_p
pmin_p = _parallel.pmin_p
all_gather_p = _parallel.all_gather_p
all_gather_invariant_p = _parallel.all_gather_invariant_p
all_gather_reduced_p = _parallel.all_gather_reduced_p
reduce_scatter_p = _parallel.reduce_scatter_p
unreduced_reduce_scatter_p = _parallel.unreduced_reduce_scatter_p
# unreduced inputs to an all-reduce: sums on every jax; max and min from jax 0.12
UNREDUCED_ALL_REDUCE = {op: p for op, p in (
    ("sum", _parallel.unreduced_psum_p),
    ("max", getattr(_parallel, "unreduced_pmax_p", None)),
    ("min", getattr(_parallel, "unreduced_pmin_p", None))) if p is not None}

apply_primitive = _dispatch.apply_primitive
custom_call = _mlir.custom_call
pvary = _core.pvary            # invariant -> varying over the given axes
preduced = _parallel.preduced  # invariant -> reduced (unreduced_psum's transpose)


def check_vma() -> bool:
  """Whether the enclosing shard_map types values by how they vary (check_vma)."""
  return bool(_config._check_vma.value)


def checking_vma(value: bool):
  """A context in which check_vma is `value` (for typing rules that read it)."""
  return _config._check_vma(value)


def auto_pcast() -> bool:
  return bool(_config.auto_pcast.value)


def axis_exists(name) -> bool:
  """Whether a named axis is bound here (shard_map, vmap or pmap)."""
  return _core.get_axis_env().axis_exists(name)


def insert_collective_pvary(axes: tuple, x):
  """``x`` made varying over ``axes``, as jax.lax's collectives do before they bind."""
  return _parallel.insert_collective_pvary(axes, x)


def skip_one_sized_axes(axes: tuple) -> tuple:
  """``axes`` without those JAX leaves out of collectives (size-one mesh axes,
  under ``jax_remove_size_one_mesh_axis_from_type``)."""
  skip = getattr(_parallel, "_maybe_skip_one_sized_axes", None)
  return tuple(skip(axes)) if skip is not None else axes


def input_state(x, axes: tuple, who: str) -> str:
  """How ``x`` stands over ``axes``: 'varying', 'unreduced', 'reduced' or
  'invarying', with JAX's error where they disagree (``who``: the function named)."""
  return _parallel._get_from(_core.typeof(x), axes, who)


def xla_lowering(prim, platforms):
  """JAX's XLA lowering rule of the primitive `prim` for `platforms`."""
  for p in platforms:
    entry = _mlir._platform_specific_lowerings[p].get(prim)
    if entry is not None:
      return entry.rule
  return _mlir._lowerings[prim].rule


def distributed_client():
  """jax.distributed's key-value client, or None before jax.distributed.initialize()."""
  return _distributed.global_state.client


def distributed_state():
  return _distributed.global_state


# --- The concrete mesh a collective is lowered for ------------------------------------

def register_device_lowering(prim, rule, platform: str | None = None) -> None:
  """Registers `rule` as `prim`'s lowering, emitted inline at every call
  (never cached into a shared function), in a program lowered for its devices.

  A jaxll call's lowering depends on the devices the program runs on (it
  builds their workspace and names it in the custom call). JAX lowers a jit
  program without its devices, and caches that lowering across devices,
  unless a primitive in it is registered as needing them (as cuDNN's fused
  attention is). With one, the devices are in the program's lowering context
  (lowering_mesh finds them for an abstract mesh) and in the cache's key, and
  a program whose only mesh is abstract cannot be lowered without devices
  (``jax.export``): JAX raises for it.
  """
  _dispatch.prim_requires_devices_during_lowering.add(prim)
  _mlir.register_lowering(prim, rule, platform=platform, cacheable=False)


def lowering_mesh(ctx):
  """The mesh (concrete ``jax.sharding.Mesh``) of the shard_map whose body
  ``ctx`` lowers, or None where none can be known.

  A shard_map over an abstract mesh (``mesh=mesh.abstract_mesh``, or a mesh
  from ``jax.sharding.use_abstract_mesh``) lowers its body with that abstract
  mesh, unless a concrete mesh is set (``jax.set_mesh``). Its devices are then
  the program's: mesh position i runs on the program's i-th device, as XLA
  numbers partitions. That device assignment is in the lowering context of the
  whole program, which the shard_map's body context replaces; it is found on
  the lowering's call stack.
  """
  mesh = getattr(ctx.module_context.axis_context, "mesh", None)
  if mesh is None or isinstance(mesh, _mesh.Mesh):
    return mesh
  concrete = _mesh.get_concrete_mesh()
  if (concrete is not None and not concrete.empty
      and concrete.shape_tuple == mesh.shape_tuple):
    return concrete
  devices = _program_devices()
  if devices is None or len(devices) != mesh.size:
    return None
  return _mesh.Mesh(np.array(devices, dtype=object).reshape(mesh.axis_sizes),
                    mesh.axis_names, axis_types=mesh.axis_types)


def _program_devices():
  """The device assignment of the program being lowered (its ShardingContext)."""
  frame = sys._getframe(2)
  while frame is not None:
    for value in frame.f_locals.values():
      if isinstance(value, _mlir.ModuleContext):
        value = value.axis_context
      if (isinstance(value, _sharding_impls.ShardingContext)
          and value.device_assignment is not None):
        return value.device_assignment
    frame = frame.f_back
  return None
