"""Deterministic mode's decisions (docs/determinism.md), on 8 CPU devices and in
the chooser: auto takes a kernel at every size, XLA's path and the atomic
kernel are refused, and a call no kernel serves raises instead of taking XLA's
collective (on CPU every reduction is such a call); a gather chooses as auto."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll
from jaxll import algorithms, choice
from jaxll.placement import AlgorithmUnavailableError


@pytest.fixture
def mesh(mesh1):
  return mesh1


def _sharded(mesh, f, out_specs=P()):
  g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("tp"), out_specs=out_specs))
  return lambda x: g(jax.device_put(x, NamedSharding(mesh, P("tp"))))


def test_request_resolves_the_mode(monkeypatch):
  req = algorithms.deterministic_request
  assert req("f", "auto", None) == "auto"
  assert req("f", "auto", True) == algorithms.DETERMINISTIC
  assert req("f", "twoshot_sentinel", True) == "twoshot_sentinel"
  assert req("f", "xla", False) == "xla"
  with pytest.raises(ValueError, match="'xla' cannot keep deterministic mode"):
    req("f", "xla", True)
  with pytest.raises(ValueError, match="twoshot_ll128_atomic.*vary from run to run"):
    req("f", "twoshot_ll128_atomic", True)
  with pytest.raises(TypeError, match="deterministic must be True, False or None"):
    req("f", "auto", "yes")
  monkeypatch.setenv("JAXLL_DETERMINISTIC", "1")
  assert req("f", "auto", None) == algorithms.DETERMINISTIC
  assert req("f", "auto", False) == "auto"  # (the argument wins over the variable)
  monkeypatch.setenv("JAXLL_DETERMINISTIC", "maybe")
  with pytest.raises(ValueError, match="JAXLL_DETERMINISTIC"):
    req("f", "auto", None)


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
def test_auto_takes_a_kernel_at_every_size(n, dtype):
  dtype = np.dtype(jnp.dtype(dtype))
  limit = choice.auto_max_bytes(n)
  for nbytes in (8, 4096, limit, limit + 16, 64 * limit):
    for op in ("sum", "max", "min"):
      auto, _ = choice.choose_auto(n, nbytes, dtype, op)
      det, why = choice.choose_auto(n, nbytes, dtype, op, deterministic=True)
      assert det in algorithms.KERNELS and algorithms.SPECS[det].reproducible, (nbytes, det)
      assert why.startswith("deterministic:"), why
      if nbytes <= limit:
        assert det == auto  # (below the crossover, auto's own choice)
      else:
        assert auto == algorithms.XLA and "above auto's crossover" in why
  # a group of one device: the input, on every path
  assert choice.choose_auto(1, 4096, dtype, "sum", deterministic=True)[0] == algorithms.XLA


def test_gather_and_scatter_choices():
  limit = choice.auto_max_bytes(4)
  big = 4 * limit
  assert choice.gather_scatter_auto("psum_scatter", 4, big, np.float32)[0] == algorithms.XLA
  kernel, why = choice.gather_scatter_auto("psum_scatter", 4, big, np.float32, deterministic=True)
  assert kernel in ("oneshot_ll", "oneshot_sentinel"), why
  # an all-gather moves bits: the same choice either way
  assert (choice.gather_scatter_auto("all_gather", 4, big, np.float32, deterministic=True)
          == choice.gather_scatter_auto("all_gather", 4, big, np.float32))


def test_reductions_raise_where_no_kernel_serves(mesh, monkeypatch):
  x = jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16)
  f = _sharded(mesh, lambda v: jaxll.all_reduce(v, "tp", deterministic=True))
  with pytest.raises(AlgorithmUnavailableError,
                     match=r"all_reduce\(deterministic=True\) cannot serve.*lowering for cpu"):
    f(x)
  with pytest.raises(ValueError, match="'xla' cannot keep"):
    jaxll.all_reduce(x, "tp", algorithm="xla", deterministic=True)
  g = _sharded(mesh, lambda v: jaxll.psum_scatter(v, "tp", tiled=True, deterministic=True),
               P("tp"))
  with pytest.raises(AlgorithmUnavailableError,
                     match=r"psum_scatter\(deterministic=True\) cannot serve"):
    g(jnp.ones((64, 8)))
  # the variable puts every call in the mode, the gradient's reductions too
  monkeypatch.setenv("JAXLL_DETERMINISTIC", "1")
  h = _sharded(mesh, lambda v: jax.grad(lambda w: jnp.sum(jaxll.all_reduce(w, "tp") ** 2))(v),
               P("tp"))
  with pytest.raises(AlgorithmUnavailableError, match="deterministic=True"):
    h(x)
  routed = jax.jit(jaxll.route(jax.shard_map(lambda v: jax.lax.psum(v, "tp"), mesh=mesh,
                                             in_specs=P("tp"), out_specs=P())))
  with pytest.raises(AlgorithmUnavailableError, match="deterministic=True"):
    routed(jax.device_put(x, NamedSharding(mesh, P("tp"))))
  monkeypatch.setenv("JAXLL_DISABLE", "1")
  for named in ("auto", "oneshot_ll"):
    with pytest.raises(ValueError, match="needs jaxll's kernels, and JAXLL_DISABLE is set"):
      _sharded(mesh, lambda v, a=named: jaxll.all_reduce(v, "tp", algorithm=a))(x)


def test_gather_keeps_auto_and_explains(mesh):
  x = jnp.arange(8 * 4, dtype=jnp.float32).reshape(8, 4)
  def gather(v):
    return jaxll.all_gather(v, "tp", tiled=True, to="invarying", deterministic=True)

  np.testing.assert_array_equal(_sharded(mesh, gather)(x), x)
  g = jax.jit(jax.shard_map(gather, mesh=mesh, in_specs=P("tp"), out_specs=P()))
  (site,) = jaxll.explain(g, jax.device_put(x, NamedSharding(mesh, P("tp"))))
  assert site.algorithm == "xla" and site.requested == algorithms.DETERMINISTIC
  assert site.reason.startswith("deterministic: an all-gather moves bits"), site.reason
  # its transpose, a reduce-scatter, keeps the mode (and the error says whose it is)
  g = _sharded(mesh, lambda v: jax.grad(
      lambda w: jnp.sum(jaxll.all_gather(w, "tp", tiled=True, deterministic=True) ** 2))(v),
      P("tp"))
  with pytest.raises(AlgorithmUnavailableError,
                     match=r"psum_scatter\(deterministic=True\) cannot serve the call at "
                           r"test_determinism_cpu.py:\d+ .*autodiff's transpose of the "
                           r"jaxll.all_gather written there: lowering for cpu"):
    g(x)


def test_fused_never_takes_the_composition(mesh):
  x = jnp.ones((8 * 2, 64), jnp.bfloat16)
  r, w = jnp.ones((2, 64), jnp.bfloat16), jnp.ones((64,), jnp.bfloat16)

  x = jax.device_put(x, NamedSharding(mesh, P("tp")))

  def call(**kw):
    return jax.jit(jax.shard_map(
        lambda a, b, c: jaxll.all_reduce_rmsnorm(a, b, c, "tp", deterministic=True, **kw),
        mesh=mesh, in_specs=(P("tp"), P(), P()), out_specs=(P(), P())))

  with pytest.raises(AlgorithmUnavailableError,
                     match=r"all_reduce_rmsnorm\(deterministic=True\) cannot serve.*fused kernel"):
    call()(x, r, w)
  with pytest.raises(ValueError, match="names the composition"):
    call(algorithm="oneshot_ll")(x, r, w)
  with pytest.raises(ValueError, match="no axis is reduced over"):
    jaxll.all_reduce_rmsnorm(r, r, w, (), deterministic=True)
  # vmap: a batched weight would take the composition
  batched = jax.jit(jax.shard_map(
      jax.vmap(lambda a, b, c: jaxll.all_reduce_rmsnorm(a, b, c, "tp", deterministic=True),
               in_axes=(None, None, 0)),
      mesh=mesh, in_specs=(P("tp"), P(), P()), out_specs=(P(), P())))
  with pytest.raises(ValueError, match="batched weight"):
    batched(x, r, jnp.ones((3, 64), jnp.bfloat16))
