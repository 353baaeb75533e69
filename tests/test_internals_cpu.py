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
  # unreduced max and min exist from jax 0.12
  major_minor = tuple(int(v) for v in jax.__version__.split(".")[:2])
  assert ("max" in internals.UNREDUCED_ALL_REDUCE) == (major_minor >= (0, 12))
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
  assert internals.auto_pcast() in (True, False)


def test_xla_lowering_and_custom_call_exist():
  for p in (internals.psum_p, internals.pmax_p, internals.all_gather_p,
            internals.reduce_scatter_p, internals.UNREDUCED_ALL_REDUCE["sum"]):
    assert callable(internals.xla_lowering(p, ("cpu",)))
    assert callable(internals.xla_lowering(p, ("cuda",)))
  assert callable(internals.custom_call) and callable(internals.apply_primitive)
  assert internals.ir.StringAttr is not None


def test_jaxll_primitives_are_lowered_with_their_devices():
  from jax._src import dispatch
  from jaxll.all_reduce import all_reduce_p
  from jaxll.gather_scatter import all_gather_p, psum_scatter_p
  from jaxll.rmsnorm import all_reduce_rmsnorm_p
  for p in (all_reduce_p, all_gather_p, psum_scatter_p, all_reduce_rmsnorm_p):
    assert p in dispatch.prim_requires_devices_during_lowering, p


def test_abstract_mesh_finds_the_program_devices(cpu_devices):
  # A shard_map over an abstract mesh: the lowering finds the concrete groups
  # (explain's group size) from the program's devices, and a program lowered
  # for other devices is lowered again (not taken from JAX's lowering cache).
  def program(devices):
    m = _mesh(devices)
    x = jax.device_put(np.ones((16, 8), np.float32), NamedSharding(m, P("x")))
    body = lambda v: (jaxll.all_reduce(v, "x"), jaxll.all_gather(v, "a", to="invarying"))
    return jax.jit(jax.shard_map(body, mesh=m.abstract_mesh, in_specs=P("x"),
                                 out_specs=(P(), P("x")))), x

  seen = []
  orig = internals.lowering_mesh

  def spy(ctx):
    mesh = orig(ctx)
    seen.append(None if mesh is None else [d.id for d in mesh.devices.flat])
    return mesh

  internals.lowering_mesh = spy
  try:
    f, x = program(cpu_devices)
    sites = jaxll.explain(f, x)
    assert [(s.op, s.group_size) for s in sites] == [("sum", 4), ("all_gather", 2)]
    assert seen and seen[-1] == [d.id for d in cpu_devices]
    backwards = list(reversed(cpu_devices))
    f, x = program(backwards)
    seen.clear()
    jaxll.explain(f, x)
    assert seen and seen[-1] == [d.id for d in backwards]
  finally:
    internals.lowering_mesh = orig


def test_distributed_client_before_initialize():
  assert internals.distributed_client() is None
  assert hasattr(internals.distributed_state(), "client")
