"""CPU tier: jaxll.all_reduce against lax.psum/pmax/pmin on 8 virtual CPU devices.

On CPU every call lowers to XLA's all-reduce, so these tests pin down the
JAX-level behaviour (results, check_vma typing, grad, vmap, multi-axis meshes,
many call sites, errors, path reporting) independently of the kernels.
"""

import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll
from jaxll import algorithms, placement

ALL_REDUCE = sys.modules["jaxll.all_reduce"]  # (the module; jaxll.all_reduce is the function)

REFERENCE = {"sum": jax.lax.psum, "max": jax.lax.pmax, "min": jax.lax.pmin,
             "mean": jax.lax.pmean}


def _put(mesh, x, spec):
  return jax.device_put(x, NamedSharding(mesh, spec))


def _run_pair(mesh, body_j, body_ref, x, in_spec, out_spec, check_vma=True):
  fj = jax.jit(jax.shard_map(body_j, mesh=mesh, in_specs=in_spec, out_specs=out_spec,
                             check_vma=check_vma))
  fr = jax.jit(jax.shard_map(body_ref, mesh=mesh, in_specs=in_spec, out_specs=out_spec,
                             check_vma=check_vma))
  xs = _put(mesh, x, in_spec)
  return np.asarray(fj(xs)), np.asarray(fr(xs))


def _random(shape, dtype, seed=0):
  rng = np.random.default_rng(seed)
  if np.dtype(dtype) == np.bool_:
    return rng.integers(0, 2, size=shape).astype(bool)
  if jnp.issubdtype(dtype, jnp.integer):
    return rng.integers(-50, 50, size=shape).astype(dtype)
  return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32,
                                   jnp.int8, jnp.bool_])
@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
def test_matches_reference_1d(mesh1, dtype, op):
  # same values and the same result dtype as psum/pmax/pmin/pmean (bool sums to
  # int32, its max/min stay bool; the mean of integers is float)
  x = _random((8 * 3, 5), dtype)
  got, want = _run_pair(mesh1, lambda v: jaxll.all_reduce(v, "tp", op=op),
                        lambda v: REFERENCE[op](v, "tp"), x, P("tp"), P())
  assert got.dtype == want.dtype
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("axes", ["tp", "dp", ("dp", "tp"), ("tp", "dp")])
def test_two_axis_mesh(mesh2, axes):
  x = _random((8, 7), np.float32, seed=1)
  got, want = _run_pair(mesh2, lambda v: jaxll.all_reduce(v, axes),
                        lambda v: jax.lax.psum(v, axes), x, P(("dp", "tp")), P(("dp", "tp")),
                        check_vma=False)
  np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("check_vma", [True, False])
def test_typing_matches_psum(mesh2, check_vma):
  types = {}

  def body(v):
    w = v * 2  # varying over both axes
    c = jnp.ones((3,), jnp.float32)  # invariant: psum inserts pvary, so must we
    types["tp"] = (jax.typeof(jaxll.all_reduce(w, "tp")), jax.typeof(jax.lax.psum(w, "tp")))
    types["both"] = (jax.typeof(jaxll.all_reduce(w, ("dp", "tp"))),
                     jax.typeof(jax.lax.psum(w, ("dp", "tp"))))
    types["inv"] = (jax.typeof(jaxll.all_reduce(c, "tp")), jax.typeof(jax.lax.psum(c, "tp")))
    types["max"] = (jax.typeof(jaxll.all_reduce(w, "dp", op="max")),
                    jax.typeof(jax.lax.pmax(w, "dp")))
    return v

  f = jax.jit(jax.shard_map(body, mesh=mesh2, in_specs=P(("dp", "tp")),
                            out_specs=P(("dp", "tp")), check_vma=check_vma))
  f.lower(_put(mesh2, np.ones((8, 3), np.float32), P(("dp", "tp"))))
  for name, (ours, theirs) in types.items():
    assert ours == theirs, (name, ours, theirs)


