"""jaxll.all_reduce_rmsnorm's types under check_vma on a (dp, tp) mesh,
transformations (gradients, jacfwd, vmap), argument errors and the lowered
attributes against the handlers' declarations."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll

from rmsnorm_cases import cuda_text, inputs, put, reference, shard


@pytest.fixture(scope="module")
def mesh(cpu_devices):
  return jax.make_mesh((8,), ("tp",), devices=cpu_devices)


_SPECS = {"replicated": P(), "dp": P("dp"), "tp": P("tp")}


def _grid_inputs(seed=7, tokens=3, hidden=16):
  """x: every (dp, tp) device's partial sums; residual and weight with a
  leading axis of 2 (dp) or 4 (tp) where they are sharded, one copy replicated."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((2, 4, tokens, hidden)).astype(np.float32)
  residual = {k: rng.standard_normal(((2,) if k == "dp" else (4,) if k == "tp" else ())
                                     + (tokens, hidden)).astype(np.float32) for k in _SPECS}
  weight = {k: (1 + 0.1 * rng.standard_normal(((2,) if k == "dp" else (4,) if k == "tp" else ())
                                              + (hidden,))).astype(np.float32) for k in _SPECS}
  return x, residual, weight


def _grid(mesh2, fn, r_kind, w_kind, out_specs, check_vma=True):
  """fn(x, r, w) on the (dp, tp) mesh, per device x (tokens, hidden), r and w
  as their kind gives them (one slice where sharded)."""
  def body(x, r, w):
    r = r if r_kind == "replicated" else r[0]
    w = w if w_kind == "replicated" else w[0]
    return fn(x[0, 0], r, w)
  specs = (P("dp", "tp"), _SPECS[r_kind], _SPECS[w_kind])
  f = jax.jit(jax.shard_map(body, mesh=mesh2, in_specs=specs, out_specs=out_specs,
                            check_vma=check_vma))
  return lambda *args: f(*(jax.device_put(a, NamedSharding(mesh2, s)) for a, s in zip(args, specs)))


def _fused_or_reference(fused):
  if fused:
    return lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp")
  return lambda x, r, w: reference(x, r, w, 1e-6)


@pytest.mark.parametrize("r_kind,w_kind", [("replicated", "replicated"), ("dp", "replicated"),
                                           ("tp", "replicated"), ("replicated", "tp"),
                                           ("dp", "dp")])
