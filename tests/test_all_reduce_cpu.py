"""CPU tier: jaxll.all_reduce against lax.psum/pmax/pmin on 8 virtual CPU devices.

On CPU every call lowers to XLA's all-reduce, so these tests pin down the
JAX-level behaviour (results, check_vma typing, grad, vmap, multi-axis meshes,
many call sites, errors, path reporting) independently of the kernels.
"""

import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll
from jaxll import algorithms, lowering

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
  with pytest.raises(NameError, match=r"jaxll.all_reduce: unknown axis name 'tp'.*shard_map"):
    jax.jit(lambda v: jaxll.all_reduce(v, "tp"))(jnp.ones(3))


def test_unknown_axis(mesh1):
  f = jax.shard_map(lambda v: jaxll.all_reduce(v, "dp"), mesh=mesh1, in_specs=P("tp"),
                    out_specs=P())
  with pytest.raises(NameError, match="unknown axis name 'dp'"):
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
  import jaxll.testing
  with pytest.raises(RuntimeError, match="need a CUDA GPU|without its CUDA kernels"):
    jaxll.testing.virtual_all_reduce(np.ones((2, 3), np.float32))


def test_virtual_one_launch_runs_every_rank():
  # one launch holds every rank's blocks: a skipped rank (fault injection) is
  # refused before any GPU is looked for
  import jaxll.testing
  with pytest.raises(ValueError, match="one_launch runs every rank"):
    jaxll.testing.virtual_all_reduce(np.ones((2, 3), np.float32), one_launch=True, _skip_rank=1)


@pytest.mark.parametrize("one_launch", [False, True])
@pytest.mark.parametrize("command_buffer", [False, True])
def test_virtual_calls_lower_with_their_attributes(monkeypatch, one_launch, command_buffer):
  # the virtual all-reduce and fused calls lowered for CUDA (no GPU: the
  # workspace lookup stood in for): one_launch reaches the custom call as the
  # 64-bit integer the FFI handlers declare, beside the other attributes
  import jaxll.testing as jt
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


def _kernel_call_chains(text: str) -> list[list[tuple[str, str]]]:
  """(result, order operand) of each jaxll_all_reduce custom call in the
  lowered text, grouped into chains: a call whose order operand is the order
  result (#1) of an earlier call continues that call's chain."""
  calls = re.findall(r"(%[\w]+):2 = stablehlo\.custom_call @jaxll_all_reduce\((%[\w#]+), (%[\w#]+)\)",
                     text)
  chains, tail = [], {}
  for result, _, order in calls:
    if order in tail:
      chain = tail.pop(order)
    else:
      chain = []
      chains.append(chain)
    chain.append((result, order))
    tail[f"{result}#1"] = chain
  return chains