@pytest.mark.parametrize("check_vma", [True, False])
def test_grad_matches_psum(mesh1, check_vma):
  x = _random((8 * 2, 3), np.float32, seed=2)

  def loss(reduce):
    def per_device(v):
      s = reduce(v * v, "tp")
      return jnp.sin(s) * jnp.cos(v)
    sm = jax.shard_map(per_device, mesh=mesh1, in_specs=P("tp"), out_specs=P("tp"),
                       check_vma=check_vma)
    return lambda v: jnp.sum(sm(v))

  xs = _put(mesh1, x, P("tp"))
  with jax.set_mesh(mesh1):
    g_ours = jax.jit(jax.grad(loss(jaxll.all_reduce)))(xs)
    g_ref = jax.jit(jax.grad(loss(jax.lax.psum)))(xs)
    v_ours, v_ref = jax.jit(loss(jaxll.all_reduce))(xs), jax.jit(loss(jax.lax.psum))(xs)
  np.testing.assert_allclose(np.asarray(g_ours), np.asarray(g_ref), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(v_ours), float(v_ref), rtol=1e-6)


def test_jvp_and_linear_transpose(mesh1):
  x = _put(mesh1, _random((8, 4), np.float32, seed=3), P("tp"))
  t = _put(mesh1, _random((8, 4), np.float32, seed=4), P("tp"))

  def f(reduce):
    return jax.shard_map(lambda v: reduce(v, "tp") ** 2, mesh=mesh1, in_specs=P("tp"),
                         out_specs=P())

  with jax.set_mesh(mesh1):
    p1, t1 = jax.jvp(f(jaxll.all_reduce), (x,), (t,))
    p2, t2 = jax.jvp(f(jax.lax.psum), (x,), (t,))
  np.testing.assert_allclose(np.asarray(p1), np.asarray(p2), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(t1), np.asarray(t2), rtol=1e-5)


def test_vmap_inside_shard_map(mesh1):
  x = _random((8 * 2, 5, 3), np.float32, seed=5)
  got, want = _run_pair(
      mesh1, lambda v: jax.vmap(lambda r: jaxll.all_reduce(r, "tp"))(v),
      lambda v: jax.vmap(lambda r: jax.lax.psum(r, "tp"))(v), x, P("tp"), P())
  np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("op", ["sum", "max"])
def test_vmap_axis_in_reduction(mesh1, op):
  x = _random((3, 8 * 2, 4), np.float32, seed=6)

  def make(reduce):
    inner = jax.shard_map(lambda r: reduce(r, ("b", "tp")), mesh=mesh1, in_specs=P("tp"),
                          out_specs=P(), check_vma=False)
    return jax.jit(jax.vmap(inner, axis_name="b"))

  ours = make(lambda r, a: jaxll.all_reduce(r, a, op=op))
  ref = make(REFERENCE[op])
  xs = _put(mesh1, x, P(None, "tp"))
  np.testing.assert_allclose(np.asarray(ours(xs)), np.asarray(ref(xs)), rtol=1e-5)


def test_many_call_sites_and_explain(mesh1):
  def body(v):
    a = jaxll.all_reduce(v, "tp")
    b = jaxll.all_reduce(a * 2, "tp", op="max")
    c = jaxll.all_reduce(b.astype(jnp.bfloat16), "tp", algorithm="xla")
    return a + b + c.astype(jnp.float32)

  def ref(v):
    a = jax.lax.psum(v, "tp")
    b = jax.lax.pmax(a * 2, "tp")
    c = jax.lax.psum(b.astype(jnp.bfloat16), "tp")
    return a + b + c.astype(jnp.float32)

  x = _random((8, 6), np.float32, seed=7)
  got, want = _run_pair(mesh1, body, ref, x, P("tp"), P())
  np.testing.assert_allclose(got, want, rtol=1e-2)

  f = jax.jit(jax.shard_map(body, mesh=mesh1, in_specs=P("tp"), out_specs=P()))
  sites = jaxll.explain(f, _put(mesh1, x, P("tp")))
  assert [s.op for s in sites] == ["sum", "max", "sum"]
  assert [s.requested for s in sites] == ["auto", "auto", "xla"]
  assert all(s.algorithm == "xla" for s in sites)
  assert "cpu" in sites[0].reason
  assert sites[0].site.startswith("test_all_reduce_cpu.py:")
  assert sites[2].dtype == "bfloat16" and sites[2].shape == "(1, 6)"
  assert sites[0].nbytes == 6 * 4
  assert jaxll.recent_call_sites()[-1].requested == "xla"


def test_donation_and_repeat(mesh1):
  f = jax.jit(jax.shard_map(lambda v: jaxll.all_reduce(v, "tp"), mesh=mesh1,
                            in_specs=P("tp"), out_specs=P("tp")), donate_argnums=0)
  x = _random((8, 4), np.float32, seed=8)
  want = np.tile(x.reshape(8, 1, 4).sum(0), (8, 1))
  for _ in range(3):
    out = f(_put(mesh1, x, P("tp")))
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5)