def test_result_types_are_the_compositions(mesh2, r_kind, w_kind):
  # the results vary over what x varies over besides the reduced axis (here
  # dp), and over what residual and weight vary over: a shard_map whose
  # out_specs claim more replication is refused, as it is for the psum
  # reference (no silent pick of one device's rows); with out_specs that fit,
  # the values and types equal the reference's
  x, residual, weight = _grid_inputs()
  args = (x, residual[r_kind], weight[w_kind])
  from jaxll import rmsnorm as fused_mod
  varying = {}

  def typed(name, fn):
    def run(x, r, w):
      out = fn(x, r, w)
      varying[name] = [fused_mod._varying(o) for o in out]
      return out
    return run

  for name, fused in (("reference", False), ("fused", True)):
    with pytest.raises(Exception, match="out_specs") as e:
      _grid(mesh2, _fused_or_reference(fused), r_kind, w_kind, (P(), P()))(*args)
    assert "replicat" in str(e.value), e.value
  spread = P("dp", "tp")
  lift = lambda fn: (lambda x, r, w: tuple(o[None, None] for o in fn(x, r, w)))
  got = _grid(mesh2, lift(typed("fused", _fused_or_reference(True))), r_kind, w_kind,
              (spread, spread))(*args)
  want = _grid(mesh2, lift(typed("reference", _fused_or_reference(False))), r_kind, w_kind,
               (spread, spread))(*args)
  assert varying["fused"] == varying["reference"], varying
  axes_of = lambda *kinds: frozenset({"dp"} | {k for k in kinds if k != "replicated"})
  assert varying["fused"] == [axes_of(r_kind, w_kind), axes_of(r_kind)], varying
  for g, v in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(v))
  # float64: the sum over tp of each dp row's partials, plus the residual
  h = x.astype(np.float64).sum(1)[:, None] + np.broadcast_to(
      {"replicated": residual["replicated"][None, None], "dp": residual["dp"][:, None],
       "tp": residual["tp"][None]}[r_kind], (2, 4, 3, 16))
  np.testing.assert_allclose(np.asarray(got[1], np.float64).reshape(2, 4, 3, 16), h,
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("check_vma", [True, False])
def test_gradients_on_a_dp_tp_mesh_with_a_sharded_residual(mesh2, check_vma):
  x, residual, weight = _grid_inputs(seed=8)
  args = (x, residual["dp"], weight["replicated"])

  def grads(fused):
    f = _fused_or_reference(fused)

    def body(x, r, w):
      def loss(x, r, w):
        normed, new_residual = f(x, r, w)
        return jnp.sum(normed * normed) + jnp.sum(jnp.sin(new_residual))
      gx, gr, gw = jax.grad(loss, argnums=(0, 1, 2))(x[0, 0], r[0], w)
      _, tangent = jax.jvp(lambda v: f(v, r[0], w)[0], (x[0, 0],), (jnp.ones_like(x[0, 0]),))
      return (gx[None, None], jax.lax.psum(gr, "tp")[None], jax.lax.psum(gw, ("dp", "tp")),
              tangent[None, None])
    specs = (P("dp", "tp"), P("dp"), P())
    return jax.jit(jax.shard_map(body, mesh=mesh2, in_specs=specs,
                                 out_specs=(P("dp", "tp"), P("dp"), P(), P("dp", "tp")),
                                 check_vma=check_vma))(
        *(jax.device_put(a, NamedSharding(mesh2, s)) for a, s in zip(args, specs)))

  for g, w in zip(grads(True), grads(False)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("check_vma", [True, False])
def test_jacfwd_and_an_unbatched_call_under_vmap(mesh, check_vma):
  # jacfwd (vmap of jvp) batches the tangents only: the call itself runs once,
  # unbatched, and its rows are not multiplied by the batch
  x, residual, weight = inputs(np.float32, tokens=2, hidden=8, seed=9)
  args = put(mesh, x, residual, weight)

  def jac(fn):
    def body(x, r, w):
      jr = jax.jacfwd(lambda rr: fn(x, rr, w)[0])(r)
      jw = jax.jacfwd(lambda ww: fn(x, r, ww)[0])(w)
      scaled = jax.vmap(lambda t: fn(x, r, w)[0] * t)(jnp.arange(5.0, dtype=jnp.float32))
      return jr, jw, scaled
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp"), P(), P()),
                                 out_specs=(P(), P(), P()), check_vma=check_vma))(*args)

  got = jac(lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp"))
  sites = [s for s in jaxll.recent_call_sites()
           if s.op == "sum+rmsnorm" and "test_jacfwd_and_an_unbatched" in s.site]
  assert sites and all(s.shape == "(2, 8)" for s in sites), [s.shape for s in sites]
  want = jac(lambda x, r, w: reference(x, r, w, 1e-6))
  assert got[0].shape == (2, 8, 2, 8) and got[2].shape == (5, 2, 8)
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kw,error,match", [
    (dict(algorithm="fussed"), ValueError,
     r"jaxll.all_reduce_rmsnorm: algorithm must be one of \['auto', 'fused', 'fused_ll'"),
    (dict(algorithm="fused_oneshot_ll"), ValueError, "all_reduce_rmsnorm: algorithm must be"),
    (dict(algorithm=None), ValueError, "all_reduce_rmsnorm: algorithm must be"),
    (dict(eps="1e-6"), TypeError, "eps must be a real number known when tracing"),
    (dict(eps=1j), TypeError, "eps must be a real number known when tracing"),
    (dict(eps=np.array([1e-6, 1e-6])), TypeError, "eps must be a real number"),
    (dict(eps=None), TypeError, "eps must be a real number"),
    (dict(eps=-1e-6), ValueError, "eps must be >= 0"),
    (dict(eps=float("nan")), ValueError, "eps must be >= 0"),
    (dict(weight=np.ones(64, np.complex64)), TypeError, "weight must be real"),
    (dict(weight=np.ones(64, np.bool_)), TypeError, "weight must be real"),
    (dict(axis="dp"), NameError, "jaxll.all_reduce_rmsnorm: unknown axis name 'dp'"),
    (dict(axis=("tp", "tp")), ValueError, "jaxll.all_reduce_rmsnorm: axis names repeat"),
    (dict(axis=0), TypeError, "jaxll.all_reduce_rmsnorm reduces over named mesh axes"),
])
def test_bad_arguments_are_refused_by_name(mesh, kw, error, match):
  x, residual, weight = inputs(np.float32)
  weight = kw.pop("weight", weight)
  axis = kw.pop("axis", "tp")
  f = shard(mesh, lambda a, r, w: jaxll.all_reduce_rmsnorm(a, r, w, axis, **kw), True)
  with pytest.raises(error, match=match):
    f(*put(mesh, x, residual, weight))