def test_kernel_calls_are_chained_in_program_order(mesh1, monkeypatch):
  # Every kernel call reads and advances the workspace's epochs, so the calls of
  # one block take and return an order buffer that chains them in program order
  # (XLA may otherwise reorder independent calls, or run them side by side in a
  # concurrent command buffer). Lowering only: CPU cannot run the kernels, so the
  # path decision is forced to a kernel here.
  monkeypatch.setattr(lowering, "decide", lambda ctx, aval, axes, op, requested:
                      lowering.Decision("oneshot_ll", "forced by the test", 7, 8))

  def body(a, b):
    outs = [jaxll.all_reduce(a, "tp"), jaxll.all_reduce(b, "tp"), jaxll.all_reduce(a * 2, "tp")]
    loop = jax.lax.fori_loop(0, 3, lambda i, v: jaxll.all_reduce(jaxll.all_reduce(v, "tp"), "tp"), b)
    return (*outs, loop, jaxll.all_reduce(b * 3, "tp"))

  f = jax.jit(jax.shard_map(body, mesh=mesh1, in_specs=(P("tp"), P("tp")),
                            out_specs=(P(),) * 5, check_vma=False))
  x = _put(mesh1, np.ones((8,), np.float32), P("tp"))
  text = f.lower(x, x).as_text()
  chains = _kernel_call_chains(text)
  # the first three calls of the function body form one chain, in program
  # order; the loop body's two calls their own; the call after the loop
  # continues the first chain through a join with the loop (see
  # test_kernel_calls_stay_ordered_across_loops_and_conditionals)
  assert sorted(len(c) for c in chains) == [1, 2, 3], chains
  # the body's chain starts at the program's host check (which runs first), the
  # loop body's and the call after the loop at a join (a custom call XLA keeps,
  # unlike an optimization barrier, which it removes after scheduling)
  starts = {}
  for chain in chains:
    first = re.escape(chain[0][1].split("#")[0])
    if re.search(rf"{first} = stablehlo\.custom_call @jaxll_check", text):
      starts[len(chain)] = "check"
    elif re.search(rf"{first} = stablehlo\.custom_call @jaxll_join", text):
      starts[len(chain)] = "join"
  assert starts == {3: "check", 2: "join", 1: "join"}, (starts, chains)
  assert "optimization_barrier" not in text
  assert text.count("@jaxll_all_reduce(") == 6


def _top_level_deps(text: str):
  """(ops, deps) of the block that holds the host check (the shard_map body) in
  lowered text: ops is [(result, op name)] in program order, deps maps a
  result name to the names it uses directly (for a loop or conditional: its
  operands)."""
  lines = text.splitlines()
  start = next(i for i, line in enumerate(lines) if "@jaxll_check" in line)
  indent = len(lines[start]) - len(lines[start].lstrip())
  ops, deps = [], {}
  for line in lines[start:]:
    here = len(line) - len(line.lstrip())
    if line.strip() and here < indent:
      break
    m = re.match(r"(%[\w]+)(?::\d+)? = \"?([\w.]+)\"?(.*)", line.strip())
    if here != indent or not m:
      continue
    result, name, rest = m.groups()
    rest = rest.split(" : ", 1)[0] if name != "stablehlo.while" else rest.split(")", 1)[0]
    if name == "stablehlo.custom_call":
      name = "call " + re.match(r" @(\w+)", rest).group(1)
    ops.append((result, name))
    deps[result] = {u.split("#")[0] for u in re.findall(r"%[\w]+(?:#\d+)?", rest)}
  return ops, deps


def _reaches(deps, start, target) -> bool:
  seen, todo = set(), [start]
  while todo:
    v = todo.pop()
    if v == target:
      return True
    if v not in seen:
      seen.add(v)
      todo.extend(deps.get(v, ()))
  return False