def test_pytree_and_constant(mesh1):
  def body(v):
    tree = {"a": v, "b": (v * 3, jnp.int32(2))}
    out = jaxll.all_reduce(tree, "tp")
    const = jaxll.all_reduce(1.5, "tp")  # not a tracer: psum's constant rule
    return out["a"] + out["b"][0] + out["b"][1] + const

  def ref(v):
    tree = {"a": v, "b": (v * 3, jnp.int32(2))}
    out = jax.lax.psum(tree, "tp")
    return out["a"] + out["b"][0] + out["b"][1] + jax.lax.psum(1.5, "tp")

  got, want = _run_pair(mesh1, body, ref, _random((8, 2), np.float32), P("tp"), P(),
                        check_vma=False)
  np.testing.assert_allclose(got, want, rtol=1e-6)


# --- errors ---------------------------------------------------------------------

def test_outside_shard_map_is_a_clear_error():
  with pytest.raises(NameError, match=r"jaxll.all_reduce: unknown axis name 'tp' "
                                      r"\(no named axis is bound here\).*shard_map"):
    jax.jit(lambda v: jaxll.all_reduce(v, "tp"))(jnp.ones(3))


def test_unknown_axis(mesh1):
  f = jax.shard_map(lambda v: jaxll.all_reduce(v, "dp"), mesh=mesh1, in_specs=P("tp"),
                    out_specs=P())
  # (the error names the axes that are bound, as a misspelt name's fix)
  with pytest.raises(NameError, match=r"unknown axis name 'dp' \(the axes bound here are 'tp'\)"):
    jax.jit(f).lower(_put(mesh1, np.ones((8,), np.float32), P("tp")))


@pytest.mark.parametrize("kwargs, exc, pattern", [
    (dict(op="prod"), ValueError, "op must be one of"),
    (dict(algorithm="ring"), ValueError, "algorithm must be one of"),
])
def test_bad_arguments(mesh1, kwargs, exc, pattern):
  f = jax.shard_map(lambda v: jaxll.all_reduce(v, "tp", **kwargs), mesh=mesh1,
                    in_specs=P("tp"), out_specs=P())
  with pytest.raises(exc, match=pattern):
    jax.jit(f).lower(_put(mesh1, np.ones((8,), np.float32), P("tp")))


def test_positional_axis_rejected(mesh1):
  f = jax.shard_map(lambda v: jaxll.all_reduce(v, 0), mesh=mesh1, in_specs=P("tp"),
                    out_specs=P())
  with pytest.raises(TypeError, match="named mesh axes"):
    jax.jit(f).lower(_put(mesh1, np.ones((8,), np.float32), P("tp")))


def test_unsupported_dtype(mesh1):
  def body(v):
    key = jax.random.key(0)
    return jaxll.all_reduce(key, "tp")
  f = jax.shard_map(body, mesh=mesh1, in_specs=P("tp"), out_specs=P())
  with pytest.raises(TypeError, match="unsupported dtype key"):
    jax.jit(f).lower(_put(mesh1, np.ones((8,), np.float32), P("tp")))


def test_forced_kernel_on_cpu_fails_loudly(mesh1):
  f = jax.shard_map(lambda v: jaxll.all_reduce(v, "tp", algorithm="oneshot_ll"),
                    mesh=mesh1, in_specs=P("tp"), out_specs=P())
  with pytest.raises(jaxll.AlgorithmUnavailableError,
                     match=r"algorithm='oneshot_ll'.*cannot serve.*cpu"):
    jax.jit(f).lower(_put(mesh1, np.ones((8,), np.float32), P("tp")))


def test_max_is_not_differentiable(mesh1):
  f = jax.shard_map(lambda v: jaxll.all_reduce(v, "tp", op="max").sum(), mesh=mesh1,
                    in_specs=P("tp"), out_specs=P())
  with pytest.raises(NotImplementedError, match="not differentiable"):
    with jax.set_mesh(mesh1):
      jax.grad(f)(_put(mesh1, np.ones((8,), np.float32), P("tp")))


def test_virtual_ranks_need_a_gpu():
  from conftest import HAS_GPU
  if HAS_GPU:
    pytest.skip("a GPU is present")
  import jaxll.tools.testing
  with pytest.raises(RuntimeError, match="need a CUDA GPU|without its CUDA kernels"):
    jaxll.tools.testing.virtual_all_reduce(np.ones((2, 3), np.float32))


