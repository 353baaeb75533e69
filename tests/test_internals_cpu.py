"""Every private JAX name jaxll uses (jaxll/internals.py) exists in the installed
jax and does what jaxll relies on. CI runs this file on jax 0.10.2 and
0.12.0.1; the GPU machines on 0.11.2."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll
from jaxll import internals


def _mesh(devices, explicit=False):
  kw = {"axis_types": (AxisType.Explicit,) * 2} if explicit else {}
  return jax.make_mesh((2, 4), ("a", "x"), devices=devices, **kw)


def test_primitives_are_jax_collectives():
  names = {p.name for p in (internals.psum_p, internals.psum_invariant_p, internals.pmax_p,
                            internals.pmin_p, internals.all_gather_p,
                            internals.all_gather_invariant_p, internals.all_gather_reduced_p,
                            internals.reduce_scatter_p, internals.unreduced_reduce_scatter_p)}
  assert names == {"psum", "psum_invariant", "pmax", "pmin", "all_gather",
                   "all_gather_invariant", "all_gather_reduced", "reduce_scatter",
                   "unreduced_reduce_scatter"}
  assert internals.UNREDUCED_ALL_REDUCE["sum"].name == "unreduced_psum"
  # unreduced max and min: not in jax 0.10, in 0.11.2 and 0.12
  major_minor = tuple(int(v) for v in jax.__version__.split(".")[:2])
  if major_minor <= (0, 10):
    assert "max" not in internals.UNREDUCED_ALL_REDUCE
  if major_minor >= (0, 12):
    assert {"max", "min"} <= set(internals.UNREDUCED_ALL_REDUCE)
  for p in internals.UNREDUCED_ALL_REDUCE.values():
    assert isinstance(p, Primitive)


def test_types_inside_shard_map(cpu_devices):
  # check_vma, axis_exists, input_state, pvary, preduced, insert_collective_pvary,
  # skip_one_sized_axes: what jaxll's wrappers read and do before they bind
  m = _mesh(cpu_devices, explicit=True)
  seen = {}

  def body(v):
    seen["check_vma"] = internals.check_vma()
    seen["bound"] = (internals.axis_exists("x"), internals.axis_exists("nope"))
    inv = jnp.ones(3)
    seen["states"] = [internals.input_state(y, ("x",), "t") for y in (
        v, inv, jax.lax.pcast(v, "x", to="unreduced"), internals.preduced(inv, ("x",)))]
    seen["pvary"] = jax.typeof(internals.pvary(inv, ("x",))).mat.varying
    seen["collective_pvary"] = jax.typeof(internals.insert_collective_pvary(("a",), v)).mat.varying
    seen["skip"] = internals.skip_one_sized_axes(("a", "x"))
    with pytest.raises(ValueError, match="can only accept"):
      internals.input_state(v, ("a", "x"), "t")  # (invariant over a, varying over x)
    seen["unreduced_over"] = (internals.unreduced_over(v, ("a", "x"), "t"),
                              internals.unreduced_over(jax.lax.pcast(v, "x", to="unreduced"),
                                                       ("x",), "t"))
    with pytest.raises(ValueError, match="can only accept"):
      internals.unreduced_over(jax.lax.pcast(v, "x", to="unreduced"), ("a", "x"), "t")
    with internals.checking_vma(False):
      seen["off"] = internals.check_vma()
    return v

  x = jax.device_put(np.ones((8, 3), np.float32), NamedSharding(m, P("x")))
  jax.jit(jax.shard_map(body, mesh=m, in_specs=P("x"), out_specs=P("x"))).trace(x)
  assert seen["check_vma"] is True and seen["off"] is False
  assert seen["bound"] == (True, False)
  assert seen["states"] == ["varying", "invarying", "unreduced", "reduced"]
  assert seen["pvary"] == {"x"}
  assert seen["collective_pvary"] == {"a", "x"}
  assert seen["skip"] == ("a", "x")
  assert seen["unreduced_over"] == (False, True)
  assert internals.auto_pcast() in (True, False)


def test_xla_lowering_and_custom_call_exist():
  for p in (internals.psum_p, internals.pmax_p, internals.pmin_p, internals.all_gather_p,
            internals.reduce_scatter_p):
    assert callable(internals.xla_lowering(p, ("cpu",)))
    assert callable(internals.xla_lowering(p, ("cuda",)))
  assert callable(internals.custom_call) and callable(internals.apply_primitive)
  assert internals.ir.StringAttr is not None


def test_devices_marker_only_under_set_mesh(cpu_devices):
  # Under jax.set_mesh each jaxll call's operand goes through jaxll_devices, a
  # primitive JAX lowers with the program's devices; elsewhere there is none.
  from jax._src import dispatch
  assert internals.devices_p in dispatch.prim_requires_devices_during_lowering
  m = _mesh(cpu_devices)
  x = jax.device_put(np.ones((16, 8), np.float32), NamedSharding(m, P("x")))
  body = lambda v: (jaxll.all_reduce(v, "x"), jaxll.psum_scatter(v, "x", tiled=True))
  plain = jax.make_jaxpr(jax.shard_map(body, mesh=m, in_specs=P("x"),
                                       out_specs=(P(), P("x"))))(x)
  assert "jaxll_devices" not in str(plain)
  with jax.set_mesh(m):
    marked = jax.make_jaxpr(jax.shard_map(body, in_specs=P("x"), out_specs=(P(), P("x"))))(x)
    g = jax.make_jaxpr(jax.grad(lambda v: jax.shard_map(
        lambda u: jaxll.all_reduce(u, "x"), in_specs=P("x"), out_specs=P())(v).sum()))(x)
  assert str(marked).count("jaxll_devices") == 2
  assert "jaxll_devices" in str(g)


def test_abstract_mesh_finds_its_devices_under_set_mesh(cpu_devices):
  # A shard_map over an abstract mesh: under jax.set_mesh the lowering finds
  # the concrete groups (explain's group size), and a program for other devices
  # (the mesh backwards) is lowered again, not taken from JAX's lowering cache.
  # Without jax.set_mesh the devices are unknown when lowering: XLA serves it.
  seen = []
  orig = internals.lowering_mesh

  def spy(ctx):
    mesh = orig(ctx)
    seen.append(None if mesh is None else [d.id for d in mesh.devices.flat])
    return mesh

  body = lambda v: (jaxll.all_reduce(v, "x"), jaxll.all_gather(v, "x", tiled=True, to="invarying"))
  f = jax.jit(jax.shard_map(body, mesh=_mesh(cpu_devices).abstract_mesh, in_specs=P("x"),
                            out_specs=(P(), P())))
  internals.lowering_mesh = spy
  try:
    for devices in (cpu_devices, list(reversed(cpu_devices))):
      m = _mesh(devices)
      x = jax.device_put(np.ones((16, 8), np.float32), NamedSharding(m, P("x")))
      seen.clear()
      with jax.set_mesh(m):
        sites = jaxll.explain(f, x)
        f(x)
      assert [(s.op, s.group_size) for s in sites] == [("sum", 4), ("all_gather", 4)]
      assert seen and seen[-1] == [d.id for d in devices]
    sites = jaxll.explain(f, x)
    assert sites[0].group_size == 0  # (the all-reduce found no groups)
    assert seen[-1] is None
  finally:
    internals.lowering_mesh = orig
  from jaxll import placement

  class Ctx:  # (a lowering context of a shard_map over an abstract mesh)
    class module_context:
      class axis_context:
        mesh = _mesh(cpu_devices).abstract_mesh
  assert "jax.set_mesh" in placement.no_mesh_reason(Ctx)


def test_distributed_client_before_initialize():
  assert internals.distributed_client() is None
  assert hasattr(internals.distributed_state(), "client")


def test_lowering_frames_hold_the_name_stacks_sites_reads(cpu_devices):
  # sites.origin tells a backward pass by the "transpose" transform of the name
  # stacks of the equations being lowered: ctx.name_stack inside a shard_map
  # differentiated from within, else those mlir.jaxpr_subcomp's frames hold
  # (eqn_name_stack: JAX lowers a shard_map's body with an empty name stack)
  from jax._src import source_info_util
  from jax._src.interpreters import mlir

  from jaxll import sites
  assert "eqn_name_stack" in mlir.jaxpr_subcomp.__code__.co_varnames
  assert source_info_util.new_name_stack().transform("transpose").stack == (
      source_info_util.Transform("transpose"),)
  seen = {}
  orig = sites.site_of

  def spy(ctx):
    seen[ctx.primitive.name] = sites._under_transpose(ctx)
    return orig(ctx)

  m = _mesh(cpu_devices)
  x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(m, P("x")))
  f = jax.shard_map(lambda v: jaxll.all_gather(v, "x", tiled=True), mesh=m, in_specs=P("x"),
                    out_specs=P("x"))
  sites.site_of = spy
  try:
    jax.jit(jax.grad(lambda v: jnp.sum(f(v) ** 2))).lower(x)
  finally:
    sites.site_of = orig
  assert seen == {"jaxll_all_gather": False, "jaxll_psum_scatter": True}, seen
