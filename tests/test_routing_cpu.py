"""Routing on 8 CPU devices: a tensor-parallel block and model (forward,
backward, decode loop) whose every tp reduction is a jaxll call site, through
the region helpers or jaxll.route_psums, with psum's results; call sites named
through helpers."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll


def _put(mesh, x, spec):
  return jax.device_put(x, NamedSharding(mesh, spec))


def _random(shape, dtype, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _tp_block(x, w_in, w_out, reduce, copy):
  h = copy(x)
  a = jnp.tanh(h @ w_in)          # column-parallel
  return reduce(a @ w_out)        # row-parallel partial sums, all-reduced over tp


# the replica groups of the (dp, tp) = (2, 4) mesh's axes, as jax before 0.11
# writes them (jax 0.11 names the mesh axes instead)
_MESH2_GROUPS = {"[[0, 1, 2, 3], [4, 5, 6, 7]]": "tp", "[[0, 4], [1, 5], [2, 6], [3, 7]]": "dp",
                 "[[0, 1, 2, 3, 4, 5, 6, 7]]": "dp,tp"}


def _all_reduces(text):
  """(mesh axes reduced over, tagged by jaxll) of every all-reduce in lowered
  text on the (dp, tp) mesh."""
  out = []
  for chunk in text.split('"stablehlo.all_reduce"')[1:]:
    attrs = chunk[:chunk.index("({")]
    dense = re.search(r"replica_groups = dense<(.*?)>", attrs)
    groups = (_MESH2_GROUPS.get(dense.group(1), dense.group(1)) if dense else
              ",".join(re.findall(r'axis_ref<name = "(\w+)"', attrs)))
    end = chunk.index("}) ")
    out.append((groups, "jaxll_call" in chunk[end:end + 2000].split("\n")[0]))
  return out


@pytest.mark.parametrize("check_vma", [True, False])
def test_tp_block_backward_reductions_go_through_jaxll(mesh2, check_vma):
  # A Megatron-style block on (dp, tp) = (2, 4), differentiated with respect to
  # its input and both weights. With jax.lax.psum, the backward reduction of the
  # activation entering the column-parallel layer is JAX's own psum (the
  # transpose of an implicit pvary). With copy_to_parallel_region and
  # reduce_from_parallel_region every tp reduction of forward and backward is a
  # jaxll call site, and the gradients are psum's bit for bit (both lower to
  # XLA here).
  rng = np.random.default_rng(0)
  x = rng.standard_normal((4, 16)).astype(np.float32)
  w_in = rng.standard_normal((16, 32)).astype(np.float32)
  w_out = rng.standard_normal((32, 16)).astype(np.float32)
  specs = (P("dp", None), P(None, "tp"), P("tp", None))

  def step(reduce, copy):
    def loss(x, w_in, w_out):
      y = _tp_block(x, w_in, w_out, reduce, copy)
      return jax.lax.psum(jnp.sum(y * y), "dp")
    body = jax.shard_map(jax.grad(loss, argnums=(0, 1, 2)), mesh=mesh2, in_specs=specs,
                         out_specs=specs, check_vma=check_vma)
    return jax.jit(body)

  args = [_put(mesh2, a, s) for a, s in zip((x, w_in, w_out), specs)]
  ref = step(lambda v: jax.lax.psum(v, "tp"), lambda v: v)
  mine = step(lambda v: jaxll.reduce_from_parallel_region(v, "tp"),
              lambda v: jaxll.copy_to_parallel_region(v, "tp"))
  for g, r in zip(mine(*args), ref(*args)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(r))
  tp = "tp"
  mine_tp = [tagged for groups, tagged in _all_reduces(mine.lower(*args).as_text())
             if groups == tp]
  ref_tp = [tagged for groups, tagged in _all_reduces(ref.lower(*args).as_text())
            if groups == tp]
  assert mine_tp and all(mine_tp), mine_tp           # every tp reduction is jaxll's
  assert len(mine_tp) == len(ref_tp), (mine_tp, ref_tp)  # and none was added
  if check_vma:
    assert len(mine_tp) == 2  # forward, and the activation gradient backward


def _reduce_helper(v):
  return jaxll.all_reduce(v, "tp")


def test_call_sites_through_a_helper_name_their_callers(mesh1):
  def body(v):
    a = _reduce_helper(v)
    return _reduce_helper(a * 2)

  f = jax.jit(jax.shard_map(body, mesh=mesh1, in_specs=P("tp"), out_specs=P()))
  sites = [s.site for s in jaxll.explain(f, _put(mesh1, np.ones((8,), np.float32), P("tp")))]
  assert len(sites) == 2 and sites[0] != sites[1], sites
  for s in sites:
    helper, caller = s.split(" <- ")
    assert "(_reduce_helper)" in helper and caller.endswith("body)"), s


# --- A tensor-parallel model: forward, backward, decode loop ------------------------------

@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("variant", ["helpers", "route"])
def test_tp_model_every_tp_reduction_goes_through_jaxll(mesh2, variant, check_vma):
  # tests/tp_model.py on (dp, tp) = (2, 4): forward, the gradient of a loss
  # reduced over dp (input and both weights), and an 8-step decode loop
  # (fori_loop). Written with the region helpers or with psum inside
  # jaxll.route_psums, every tp reduction of each program is a jaxll call site
  # (none missing, none added against the psum version); with route_psums the
  # dp reductions are too. Results equal psum's bit for bit (XLA on both sides
  # here) and the float64 reference within float32 rounding (gradients: with
  # check_vma, where psum's gradients are the math's).
  import tp_model as tm
  w_in, w_out, x = tm.init()
  args = tm.place(mesh2, w_in, w_out, x)
  refs = tm.programs(mesh2, "psum", check_vma=check_vma)
  mine = tm.programs(mesh2, variant, check_vma=check_vma)
  want64 = (tm.ref_forward(w_in, w_out, x), tm.ref_grad(w_in, w_out, x),
            tm.ref_decode(w_in, w_out, x))
  tp = "tp"
  for name, f, ref, w64 in zip(("forward", "grad", "decode"), mine, refs, want64):
    got, want = f(*args), ref(*args)
    for g, r, r64 in zip(jax.tree.leaves(got), jax.tree.leaves(want), jax.tree.leaves(w64)):
      np.testing.assert_array_equal(np.asarray(g), np.asarray(r), err_msg=name)
      if check_vma or name != "grad":  # (without check_vma psum's gradients are not the
        # math's: its transpose sums the replicated cotangent over tp once more)
        np.testing.assert_allclose(np.asarray(g), r64, rtol=1e-4, atol=1e-4, err_msg=name)
    reductions = _all_reduces(f.lower(*args).as_text())
    ref_reductions = _all_reduces(ref.lower(*args).as_text())
    mine_tp = [tagged for groups, tagged in reductions if groups == tp]
    assert mine_tp and all(mine_tp), (name, reductions)
    assert len(mine_tp) == len([1 for groups, _ in ref_reductions if groups == tp]), name
    if variant == "route":
      assert all(tagged for _, tagged in reductions), (name, reductions)
      assert len(reductions) == len(ref_reductions), name
    sites = jaxll.explain(f, *args)
    assert len(tm.tp_sites(sites)) == len(mine_tp), (name, sites)


def test_route_psums_keeps_psum_semantics(mesh1):
  # pytrees in and out, keyword arguments, a psum in a scan and in a cond, a
  # psum over no tp data (a constant) and pmax (left alone); jit outside or
  # inside the scope gives the same program.
  def body(d, *, scale):
    def step(c, v):
      return c + jax.lax.psum(v, "tp"), jax.lax.pmax(v, "tp")
    total, maxes = jax.lax.scan(step, jnp.zeros(3), d["a"])
    picked = jax.lax.cond(total[0] > 0, lambda v: jax.lax.psum(v * 2, "tp"),
                          lambda v: jax.lax.psum(v, "tp"), d["b"])
    return {"total": total * scale, "maxes": maxes, "picked": picked,
            "n": jax.lax.psum(1, "tp")}

  def f(d, *, scale, name="tp"):
    assert name == "tp"  # a non-array argument reaches fun as it was passed
    return jax.shard_map(lambda v: body(v, scale=scale), mesh=mesh1,
                         in_specs=({"a": P(None, "tp"), "b": P("tp")},),
                         out_specs={"total": P(), "maxes": P(), "picked": P(), "n": P()})(d)

  d = {"a": _put(mesh1, _random((5, 24), np.float32), P(None, "tp")),
       "b": _put(mesh1, _random((16,), np.float32), P("tp"))}
  want = jax.jit(f)(d, scale=2.0)
  for routed in (jax.jit(jaxll.route_psums(f), static_argnames="name"),
                 jaxll.route_psums(jax.jit(f, static_argnames="name"))):
    got = routed(d, scale=2.0, name="tp")
    for key in want:
      np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]), err_msg=key)
  text = jax.jit(jaxll.route_psums(f)).lower(d, scale=2.0).as_text()
  sums = [tagged for _, tagged in _all_reduces(text)]
  assert sum(sums) == 3, sums  # the scan's and both branches' psums; pmax is XLA's own
  with pytest.raises(ValueError, match="unknown algorithm"):
    jaxll.route_psums(f, algorithm="fastest")


_COLLECTIVE_OPS = ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter")


def _collective_ops(text):
  return sum(text.count(f'"{op}"') + text.count(f"{op}(") for op in _COLLECTIVE_OPS)


def test_route_takes_every_collective_and_the_ones_autodiff_writes(mesh2):
  # pmax, pmin, pmean, all_gather (each to=), psum_scatter and a psum of a
  # pytree (one primitive with several operands), written with jax.lax, and the
  # collectives autodiff writes for them (psum_scatter for all_gather, psum for
  # the implicit pvary of the replicated x): every collective of the program
  # becomes a jaxll call site, with JAX's results.
  def body(x, w):
    def loss(x, w):
      g = jax.lax.all_gather(x * w, "tp", tiled=True)
      gi = jax.lax.all_gather(x, "tp", tiled=True, to="invarying")
      s = jax.lax.psum_scatter(g, "tp", tiled=True)
      m = jax.lax.pmean(w, "dp")
      return jnp.sum(s * m) + jnp.sum(gi)
    val, grads = jax.value_and_grad(loss, argnums=(0, 1))(x, w)
    tree = jax.lax.psum({"x": grads[0], "w": grads[1]}, "dp")
    return (val[None], tree, jax.lax.pmax(w, "tp"), jax.lax.pmin(w, ("dp", "tp")))

  def f(x, w):
    return jax.shard_map(body, mesh=mesh2, in_specs=(P("tp"), P(("dp", "tp"))),
                         out_specs=(P(("dp", "tp")), {"x": P("tp"), "w": P("tp")}, P("dp"), P()),
                         check_vma=False)(x, w)

  x = _put(mesh2, _random((16, 4), np.float32), P("tp"))
  w = _put(mesh2, _random((32, 4), np.float32, seed=1), P(("dp", "tp")))
  want = jax.jit(f)(x, w)
  routed = jax.jit(jaxll.route(f))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               routed(x, w), want)
  plain_ops = _collective_ops(jax.jit(f).lower(x, w).as_text())
  sites = jaxll.explain(routed, x, w)
  assert jaxll.explain(f, x, w) == []
  assert len(sites) == plain_ops >= 9, (plain_ops, sites)
  assert {s.op for s in sites} == {"sum", "max", "min", "all_gather", "psum_scatter"}, sites
  # route_psums: the sums only
  sums = jaxll.explain(jax.jit(jaxll.route_psums(f)), x, w)
  assert {s.op for s in sums} == {"sum"}
  assert len(sums) == len([s for s in sites if s.op == "sum"])
  only_gathers = jaxll.explain(jax.jit(jaxll.route(f, collectives=("all_gather",))), x, w)
  assert {s.op for s in only_gathers} == {"all_gather"}


def test_route_keeps_explicit_sharding_types(cpu_devices):
  # unreduced inputs (psum, psum_scatter) and all_gather(to="reduced"), with
  # check_vma: the routed program has JAX's types and values.
  from jax.sharding import AxisType
  m = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Explicit,) * 2,
                    devices=cpu_devices)
  types = []

  def body(v):
    u = jax.lax.pcast(v, "tp", to="unreduced")
    outs = (jax.lax.psum(u, "tp"), jax.lax.psum_scatter(u, "tp", tiled=True),
            jax.lax.all_gather(v, "tp", tiled=True, to="reduced"))
    types.append(tuple(str(jax.typeof(o)) for o in outs))
    return outs

  def f(x):
    return jax.shard_map(body, mesh=m, in_specs=P("tp"),
                         out_specs=(P(), P("tp"), P(reduced={"tp"})))(x)

  x = _put(m, _random((16, 4), np.float32), P("tp"))
  want = jax.jit(f)(x)
  got = jax.jit(jaxll.route(f))(x)
  assert types[0] == types[-1], types
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, want)
  sites = jaxll.explain(jax.jit(jaxll.route(f)), x)
  assert sorted(s.op for s in sites) == ["all_gather", "psum_scatter", "sum"], sites


def test_route_checks_its_arguments():
  with pytest.raises(ValueError, match="unknown algorithm"):
    jaxll.route(lambda x: x, algorithm="fastest")
  with pytest.raises(ValueError, match="collectives must be"):
    jaxll.route(lambda x: x, collectives=("psum", "pbroadcast"))
  with pytest.raises(ValueError, match="collectives must be"):
    jaxll.route(lambda x: x, collectives="psum")
  assert callable(jaxll.route(algorithm="oneshot_barrier")(lambda x: x))


def test_route_runs_an_eager_shard_map_body_as_jax_does(mesh1):
  # Outside jit, shard_map runs its body op by op on each device's values:
  # Python control flow on a collective's result works, routed or not (the
  # eager collectives are XLA's either way)
  def body(v):
    return -v if jax.lax.psum(v, "tp").sum() > 0 else v

  x = _put(mesh1, np.arange(8.0, dtype=np.float32), P("tp"))
  want = jax.shard_map(body, mesh=mesh1, in_specs=P("tp"), out_specs=P("tp"))(x)
  got = jax.shard_map(jaxll.route(body), mesh=mesh1, in_specs=P("tp"), out_specs=P("tp"))(x)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert (np.asarray(got) == -np.arange(8.0)).all()

  def no_arguments():  # (nothing to tell the eager body by but the trace)
    return 1.0 if jax.lax.psum(jax.lax.axis_index("tp"), "tp") > 0 else -1.0

  out = jax.shard_map(jaxll.route(no_arguments), mesh=mesh1, in_specs=(), out_specs=P())()
  assert out == 1.0


def test_route_passes_arguments_whose_hash_raises():
  class Opaque:  # (jit and shard_map take such static values as they are)
    def __hash__(self):
      raise RuntimeError("not hashable")

  o, seen = Opaque(), []
  out = jaxll.route(lambda a, x: seen.append(a) or x + 1)(o, np.float32(1))
  assert seen == [o] and out == 2