def test_kernel_calls_stay_ordered_across_loops_and_conditionals(mesh1, monkeypatch):
  # A loop or conditional that holds kernel calls (JAX often outlines a loop
  # body into a function called with func.call) must run after the calls before
  # it and before the calls after it: the conjugate-gradient pattern (a dot
  # product, the iteration loop, a norm after it) otherwise lets XLA run the
  # norm before or beside the loop.
  monkeypatch.setattr(lowering, "decide", lambda ctx, aval, axes, op, requested:
                      lowering.Decision("oneshot_ll", "forced by the test", 7, 8))

  def ar(v):
    return jaxll.all_reduce(v, "tp")

  def body(a, b):
    c1 = ar(a)
    loop = jax.lax.fori_loop(0, 3, lambda i, v: ar(ar(v)), b)
    c2 = ar(b * 2)
    branch = jax.lax.cond(a[0] > 0, lambda v: ar(v) + 1, lambda v: ar(v * 2), b)
    scanned, _ = jax.lax.scan(lambda c, x: (ar(c) + x, None), b, jnp.ones((2,) + b.shape))
    c3 = ar(a * 3)
    return c1, loop, c2, branch, scanned, c3

  f = jax.jit(jax.shard_map(body, mesh=mesh1, in_specs=(P("tp"), P("tp")),
                            out_specs=(P(),) * 6, check_vma=False))
  x = _put(mesh1, np.ones((8,), np.float32), P("tp"))
  text = f.lower(x, x).as_text()
  ops, deps = _top_level_deps(text)
  holders = [r for r, name in ops
             if name in ("call jaxll_all_reduce", "stablehlo.while", "stablehlo.case")]
  kinds = [dict(ops)[r] for r in holders]
  assert kinds == ["call jaxll_all_reduce", "stablehlo.while", "call jaxll_all_reduce",
                   "stablehlo.case", "stablehlo.while", "call jaxll_all_reduce"], kinds
  for before, after in zip(holders, holders[1:]):
    assert _reaches(deps, after, before), (after, "does not depend on", before)
  # each outlined loop body starts its chain after the body's arguments
  for fn in re.findall(r"func\.func private @(closed_call\w*)\(", text):
    fbody = text.split(f"func.func private @{fn}(", 1)[1].split("\n  }", 1)[0]
    first = re.search(r"@jaxll_all_reduce\((%[\w#]+), (%[\w#]+)\)", fbody).group(2)
    assert re.search(rf"{first.split('#')[0]} = stablehlo\.custom_call @jaxll_join\(%c, %arg0",
                     fbody), fbody
  # a join that stands for an operand of a loop or conditional aliases it (no
  # copy); one that makes an order value does not
  joins = re.findall(r"stablehlo\.custom_call @jaxll_join\(([^)]*)\)([^\n]*)", text)
  assert joins and "optimization_barrier" not in text
  aliased = [rest for _, rest in joins if "output_operand_aliases" in rest]
  assert aliased and len(aliased) < len(joins), joins


def test_program_starts_with_one_host_check_of_every_workspace(mesh1, monkeypatch):
  # XLA replays command buffers without calling jaxll, so a program with kernel
  # calls starts with one host-only jaxll_check that lists every workspace its
  # calls use (it fails the run if one holds an error or was freed). Lowering
  # only, as above: two call sites forced onto workspaces 7 and 9, one of them
  # inside a loop.
  ids = iter([7, 9, 7, 9])
  monkeypatch.setattr(lowering, "decide", lambda ctx, aval, axes, op, requested:
                      lowering.Decision("oneshot_ll", "forced by the test", next(ids), 8))

  def body(a):
    a = jaxll.all_reduce(a, "tp")
    a = jax.lax.fori_loop(0, 2, lambda i, v: jaxll.all_reduce(v, "tp"), a)
    return jaxll.all_reduce(jaxll.all_reduce(a, "tp"), "tp")

  f = jax.jit(jax.shard_map(body, mesh=mesh1, in_specs=P("tp"), out_specs=P(),
                            check_vma=False))
  text = f.lower(_put(mesh1, np.ones((8,), np.float32), P("tp"))).as_text()
  checks = re.findall(r"stablehlo\.custom_call @jaxll_check\(\).*", text)
  assert len(checks) == 1, checks
  assert "has_side_effect = true" in checks[0]
  assert re.search(r"workspaces = dense<\[7, 9\]> : tensor<2xi64>", checks[0]), checks[0]
  # it comes first in the shard_map body, outside the loop
  assert text.index("@jaxll_check") < text.index("@jaxll_all_reduce")
  assert text.index("@jaxll_check") < text.index("stablehlo.while")
  # and its result starts the order chain of the body's calls, so it runs first
  name = re.search(r"(%[\w#]+) = stablehlo\.custom_call @jaxll_check", text).group(1)
  first = re.search(r"stablehlo\.custom_call @jaxll_all_reduce\(([^)]*)\)", text).group(1)
  assert first.split(", ")[1] == name, (first, name)


