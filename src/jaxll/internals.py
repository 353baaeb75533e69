"""Every private JAX name jaxll uses, in one place.

jaxll's collectives must type, differentiate, batch and lower exactly as JAX's
own, and some of what that takes has no public name: the primitives of
explicit-sharding collectives (``unreduced_psum``, ``all_gather_reduced``,
...), the pvary that jax.lax's collectives insert, the ``check_vma`` state,
the XLA lowering rule of a JAX primitive, the mesh set by ``jax.set_mesh``,
and JAX's registry of primitives whose lowering needs the program's devices. The rest of jaxll uses public modules (``jax.extend.core``,
``jax.interpreters.{ad,batching,mlir}``, ``jax.core``) and reaches private
ones only through this module. ``tests/test_internals_cpu.py`` checks every
name here on the installed jax; CI runs it on jax 0.10.2 and 0.12.0.1, the GPU
machines on 0.11.2.
"""

from __future__ import annotations

import re

from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import distributed as _distributed
from jax._src import mesh as _mesh
from jax._src.interpreters import ad as _ad_internal
from jax._src.interpreters import mlir as _mlir
from jax._src.lax import parallel as _parallel
from jax._src.lib.mlir import ir  # noqa: F401  (MLIR bindings, as JAX's lowering uses them)
from jax._src.lib.mlir.dialects import hlo as _hlo
import jax
from jax.extend.core import Primitive
from jax.interpreters import ad as _ad
from jax.interpreters import batching as _batching

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
ppermute_p = _parallel.ppermute_p
all_to_all_p = _parallel.all_to_all_p
ragged_all_to_all_p = _parallel.ragged_all_to_all_p
# unreduced inputs to an all-reduce: sums on every jax; max and min from jax 0.11
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


def bound_axis_names() -> tuple:
  """The named axes bound here (shard_map, vmap or pmap), innermost last."""
  return tuple(_core.get_axis_env().axis_names())


def in_eager_shard_map() -> bool:
  """Whether the code running now is a shard_map body run eagerly (outside
  jit): JAX evaluates it op by op on each device's values."""
  trace = getattr(getattr(_core, "trace_ctx", None), "trace", None)
  return type(trace).__name__ == "ShardMapTrace"


def insert_collective_pvary(axes: tuple, x):
  """``x`` made varying over ``axes``, as jax.lax's collectives do before they bind."""
  return _parallel.insert_collective_pvary(axes, x)


# Whether JAX types a ragged all-to-all by how its operands vary (jax 0.12:
# the operand must vary over the axes, all six alike; earlier jax: as given)
_ragged_eval = getattr(_parallel, "_ragged_all_to_all_effectful_abstract_eval", None)
_RAGGED_VMA = _ragged_eval is not None and "collective_vma_rule" in _ragged_eval.__code__.co_names


def ragged_operands(axes: tuple, operand, *rest) -> tuple:
  """A ragged all-to-all's operands made to vary as jax.lax.ragged_all_to_all
  makes them before it binds."""
  if not _RAGGED_VMA:
    return (operand, *rest)
  operand = _parallel.insert_collective_pvary(axes, operand)
  return tuple(_core.auto_insert_reshard(operand, *rest))


def zero_tangent(primal):
  """The symbolic zero tangent of `primal` (JAX's ``ad.p2tz``)."""
  return _ad_internal.p2tz(primal)


def zeros_like_aval(aval):
  """Zeros of the abstract value `aval`, its typing (how it varies) kept."""
  return _ad_internal.zeros_like_aval(aval)


def skip_one_sized_axes(axes: tuple) -> tuple:
  """``axes`` without those JAX leaves out of collectives (size-one mesh axes,
  under ``jax_remove_size_one_mesh_axis_from_type``)."""
  skip = getattr(_parallel, "_maybe_skip_one_sized_axes", None)
  return tuple(skip(axes)) if skip is not None else axes


def input_state(x, axes: tuple, who: str) -> str:
  """How ``x`` stands over ``axes``: 'varying', 'unreduced', 'reduced' or
  'invarying', with JAX's error where they disagree (``who``: the function named)."""
  return _parallel._get_from(_core.typeof(x), axes, who)


def unreduced_over(x, axes: tuple, who: str) -> bool:
  """Whether ``x`` is typed unreduced over ``axes`` (explicit sharding), with
  JAX's error where it is over some of them only. (Varying over some axes and
  invariant over others is not an error here: jaxll makes such an input vary
  over all of them, as it always has; jax.lax's collectives refuse it.)"""
  if not set(axes) & set(_core.typeof(x).mat.unreduced):
    return False
  return input_state(x, axes, who) == "unreduced"


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