def test_virtual_one_launch_runs_every_rank():
  # one launch holds every rank's blocks: a skipped rank (fault injection) is
  # refused before any GPU is looked for
  import jaxll.tools.testing
  with pytest.raises(ValueError, match="one_launch runs every rank"):
    jaxll.tools.testing.virtual_all_reduce(np.ones((2, 3), np.float32), one_launch=True, _skip_rank=1)


@pytest.mark.parametrize("one_launch", [False, True])
@pytest.mark.parametrize("command_buffer", [False, True])
def test_virtual_calls_lower_with_their_attributes(monkeypatch, one_launch, command_buffer):
  # the virtual all-reduce and fused calls lowered for CUDA (no GPU: the
  # workspace lookup stood in for): one_launch reaches the custom call as the
  # 64-bit integer the FFI handlers declare, beside the other attributes
  from jaxll.tools import testing as jt
  monkeypatch.setattr(jt, "virtual_workspace", lambda n, device=None, config=None:
                      types.SimpleNamespace(id=7))
  x = jax.ShapeDtypeStruct((2, 3, 64), np.float32)
  w = jax.ShapeDtypeStruct((64,), np.float32)
  suffix = "_graph" if command_buffer else ""
  f = lambda x: jt.virtual_all_reduce(x, algorithm="oneshot_ll", command_buffer=command_buffer,
                                      one_launch=one_launch)
  text = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()
  assert f"@jaxll_virtual_all_reduce{suffix}(" in text
  for attr in ("workspace = 7 : i64", "skip_rank = -1 : i64", f"one_launch = {int(one_launch)} : i64"):
    assert attr in text, text
  g = lambda x, r, w: jt.virtual_fused_rmsnorm(x, r, w, command_buffer=command_buffer,
                                               protocol="sentinel", one_launch=one_launch)
  text = jax.jit(g).trace(x, x, w).lower(lowering_platforms=("cuda",)).as_text()
  assert f"@jaxll_virtual_all_reduce_rmsnorm{suffix}(" in text
  code = algorithms.RMSNORM_PROTOCOL_CODES["sentinel"]
  for attr in ("workspace = 7 : i64", f"protocol = {code} : i32", f"one_launch = {int(one_launch)} : i64"):
    assert attr in text, text


@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
@pytest.mark.parametrize("check_vma", [True, False])
def test_empty_axis_tuple_returns_the_input(mesh1, op, check_vma):
  # psum(x, ()) is x and pmean(x, ()) is x / 1; (jax.lax.pmax/pmin raise here
  # under check_vma: jaxll returns x, the reduction over no axis)
  x = _random((8 * 2, 3), np.int32)
  f = jax.jit(jax.shard_map(lambda v: jaxll.all_reduce(v, (), op=op), mesh=mesh1,
                            in_specs=P("tp"), out_specs=P("tp"), check_vma=check_vma))
  got = f(_put(mesh1, x, P("tp")))
  want = np.asarray(jnp.asarray(x) / 1) if op == "mean" else x  # (float32, as pmean)
  assert got.dtype == want.dtype
  np.testing.assert_array_equal(np.asarray(got), want)


def test_mean_is_differentiable_like_pmean(mesh1):
  x = _random((8 * 2, 3), np.float32)

  def loss(fn):
    body = jax.shard_map(lambda v: fn(v * v), mesh=mesh1, in_specs=P("tp"), out_specs=P())
    return jax.jit(jax.grad(lambda v: body(v).sum()))

  got = loss(lambda v: jaxll.all_reduce(v, "tp", op="mean"))(_put(mesh1, x, P("tp")))
  want = loss(lambda v: jax.lax.pmean(v, "tp"))(_put(mesh1, x, P("tp")))
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_vmap_axis_inside_shard_map_is_a_clear_error(mesh1):
  f = jax.shard_map(lambda v: jax.vmap(lambda r: jaxll.all_reduce(r, "v"), axis_name="v")(v),
                    mesh=mesh1, in_specs=P("tp"), out_specs=P("tp"))
  with pytest.raises(NotImplementedError, match="vmap axis_name"):
    jax.jit(f).lower(_put(mesh1, np.ones((8, 3), np.float32), P("tp")))