def test_no_host_check_without_kernel_calls(mesh1):
  f = jax.jit(jax.shard_map(lambda a: jaxll.all_reduce(a, "tp"), mesh=mesh1, in_specs=P("tp"),
                            out_specs=P(), check_vma=False))
  assert "jaxll_check" not in f.lower(_put(mesh1, np.ones((8,), np.float32), P("tp"))).as_text()


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
    with pytest.raises(lowering.AlgorithmUnavailableError):
      jax.jit(jax.shard_map(lambda v: jaxll.all_reduce(v, "tp", algorithm="oneshot_ll"),
                            mesh=mesh1, in_specs=P("tp"), out_specs=P())).lower(x)


def test_a_workspace_cuda_refuses_is_a_reason_not_a_crash(monkeypatch, caplog):
  # (one process, several GPUs: cudaMalloc or peer access failing while the
  # workspace is built sends the call to XLA, a named kernel raises with why)
  from jaxll import workspace
  gpus = [[types.SimpleNamespace(id=i, platform="gpu", process_index=0, local_hardware_id=i)
           for i in range(2)]]
  monkeypatch.setattr(lowering, "ext", types.SimpleNamespace(max_ranks=16))
  monkeypatch.setattr(lowering, "_peers_reachable", lambda groups: None)

  def refuse(ordinals, device_ids, **kw):
    raise RuntimeError("allocating the workspace: out of memory")
  monkeypatch.setattr(workspace, "get_workspace", refuse)
  with caplog.at_level("WARNING", logger="jaxll"):
    ws_id, problem = lowering._workspace_for_groups(gpus)
  assert ws_id == 0
  assert problem == ("the workspace for GPUs [0, 1] could not be built: allocating the "
                     "workspace: out of memory")
  assert problem in caplog.text
  # a ValueError (a bad setting) is the user's to see, not a fallback
  def bad_setting(ordinals, device_ids, **kw):
    raise ValueError("JAXLL_ON_ERROR must be 'poison' or 'trap'")
  monkeypatch.setattr(workspace, "get_workspace", bad_setting)
  with pytest.raises(ValueError, match="JAXLL_ON_ERROR"):
    lowering._workspace_for_groups(gpus)


def test_ll128_atomic_needs_native_peer_atomics_between_a_process_gpus(monkeypatch):
  # (its vector adds land in a peer GPU's memory: over PCIe they are not atomic)
  dev = lambda i, proc=0: types.SimpleNamespace(id=i, platform="gpu", process_index=proc,
                                                 local_hardware_id=i)
  native = {(0, 1): True, (1, 0): True, (0, 2): False, (2, 0): False, (1, 2): True, (2, 1): True}
  asked = []

  def peer_native_atomics(a, b):
    asked.append((a, b))
    return native[(a, b)]
  monkeypatch.setattr(lowering, "ext", types.SimpleNamespace(peer_native_atomics=peer_native_atomics))
  assert lowering._peer_atomics([[dev(0), dev(1)]]) is None
  problem = lowering._peer_atomics([[dev(0), dev(1)], [dev(0), dev(2)]])
  assert problem is not None and "GPU 0" in problem and "GPU 2" in problem and "PCIe" in problem
  # another process's GPUs are not asked about (this process cannot see them)
  asked.clear()
  assert lowering._peer_atomics([[dev(0), dev(2, proc=1)]]) is None
  assert asked == []


def test_explain_knows_the_group_size_on_cpu(mesh2):
  f = jax.jit(jax.shard_map(lambda v: (jaxll.all_reduce(v, "tp"), jaxll.all_reduce(v, "dp"),
                                       jaxll.all_reduce(v, ("dp", "tp"))),
                            mesh=mesh2, in_specs=P(("dp", "tp")), out_specs=(P(),) * 3,
                            check_vma=False))
  sites = jaxll.explain(f, _put(mesh2, np.ones((8,), np.float32), P(("dp", "tp"))))
  assert [s.group_size for s in sites] == [4, 2, 8]


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
