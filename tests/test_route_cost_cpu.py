"""What ``jaxll.route`` costs per call, on 8 CPU devices: after the first call
of a signature a routed step traces nothing, compiles nothing and records no
new jaxll call site, called directly or inside an outer ``jax.jit``, with the
step jitted or not; non-array arguments reach the step as given (a jitted
step's static arguments work); a donating jit keeps its donation; a step with
no collective over mesh axes is said once on the ``jaxll`` logger."""

import contextlib
import enum
import logging
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def _compiles():
  """Counts XLA backend compiles inside the block (a list of one int)."""
  count = [0]

  def listener(event, duration_secs, **kwargs):
    if event == _COMPILE_EVENT:
      count[0] += 1

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield count
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


def _sites_since(before):
  """The call sites jaxll recorded after `before` (an earlier
  ``jaxll.recent_call_sites()``), found by identity: the record keeps the
  latest 1000, so its length stops growing once full."""
  now = jaxll.recent_call_sites()
  last = before[-1] if before else None
  for k in range(len(now)):
    if now[-1 - k] is last:
      return now[len(now) - k:]
  return now


def _put(mesh, x, spec):
  return jax.device_put(x, NamedSharding(mesh, spec))


@pytest.fixture(scope="module")
def auto_mesh(cpu_devices):
  """The 8 CPU devices as one axis, "tp", sharded by jit's partitioner (Auto):
  shard_map takes unsharded inputs."""
  return jax.make_mesh((8,), ("tp",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=cpu_devices)


_SPECS = (P(), P(None, "tp"), P("tp", None))  # x replicated, w_in and w_out split


def _tp_step(mesh, traces):
  """A tensor-parallel MLP's loss and gradients in a shard_map: psum,
  psum_scatter and all_gather written with jax.lax, and those autodiff adds.
  Each trace of the loss appends to `traces`."""
  def loss(x, w_in, w_out):
    traces.append(1)
    a = jnp.tanh(x @ w_in)                                 # column-parallel
    partial = a @ w_out                                    # row-parallel partial sums
    s = jax.lax.psum_scatter(partial, "tp", scatter_dimension=1, tiled=True)
    y = jax.lax.all_gather(s, "tp", axis=1, tiled=True)
    return jnp.sum(y * y) + jnp.sum(jax.lax.psum(partial, "tp"))

  def body(x, w_in, w_out):
    value, grads = jax.value_and_grad(loss, argnums=(0, 1, 2))(x, w_in, w_out)
    return (jax.lax.pmean(value, "tp"),) + grads

  return jax.shard_map(body, mesh=mesh, in_specs=_SPECS, out_specs=(P(),) + _SPECS)


def _tp_args(mesh):
  rng = np.random.default_rng(0)
  return (jnp.asarray(rng.standard_normal((4, 32)), jnp.float32),
          _put(mesh, rng.standard_normal((32, 64)).astype(np.float32), _SPECS[1]),
          _put(mesh, rng.standard_normal((64, 16)).astype(np.float32), _SPECS[2]))


def _assert_bitwise(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("outer_jit", [False, True], ids=["direct", "outer_jit"])
@pytest.mark.parametrize("fun_jit", [False, True], ids=["fun", "jit_fun"])
def test_a_routed_step_traces_and_compiles_once(mesh1, fun_jit, outer_jit):
  args = _tp_args(mesh1)
  want = jax.jit(_tp_step(mesh1, []))(*args)
  traces = []
  step = _tp_step(mesh1, traces)
  routed = jaxll.route(jax.jit(step) if fun_jit else step)
  if outer_jit:
    routed = jax.jit(routed)
  sites = jaxll.recent_call_sites()
  with _compiles() as compiles:
    first = routed(*args)
  assert (len(traces), compiles[0]) == (1, 1)
  # the three collectives, the gradient's (each transposed) and x's psum, pmean's psum
  assert len(_sites_since(sites)) >= 7, _sites_since(sites)
  _assert_bitwise(first, want)
  sites = jaxll.recent_call_sites()
  with _compiles() as compiles:
    for _ in range(3):
      again = routed(*args)
  assert (len(traces), compiles[0]) == (1, 0)
  assert _sites_since(sites) == []
  _assert_bitwise(again, want)
  # new shapes: one trace and one compile more, then the first signature still hits
  bigger = (jnp.concatenate([args[0], args[0]]),) + args[1:]
  with _compiles() as compiles:
    routed(*bigger)
    routed(*bigger)
    routed(*args)
  assert (len(traces), compiles[0]) == (2, 1)


class _Mode(enum.Enum):
  SUM = "sum"
  MAX = "max"


def test_non_array_arguments_reach_fun_as_given(mesh1):
  # a jitted step with static_argnames, called through route with a Python
  # int, an enum, a float, a bool, a string and None: each reaches the step unchanged, a
  # new value is one new trace, a repeated one none; numpy scalars and arrays
  # are traced (new values: no trace)
  seen = []

  def g(x, bias, *, pad_id, mode, scale, exact, name, extra):
    seen.append((type(pad_id), type(mode), type(scale), type(exact), name, extra))
    assert not isinstance(bias, (int, float))
    reduce = jax.lax.psum if mode is _Mode.SUM else jax.lax.pmax
    body = jax.shard_map(lambda v: reduce(v, "tp"), mesh=mesh1, in_specs=P("tp"),
                         out_specs=P())
    return body(x) * scale + pad_id + bias

  f = jax.jit(g, static_argnames=("pad_id", "mode", "scale", "exact", "name"))
  x = _put(mesh1, np.arange(16, dtype=np.float32), P("tp"))
  kwargs = dict(pad_id=0, mode=_Mode.SUM, scale=2.0, exact=True, name="tp", extra=None)
  routed = jaxll.route(f)
  with _compiles() as compiles:
    got = routed(x, np.float32(1), **kwargs)
    assert seen == [(int, _Mode, float, bool, "tp", None)]
    routed(x, np.float32(1), **kwargs)
    routed(x, np.float32(5), **kwargs)              # a numpy scalar is traced
    routed(x, np.full((), 5, np.float32), **kwargs)  # so is a numpy array
  assert len(seen) == 1 and compiles[0] == 1, (seen, compiles)
  _assert_bitwise(got, f(x, np.float32(1), **kwargs))
  for change in (dict(pad_id=7), dict(mode=_Mode.MAX), dict(scale=-0.5), dict(name="dp")):
    _assert_bitwise(routed(x, np.float32(1), **dict(kwargs, **change)),
                    f(x, np.float32(1), **dict(kwargs, **change)))
  with _compiles() as compiles:
    routed(x, np.float32(1), **kwargs)
  assert compiles[0] == 0


def test_static_arguments_are_keyed_by_type_and_value(mesh1):
  # a function that is not jitted takes what jax.jit cannot: an unhashable
  # configuration object (keyed by identity), and strings; -0.0 and 0.0, 1
  # and 1.0 are different signatures
  seen = []
  psum = jax.shard_map(lambda v: jax.lax.psum(v, "tp"), mesh=mesh1, in_specs=P("tp"),
                       out_specs=P())

  def f(x, scale, config, name):
    seen.append((scale, config.n, name))
    return psum(x) * scale * config.n

  routed = jaxll.route(f)
  config = types.SimpleNamespace(n=3)
  x = _put(mesh1, np.arange(16, dtype=np.float32), P("tp"))
  for scale in (0.0, -0.0, 1, 1.0, 0.0, 1):
    got = routed(x, scale, config, "a")
    np.testing.assert_array_equal(np.asarray(got), np.asarray(psum(x)) * scale * 3)
  assert [repr(s) for s, _, _ in seen] == ["0.0", "-0.0", "1", "1.0"]
  routed(x, 1, types.SimpleNamespace(n=3), "a")  # another object
  routed(x, 1, config, "b")
  assert len(seen) == 6
  routed(x, 1, config, "a")
  assert len(seen) == 6


def test_pytrees_and_keyword_arrays_match_the_unrouted_step(auto_mesh):
  # dicts and tuples in and out, arrays passed by keyword, numpy arrays,
  # weak-typed scalars, and an output that is not an array of the step
  def f(tree, *, w, offset):
    body = jax.shard_map(lambda a, b: (jax.lax.psum(a, "tp"),
                                       jax.lax.all_gather(b, "tp", tiled=True,
                                                          to="invarying")),
                         mesh=auto_mesh, in_specs=(P("tp"), P("tp")),
                         out_specs=(P(), P()))
    s, g = body(tree["a"], tree["b"][0])
    return {"sum": s * w + offset, "gathered": (g, tree["b"][1]), "none": None}

  tree = {"a": _put(auto_mesh, np.arange(8.0, dtype=np.float32), P("tp")),
          "b": (np.arange(16, dtype=np.int32), jnp.asarray(2.0))}  # (weakly typed)
  w = np.float32(3.0)
  want = jax.jit(f)(tree, w=w, offset=jnp.asarray(1.0))
  for routed in (jaxll.route(f), jax.jit(jaxll.route(f)), jaxll.route(jax.jit(f))):
    _assert_bitwise(routed(tree, w=w, offset=jnp.asarray(1.0)), want)
  got = jaxll.route(f)(tree, w=w, offset=jnp.asarray(1.0))
  assert got["gathered"][1].weak_type and got["none"] is None


def test_a_donating_jit_keeps_its_donation(mesh1):
  def g(x, y):
    s = jax.shard_map(lambda v: jax.lax.psum(v, "tp"), mesh=mesh1, in_specs=P("tp"),
                      out_specs=P())(y)
    return x * 2 + s[0]

  f = jax.jit(g, donate_argnums=0)
  y = _put(mesh1, np.ones(16, np.float32), P("tp"))
  x = jnp.arange(4.0)
  want = f(x, y)
  assert x.is_deleted()  # (the unrouted step donates x on this backend)
  routed = jaxll.route(f)
  for _ in range(2):
    x = jnp.arange(4.0)
    _assert_bitwise(routed(x, y), want)
    assert x.is_deleted() and not y.is_deleted()
  # a step that does not donate keeps its inputs
  x = jnp.arange(4.0)
  jaxll.route(jax.jit(g))(x, y)
  assert not x.is_deleted()
  # a function whose donation depends on the shapes: each call donates as the
  # jit it calls does
  keeps = jax.jit(g)
  by_shape = jaxll.route(lambda x, y: (f if x.shape[0] > 4 else keeps)(x, y))
  for n, donated in ((4, False), (8, True), (4, False), (8, True)):
    x = jnp.arange(float(n))
    _assert_bitwise(by_shape(x, y), jnp.arange(float(n)) * 2 + 8)
    assert x.is_deleted() == donated, n


def test_closures_over_an_outer_trace_and_failed_traces(auto_mesh):
  # route called on constants under an outer jit, its function closing over
  # the outer tracer: every outer call sees its own value
  psum = jax.shard_map(lambda v: jax.lax.psum(v, "tp"), mesh=auto_mesh, in_specs=P("tp"),
                       out_specs=P())
  ones = np.ones(8, np.float32)

  @jax.jit
  def outer(c):
    return jaxll.route(lambda v: psum(v) * c)(ones)

  for c in (1.0, 2.0, 3.0):
    np.testing.assert_array_equal(np.asarray(outer(jnp.float32(c))), [8.0 * c])
  # and on constants without such a closure: its own jit, nested in the outer one
  routed_psum = jaxll.route(psum)

  @jax.jit
  def shifted(c):
    return routed_psum(ones) + c

  for c in (1.0, 2.0):
    np.testing.assert_array_equal(np.asarray(shifted(jnp.float32(c))), [8.0 + c])
  # a trace that raises leaves nothing behind: the next call traces again
  failing = [True]
  calls = []

  def fragile(v):
    calls.append(1)
    if failing[0]:
      raise RuntimeError("not yet")
    return psum(v)

  routed = jaxll.route(fragile)
  x = _put(auto_mesh, ones, P("tp"))
  with pytest.raises(RuntimeError, match="not yet"):
    routed(x)
  failing[0] = False
  np.testing.assert_array_equal(np.asarray(routed(x)), [8.0])
  routed(x)
  assert len(calls) == 2


def test_the_deterministic_request_is_part_of_the_signature(mesh1, monkeypatch):
  gather = jaxll.route(jax.shard_map(
      lambda v: jax.lax.all_gather(v, "tp", tiled=True, to="invarying"), mesh=mesh1,
      in_specs=P("tp"), out_specs=P()))
  x = _put(mesh1, np.arange(16, dtype=np.float32), P("tp"))
  sites = jaxll.recent_call_sites()
  gather(x)
  assert [s.requested for s in _sites_since(sites)] == ["auto"]
  monkeypatch.setenv("JAXLL_DETERMINISTIC", "1")
  sites = jaxll.recent_call_sites()
  gather(x)
  assert [s.requested for s in _sites_since(sites)] == ["deterministic"]
  monkeypatch.delenv("JAXLL_DETERMINISTIC")
  sites = jaxll.recent_call_sites()
  gather(x)
  assert _sites_since(sites) == []  # the first signature, compiled


def _route_records(caplog, level):
  return [r for r in caplog.records if r.name == "jaxll" and r.levelno == level
          and r.getMessage().startswith("jaxll.route(")]


def test_a_step_without_collectives_is_said_once(auto_mesh, caplog):
  # sharded by annotations alone: jit's partitioner adds its collectives after
  # tracing, jaxll sees none, and route says so once, whatever the calls
  caplog.set_level(logging.INFO, logger="jaxll")
  sharding = NamedSharding(auto_mesh, P("tp"))

  def annotated(x):
    return jnp.sum(jax.lax.with_sharding_constraint(x * 2, sharding))

  routed = jaxll.route(annotated)
  x = jax.device_put(np.arange(16, dtype=np.float32), sharding)
  routed(x)
  routed(x)
  routed(jax.device_put(np.arange(32, dtype=np.float32), sharding))  # a new trace
  jax.jit(routed)(x)
  (warning,) = _route_records(caplog, logging.WARNING)
  text = warning.getMessage()
  assert "annotated" in text and "no collective over mesh axes" in text
  assert "partitioner" in text and "shard_map" in text
  assert "What jaxll can and cannot serve" in text
  # a step with a routed collective: no warning; one left alone: said once at INFO
  caplog.clear()
  step = jaxll.route(jax.shard_map(
      lambda v: (jax.lax.psum(v, "tp"), jax.lax.all_gather(v, "tp", tiled=True, to="invarying"),
                 jax.lax.ppermute(v, "tp", [(i, (i + 1) % 8) for i in range(8)])),
      mesh=auto_mesh, in_specs=P("tp"), out_specs=(P(), P(), P("tp"))),
      collectives=("psum",))
  step(x)
  step(x)
  step(jax.device_put(np.arange(32, dtype=np.float32), sharding))
  assert _route_records(caplog, logging.WARNING) == []
  (info,) = _route_records(caplog, logging.INFO)
  text = info.getMessage()
  assert "all_gather_invariant: 'all_gather' is not in collectives=" in text, text
  assert "ppermute: 'ppermute' is not in collectives=" in text, text