def test_disable_sends_even_a_forced_kernel_to_xla(mesh1, monkeypatch, caplog):
  f = jax.jit(jax.shard_map(lambda v: jaxll.all_reduce(v, "tp", algorithm="oneshot_ll"),
                            mesh=mesh1, in_specs=P("tp"), out_specs=P()))
  x = _put(mesh1, np.ones((8,), np.float32), P("tp"))
  monkeypatch.setenv("JAXLL_DISABLE", "1")
  with caplog.at_level("WARNING", logger="jaxll"):
    sites = jaxll.explain(f, x)
  assert [s.algorithm for s in sites] == ["xla"]
  assert "oneshot_ll" in sites[0].reason and "ignored" in sites[0].reason
  assert "JAXLL_DISABLE" in caplog.text
  np.testing.assert_array_equal(np.asarray(f(x)), [8.0])
  # off means off
  for off in ("0", "false", "no", "off", ""):
    monkeypatch.setenv("JAXLL_DISABLE", off)
    with pytest.raises(placement.AlgorithmUnavailableError):
      jax.jit(jax.shard_map(lambda v: jaxll.all_reduce(v, "tp", algorithm="oneshot_ll"),
                            mesh=mesh1, in_specs=P("tp"), out_specs=P())).lower(x)


def test_a_workspace_cuda_refuses_is_a_reason_not_a_crash(monkeypatch, caplog):
  # (one process, several GPUs: cudaMalloc or peer access failing while the
  # workspace is built sends the call to XLA, a named kernel raises with why)
  from jaxll import workspace
  gpus = [[types.SimpleNamespace(id=i, platform="gpu", process_index=0, local_hardware_id=i)
           for i in range(2)]]
  monkeypatch.setattr(placement, "ext", types.SimpleNamespace(max_ranks=16))
  monkeypatch.setattr(placement, "_peers_reachable", lambda groups: None)

  def refuse(ordinals, device_ids, **kw):
    raise RuntimeError("allocating the workspace: out of memory")
  monkeypatch.setattr(workspace, "get_workspace", refuse)
  with caplog.at_level("WARNING", logger="jaxll"):
    ws_id, problem = placement.workspace_for_groups(gpus)
  assert ws_id == 0
  assert problem == ("the workspace for GPUs [0, 1] could not be built: allocating the "
                     "workspace: out of memory")
  assert problem in caplog.text
  # a ValueError (a bad setting) is the user's to see, not a fallback
  def bad_setting(ordinals, device_ids, **kw):
    raise ValueError("JAXLL_ON_ERROR must be 'poison' or 'trap'")
  monkeypatch.setattr(workspace, "get_workspace", bad_setting)
  with pytest.raises(ValueError, match="JAXLL_ON_ERROR"):
    placement.workspace_for_groups(gpus)


def test_ll128_atomic_needs_native_peer_atomics_between_a_process_gpus(monkeypatch):
  # (its vector adds land in a peer GPU's memory: over PCIe they are not atomic)
  dev = lambda i, proc=0: types.SimpleNamespace(id=i, platform="gpu", process_index=proc,
                                                 local_hardware_id=i)
  native = {(0, 1): True, (1, 0): True, (0, 2): False, (2, 0): False, (1, 2): True, (2, 1): True}
  asked = []

  def peer_native_atomics(a, b):
    asked.append((a, b))
    return native[(a, b)]
  monkeypatch.setattr(placement, "ext", types.SimpleNamespace(peer_native_atomics=peer_native_atomics))
  assert placement.peer_atomics_problem([[dev(0), dev(1)]]) is None
  problem = placement.peer_atomics_problem([[dev(0), dev(1)], [dev(0), dev(2)]])
  assert problem is not None and "GPU 0" in problem and "GPU 2" in problem and "PCIe" in problem
  # another process's GPUs are not asked about (this process cannot see them)
  asked.clear()
  assert placement.peer_atomics_problem([[dev(0), dev(2, proc=1)]]) is None
  assert asked == []


def test_explain_knows_the_group_size_on_cpu(mesh2):
  f = jax.jit(jax.shard_map(lambda v: (jaxll.all_reduce(v, "tp"), jaxll.all_reduce(v, "dp"),
                                       jaxll.all_reduce(v, ("dp", "tp"))),
                            mesh=mesh2, in_specs=P(("dp", "tp")), out_specs=(P(),) * 3,
                            check_vma=False))
  sites = jaxll.explain(f, _put(mesh2, np.ones((8,), np.float32), P(("dp", "tp"))))
  assert [s.group_size for s in sites] == [4, 2, 8]