# --- The devices a collective is lowered for ------------------------------------------
# A kernel call names the workspace of its devices, so its lowering holds for
# those devices only. JAX lowers a jit program without its devices and caches
# that lowering for any devices of the same mesh shape, unless a primitive in
# it is registered as needing them (as cuDNN's fused attention is). A shard_map
# over a concrete mesh has its devices in the program itself (the mesh is a
# parameter of the shard_map), so a lowering is never reused for other ones.
# Under jax.set_mesh a shard_map names only the abstract mesh, and the devices
# come from the context: there every jaxll call passes its operand through
# ``jaxll_devices``, an identity registered as needing the devices, so that JAX
# lowers such a program for its devices and caches it per device set. (It is
# not done everywhere: JAX then also requires one mesh across the program, and
# refuses to lower without devices, as jax.export does.)

class HighAwarePrimitive(Primitive):
  """A primitive that takes jax 0.12.1's "high" values: from that version a
  value typed unreduced is one, which JAX takes apart into a "low" value
  (varying over the unreduced axes, with their sizes as leading dimensions
  where the global sharding names them) before lowering; every primitive that
  takes one says so (``is_high``) and binds itself on the low value
  (``to_lojax``). ``lo_params(in_avals, params)`` gives that call's parameters
  (set where they change)."""

  lo_params = staticmethod(lambda in_avals, params: params)

  def is_high(self, *avals, **params) -> bool:
    return any(getattr(a, "is_high", False) for a in avals)

  def to_lojax(self, *args, **params):
    in_avals = [_core.typeof(a) for a in args]
    out, _ = self.abstract_eval(*in_avals, **params)
    lo_args = [lo for aval, a in zip(in_avals, args) for lo in aval.lower_val(a)]
    lo_out = self.bind(*lo_args, **self.lo_params(in_avals, params))
    if self.multiple_results:
      return [o.raise_val(v) for o, v in zip(out, lo_out)]
    return out.raise_val(lo_out)


devices_p = HighAwarePrimitive("jaxll_devices")
devices_p.def_abstract_eval(lambda aval: aval)
devices_p.def_impl(lambda x: x)
_dispatch.prim_requires_devices_during_lowering.add(devices_p)
_mlir.register_lowering(devices_p, lambda ctx, x: [x])


def _devices_transpose(ct, x):
  del x
  return (ct,)


def _devices_batch(vals, dims):
  return devices_p.bind(vals[0]), dims[0]


_ad.deflinear2(devices_p, _devices_transpose)
_batching.primitive_batchers[devices_p] = _devices_batch


def _mesh_in_context() -> bool:
  concrete = _mesh.get_concrete_mesh()
  return concrete is not None and not concrete.empty


class CollectivePrimitive(HighAwarePrimitive):
  """A jaxll collective's primitive: under jax.set_mesh its first operand goes
  through ``jaxll_devices`` first (see above); it takes high values."""

  def bind(self, *args, **params):
    if args and _mesh_in_context():
      args = (devices_p.bind(args[0]),) + args[1:]
    return super().bind(*args, **params)


def leading_unreduced_dims(aval) -> int:
  """How many leading dimensions a high value's low value adds (see above)."""
  spec = getattr(getattr(aval, "sharding", None), "spec", None)
  return len(getattr(spec, "unreduced", ()) or ())


# jax.lax.all_gather(to="invarying") makes an invariant operand vary first up to
# jax 0.12.0; from 0.12.1 it refuses one
GATHER_INVARIANT_CASTS = tuple(
    int(re.match(r"\d*", v).group() or 0) for v in jax.__version__.split(".")[:3]) < (0, 12, 1)


def produced_by_an_op(value):
  """`value`, or where no op of the program being lowered produces it (a
  block argument: a lowering that returned its operand) a no-op reshape of it,
  so that it has an op to carry attributes (a call site's record)."""
  if isinstance(getattr(value, "owner", None), ir.Block):
    return _hlo.ReshapeOp(value.type, value).result
  return value


def register_lowering(prim, rule, platform: str | None = None) -> None:
  """Registers `rule` as `prim`'s lowering, emitted inline at every call
  (never cached into a shared function: ordering.py chains the calls)."""
  _mlir.register_lowering(prim, rule, platform=platform, cacheable=False)


def lowering_mesh(ctx):
  """The concrete mesh (``jax.sharding.Mesh``) of the shard_map whose body
  ``ctx`` lowers, or None where the lowering does not know its devices: the
  shard_map's own mesh, or for one over an abstract mesh the mesh set by
  jax.set_mesh (as JAX finds it)."""
  mesh = getattr(ctx.module_context.axis_context, "mesh", None)
  if mesh is None or isinstance(mesh, _mesh.Mesh):
    return mesh
  if _mesh_in_context():
    concrete = _mesh.get_concrete_mesh()
    if concrete.shape_tuple == mesh.shape_tuple:
      return concrete
  return None