def test_eps_as_a_concrete_scalar_and_a_traced_one(mesh):
  args = put(mesh, *inputs(np.float32, seed=10))
  want = shard(mesh, lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp", eps=1e-5),
                True)(*args)
  for eps in (np.float32(1e-5), jnp.float32(1e-5), np.array(1e-5), 1e-5):
    got = shard(mesh, lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp", eps=eps),
                 True)(*args)
    for g, v in zip(got, want):
      np.testing.assert_array_equal(np.asarray(g), np.asarray(v))
  traced = shard(mesh, lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp", eps=w[0]), True)
  with pytest.raises(TypeError, match="eps must be a real number known when tracing"):
    traced(*args)


@pytest.mark.parametrize("name", ["all_gather", "psum_scatter"])
def test_gather_scatter_axis_errors_name_the_function(mesh, name):
  f = jax.jit(jax.shard_map(lambda x: getattr(jaxll, name)(x, "dp"), mesh=mesh,
                            in_specs=P("tp"), out_specs=P("tp")))
  with pytest.raises(NameError, match=f"jaxll.{name}: unknown axis name 'dp'"):
    f(jax.device_put(jnp.ones((8, 8), jnp.float32), NamedSharding(mesh, P("tp"))))


def _declared_attributes(paths):
  """{FFI target: {attribute: MLIR type}} from the XLA_FFI_DEFINE_HANDLER
  bindings of C++ files (their binding macros expanded) and the names their
  handler tables give them (``handlers.add("target", handler, ...)``)."""
  import os
  import re
  out = {}
  for path in paths:
    text = open(path).read()
    macros = {m.group(1): m.group(2) for m in re.finditer(
        r"#define (\w+)\s*\\\n((?:.*\\\n)*.*)", text)}
    types = {"int64_t": "i64", "int32_t": "i32", "float": "f32", "bool": "i1",
             "ffi::Span<const int64_t>": "i64[]"}
    handlers = {}
    for m in re.finditer(r"XLA_FFI_DEFINE_HANDLER\((\w+),\s*\w+,(.*?)\);", text, re.S):
      body = m.group(2)
      for name, expansion in macros.items():
        body = body.replace(name, expansion)
      handlers[m.group(1)] = {a: types[t] for t, a in re.findall(r'\.Attr<([^>]+>?)>\("(\w+)"\)', body)}
    for target, handler in re.findall(r'handlers\.add\("(\w+)", (\w+),', text):
      out[target] = handlers[handler]
    assert handlers and os.path.basename(path)
  return out


def _lowered_attributes(text):
  """{custom call target: {attribute: MLIR type}} of every jaxll custom call in
  lowered text (each target's calls must agree)."""
  import re
  out = {}
  for m in re.finditer(r"stablehlo\.custom_call @(jaxll_\w+)\([^\n]*?mhlo\.backend_config = "
                       r"\{([^}]*)\}", text):
    attrs = {}
    for name, value in re.findall(r"(\w+) = ([^,]+(?:\[[^\]]*\])?)", m.group(2)):
      kind = value.strip().split(":")[-1].strip()
      attrs[name] = ("i64[]" if re.fullmatch(r"tensor<\d+xi64>|array<i64.*", kind) else
                     "i1" if kind in ("true", "false") else kind)
    assert out.setdefault(m.group(1), attrs) == attrs, (m.group(1), attrs)
  return out


def test_lowered_attributes_are_the_ones_the_handlers_declare(mesh, monkeypatch):
  # every custom call jaxll emits carries exactly the attributes, names and
  # types, that its FFI handler binds (ffi/runtime/*_op.cc and program_ops.cc,
  # and ffi/testing/virtual_ffi.cc for jaxll.tools.testing's calls): a
  # mismatch would only show on a GPU, as an FFI decoding error at run time
  import os
  import types as pytypes
  from jaxll.tools import testing as jt
  from jaxll import placement
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  declared = _declared_attributes(
      [os.path.join(root, "ffi", "runtime", f) for f in
       ("all_reduce_op.cc", "rmsnorm_op.cc", "gather_scatter_op.cc", "exchange_op.cc",
        "ragged_op.cc", "program_ops.cc")] +
      [os.path.join(root, "ffi", "testing", "virtual_ffi.cc")])
  lowered = _lowered_attributes(cuda_text(mesh, monkeypatch, hidden=64))  # fused + all_reduce
  monkeypatch.setattr(placement, "group_size", lambda ctx, axes: 8)
  for fn in (lambda v: jaxll.all_gather(v, "tp", tiled=True, algorithm="oneshot_ll"),
             lambda v: jaxll.psum_scatter(v, "tp", tiled=True, algorithm="oneshot_ll"),
             lambda v: jaxll.ppermute(v, "tp", [(i, 7 - i) for i in range(8)],
                                      algorithm="oneshot_ll"),
             lambda v: jaxll.all_to_all(v, "tp", 0, 0, tiled=True, algorithm="oneshot_ll")):
    f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))
    x = jax.device_put(np.zeros((8 * 64,), np.float32), NamedSharding(mesh, P("tp")))
    lowered.update(_lowered_attributes(f.trace(x).lower(lowering_platforms=("cuda",)).as_text()))
  ragged = lambda v: jaxll.ragged_all_to_all(v, v, *(jnp.zeros(8, jnp.int32),) * 4,
                                             axis_name="tp", algorithm="oneshot_ll")
  f = jax.jit(jax.shard_map(ragged, mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))
  x = jax.device_put(np.zeros((8 * 64,), np.float32), NamedSharding(mesh, P("tp")))
  lowered.update(_lowered_attributes(f.trace(x).lower(lowering_platforms=("cuda",)).as_text()))
  monkeypatch.setattr(jt, "virtual_workspace", lambda n, device=None, config=None:
                      pytypes.SimpleNamespace(id=7))
  x = jax.ShapeDtypeStruct((2, 3, 64), np.float32)
  w = jax.ShapeDtypeStruct((64,), np.float32)
  for graph in (False, True):
    f = lambda x: jt.virtual_all_reduce(x, command_buffer=graph)
    g = lambda x, r, w: jt.virtual_fused_rmsnorm(x, r, w, command_buffer=graph, protocol="ll")
    lowered.update(_lowered_attributes(
        jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()))
    lowered.update(_lowered_attributes(
        jax.jit(g).trace(x, x, w).lower(lowering_platforms=("cuda",)).as_text()))
  want = {"jaxll_all_reduce", "jaxll_all_reduce_rmsnorm", "jaxll_gather_scatter", "jaxll_check",
          "jaxll_ppermute", "jaxll_all_to_all", "jaxll_ragged_all_to_all",
          "jaxll_virtual_all_reduce", "jaxll_virtual_all_reduce_graph",
          "jaxll_virtual_all_reduce_rmsnorm", "jaxll_virtual_all_reduce_rmsnorm_graph"}
  assert want <= set(lowered), sorted(lowered)
  for target, attrs in lowered.items():
    assert attrs == declared[target], (target, attrs, declared[target])
  assert declared["jaxll_all_reduce"]["workspace"] == "i64"


def test_unreduced_x_takes_the_composition_with_psums_types(cpu_devices):
  # x typed unreduced over tp (explicit sharding): the composition, whose
  # all-reduce sums it as jax.lax.psum does; the results' types and values are
  # those of psum followed by the norm
  from jax.sharding import AxisType
  m = jax.make_mesh((8,), ("tp",), axis_types=(AxisType.Explicit,), devices=cpu_devices)
  rng = np.random.default_rng(3)
  x = jax.device_put(rng.standard_normal((8 * 2, 16)).astype(np.float32),
                     NamedSharding(m, P("tp")))
  r = jnp.asarray(rng.standard_normal((2, 16)).astype(np.float32))
  w = jnp.asarray(rng.standard_normal(16).astype(np.float32))
  types = {}

  def body(name, fuse):
    def f(v, r, w):
      u = jax.lax.pcast(v, "tp", to="unreduced")
      out = fuse(u, r, w)
      types[name] = tuple(str(jax.typeof(o)) for o in out)
      return out
    return jax.jit(jax.shard_map(f, mesh=m, in_specs=(P("tp"), P(), P()),
                                 out_specs=(P(), P())))

  want = body("jax", lambda u, r, w: jaxll.rmsnorm.residual_rmsnorm(
      jax.lax.psum(u, "tp"), r, w, eps=1e-6))(x, r, w)
  got = body("jaxll", lambda u, r, w: jaxll.all_reduce_rmsnorm(u, r, w, "tp", eps=1e-6))(x, r, w)
  assert types["jaxll"] == types["jax"], types
  for a, b in zip(got, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
