"""CPU tier: jaxll.all_gather and jaxll.psum_scatter against jax.lax.all_gather and
jax.lax.psum_scatter on 8 virtual CPU devices: values (bitwise), shapes, dtypes,
check_vma types, grad (each the other's transpose), vmap, multi-axis names,
errors and path reporting. On CPU every call lowers to XLA's collective.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll
from jaxll import gather_scatter


def _put(mesh, x, spec):
  return jax.device_put(x, NamedSharding(mesh, spec))


def _random(shape, dtype, seed=0):
  rng = np.random.default_rng(seed)
  if jnp.issubdtype(dtype, jnp.integer):
    return rng.integers(-50, 50, size=shape).astype(dtype)
  return rng.standard_normal(shape).astype(dtype)


def _pair(mesh, ours, ref, x, in_spec, out_spec, check_vma=True):
  run = lambda body: jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_spec,
                                           out_specs=out_spec, check_vma=check_vma))
  xs = _put(mesh, x, in_spec)
  return run(ours)(xs), run(ref)(xs)


def _same(a, b):
  assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
  np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32, jnp.int8])
@pytest.mark.parametrize("axis,tiled", [(0, False), (1, False), (-1, False), (2, False),
                                        (0, True), (1, True), (-1, True)])
@pytest.mark.parametrize("check_vma", [True, False])
def test_all_gather_matches_lax(mesh1, dtype, axis, tiled, check_vma):
  x = _random((8 * 3, 5), dtype, seed=1)
  got, want = _pair(mesh1, lambda v: jaxll.all_gather(v, "tp", axis=axis, tiled=tiled),
                    lambda v: jax.lax.all_gather(v, "tp", axis=axis, tiled=tiled),
                    x, P("tp"), P("tp"), check_vma)
  _same(got, want)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32])
@pytest.mark.parametrize("dim,tiled,shape", [(0, False, (8 * 8, 3)), (1, False, (8 * 2, 8)),
                                             (0, True, (8 * 16, 3)), (1, True, (8 * 2, 24)),
                                             (-1, True, (8 * 2, 16))])
@pytest.mark.parametrize("check_vma", [True, False])
def test_psum_scatter_matches_lax(mesh1, dtype, dim, tiled, shape, check_vma):
  x = _random(shape, dtype, seed=2)
  # (jax.lax.psum_scatter does not take a negative dimension: jaxll does)
  got, want = _pair(
      mesh1, lambda v: jaxll.psum_scatter(v, "tp", scatter_dimension=dim, tiled=tiled),
      lambda v: jax.lax.psum_scatter(v, "tp", scatter_dimension=dim % 2, tiled=tiled),
      x, P("tp"), P("tp"), check_vma)
  _same(got, want)


@pytest.mark.parametrize("axes", ["tp", "dp", ("dp", "tp"), ("tp", "dp")])
def test_several_axis_names(mesh2, axes):
  x = _random((8 * 8, 3), np.float32, seed=3)
  spec = P(("dp", "tp"))
  got, want = _pair(mesh2, lambda v: jaxll.all_gather(v, axes, tiled=True),
                    lambda v: jax.lax.all_gather(v, axes, tiled=True), x, spec, spec)
  _same(got, want)
  got, want = _pair(mesh2, lambda v: jaxll.psum_scatter(v, axes, tiled=True),
                    lambda v: jax.lax.psum_scatter(v, axes, tiled=True), x, spec, spec)
  _same(got, want)


@pytest.mark.parametrize("check_vma", [True, False])
def test_types_match_lax(mesh2, check_vma):
  types = {}

  def body(v):
    c = jnp.ones((8, 3), jnp.float32)  # invariant: the collective inserts pvary, as lax's does
    for name, w in (("varying", v), ("invariant", c)):
      types["ag", name] = (jax.typeof(jaxll.all_gather(w, "tp")),
                           jax.typeof(jax.lax.all_gather(w, "tp")))
      types["ps", name] = (jax.typeof(jaxll.psum_scatter(w, "tp", tiled=True)),
                           jax.typeof(jax.lax.psum_scatter(w, "tp", tiled=True)))
    return v

  f = jax.jit(jax.shard_map(body, mesh=mesh2, in_specs=P(("dp", "tp")),
                            out_specs=P(("dp", "tp")), check_vma=check_vma))
  f(_put(mesh2, np.ones((8 * 8, 3), np.float32), P(("dp", "tp"))))
  for key, (ours, ref) in types.items():
    assert ours == ref, (key, ours, ref)


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("tiled", [False, True])
def test_grad_matches_lax(mesh1, check_vma, tiled):
  # each is the other's transpose: a loss through both collectives
  x = _random((8 * 8, 3), np.float32, seed=4)

  def loss(gather, scatter):
    def per_device(v):
      g = gather(v, "tp", axis=0, tiled=tiled)
      s = scatter(jnp.sin(g) if tiled else jnp.sin(g).reshape(8, -1, 3), "tp",
                  scatter_dimension=0, tiled=tiled)
      return jnp.sum(s * s, keepdims=True)[None] if s.ndim == 2 else jnp.sum(s * s)[None, None]
    sm = jax.shard_map(per_device, mesh=mesh1, in_specs=P("tp"), out_specs=P("tp"),
                       check_vma=check_vma)
    return lambda v: jnp.sum(sm(v))

  xs = _put(mesh1, x, P("tp"))
  with jax.set_mesh(mesh1):
    ours = jax.jit(jax.grad(loss(jaxll.all_gather, jaxll.psum_scatter)))(xs)
    ref = jax.jit(jax.grad(loss(jax.lax.all_gather, jax.lax.psum_scatter)))(xs)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), rtol=1e-5, atol=1e-6)


def test_backward_pass_goes_through_jaxll(mesh1):
  # the transposes are jaxll's primitives (so kernels will serve the backward pass)
  def per_device(v):
    return jaxll.psum_scatter(jaxll.all_gather(v, "tp", tiled=True) ** 2, "tp", tiled=True)

  sm = jax.shard_map(per_device, mesh=mesh1, in_specs=P("tp"), out_specs=P("tp"))
  with jax.set_mesh(mesh1):
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda v: jnp.sum(sm(v))))(
        _put(mesh1, np.ones((8, 3), np.float32), P("tp"))))
  assert jaxpr.count("jaxll_all_gather") >= 2 and jaxpr.count("jaxll_psum_scatter") >= 2, jaxpr
  assert "all_gather[" not in jaxpr.replace("jaxll_all_gather[", "")


def test_vmap_inside_shard_map(mesh1):
  # per device (2, 8, 8); the batch dimension at 0 or 1, before or after the collective's
  x = _random((8 * 2, 8, 8), np.float32, seed=5)
  for in_axes in (0, 1):
    for axis, tiled in ((0, False), (1, False), (0, True), (1, True)):
      got, want = _pair(
          mesh1, lambda v: jax.vmap(lambda r: jaxll.all_gather(r, "tp", axis=axis, tiled=tiled),
                                    in_axes=in_axes)(v),
          lambda v: jax.vmap(lambda r: jax.lax.all_gather(r, "tp", axis=axis, tiled=tiled),
                             in_axes=in_axes)(v), x, P("tp"), P("tp"))
      _same(got, want)
    for dim, tiled in ((1, False), (1, True)) + (((0, True),) if in_axes == 0 else ()):
      got, want = _pair(
          mesh1, lambda v: jax.vmap(lambda r: jaxll.psum_scatter(
              r, "tp", scatter_dimension=dim, tiled=tiled), in_axes=in_axes)(v),
          lambda v: jax.vmap(lambda r: jax.lax.psum_scatter(
              r, "tp", scatter_dimension=dim, tiled=tiled), in_axes=in_axes)(v),
          x, P("tp"), P("tp"))
      _same(got, want)


@pytest.mark.parametrize("tiled", [False, True])
def test_vmap_axis_is_the_collective_axis(tiled):
  # outside shard_map, a collective over the vmapped axis name, as jax.lax defines it
  x = _random((8, 8, 3), np.float32, seed=6)
  for fn, ref in ((lambda r: jaxll.all_gather(r, "b", tiled=tiled),
                   lambda r: jax.lax.all_gather(r, "b", tiled=tiled)),
                  (lambda r: jaxll.psum_scatter(r, "b", tiled=tiled),
                   lambda r: jax.lax.psum_scatter(r, "b", tiled=tiled))):
    got = jax.vmap(fn, axis_name="b")(x)
    want = jax.vmap(ref, axis_name="b")(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def test_pytrees_and_empty_axes(mesh1):
  x = _random((8 * 2, 3), np.float32, seed=7)
  got, want = _pair(mesh1, lambda v: jaxll.all_gather({"a": v, "b": (v * 2,)}, "tp")["b"][0],
                    lambda v: jax.lax.all_gather(v * 2, "tp"), x, P("tp"), P("tp"))
  _same(got, want)
  got, _ = _pair(mesh1, lambda v: jaxll.psum_scatter(v, ()), lambda v: v, x, P("tp"), P("tp"))
  np.testing.assert_array_equal(np.asarray(got), x)


def test_errors(mesh1):
  f = lambda body: jax.jit(jax.shard_map(body, mesh=mesh1, in_specs=P("tp"),
                                         out_specs=P("tp")))
  xs = _put(mesh1, np.ones((8 * 3, 5), np.float32), P("tp"))
  with pytest.raises(TypeError, match="named mesh axes"):
    f(lambda v: jaxll.all_gather(v, 0))(xs)
  with pytest.raises(NameError, match="unknown axis name 'nope'"):
    f(lambda v: jaxll.psum_scatter(v, "nope"))(xs)
  with pytest.raises(ValueError, match="out of range"):
    f(lambda v: jaxll.all_gather(v, "tp", axis=3))(xs)
  with pytest.raises(ValueError, match="must be divisible|must match"):
    f(lambda v: jaxll.psum_scatter(v, "tp", scatter_dimension=1, tiled=True))(xs)
  with pytest.raises(ValueError, match="algorithm must be one of"):
    f(lambda v: jaxll.all_gather(v, "tp", algorithm="twoshot_ll"))(xs)
  # a kernel asked for where none can serve (here: CPU) is an error, as for all_reduce
  with pytest.raises(jaxll.AlgorithmUnavailableError, match="run on CUDA GPUs"):
    f(lambda v: jaxll.all_gather(v, "tp", algorithm="oneshot_ll"))(xs)
  with pytest.raises(jaxll.AlgorithmUnavailableError, match="run on CUDA GPUs"):
    f(lambda v: jaxll.psum_scatter(v, "tp", tiled=True, algorithm="oneshot_barrier"))(
        _put(mesh1, np.ones((8 * 8, 5), np.float32), P("tp")))


def test_disable_sends_even_a_named_kernel_to_xla(mesh1, monkeypatch, caplog):
  # JAXLL_DISABLE is the switch for every call, as for all_reduce: a named
  # kernel goes to XLA's collective with a warning naming the call site
  x = _put(mesh1, np.arange(8 * 8 * 3, dtype=np.float32).reshape(8 * 8, 3), P("tp"))

  def make():  # (a new function each time: a jit cache hit would not lower again)
    return lambda v: jax.shard_map(
        lambda a: jaxll.psum_scatter(jaxll.all_gather(a, "tp", tiled=True, algorithm="oneshot_ll"),
                                     "tp", tiled=True, algorithm="oneshot_sentinel"),
        mesh=mesh1, in_specs=P("tp"), out_specs=P("tp"))(v)

  step = make()
  monkeypatch.setenv("JAXLL_DISABLE", "1")
  with caplog.at_level("WARNING", logger="jaxll"):
    sites = {s.op: s for s in jaxll.explain(step, x)}
  assert set(sites) == {"all_gather", "psum_scatter"}, sites
  for s in sites.values():
    assert s.algorithm == "xla" and "JAXLL_DISABLE" in s.reason and "ignored" in s.reason, s
  assert caplog.text.count("JAXLL_DISABLE") == 2, caplog.text
  np.testing.assert_array_equal(np.asarray(jax.jit(step)(x)), 8 * np.asarray(x))
  monkeypatch.setenv("JAXLL_DISABLE", "0")  # (off: the named kernel is an error on CPU again)
  with pytest.raises(jaxll.AlgorithmUnavailableError, match="run on CUDA GPUs"):
    jax.jit(make()).lower(x)


def test_explain_reports_the_xla_path(mesh1):
  x = _put(mesh1, np.ones((8 * 8, 2), np.float32), P("tp"))

  def step(v):
    return jax.shard_map(lambda a: jaxll.psum_scatter(jaxll.all_gather(a, "tp", tiled=True),
                                                      "tp", tiled=True),
                         mesh=mesh1, in_specs=P("tp"), out_specs=P("tp"))(v)

  sites = {s.op: s for s in jaxll.explain(step, x)}
  assert set(sites) == {"all_gather", "psum_scatter"}, sites
  for op, s in sites.items():
    assert s.algorithm == "xla" and s.group_size == 8 and s.axes == "tp", s
    assert s.reason.startswith("lowering for cpu") and "jaxll kernels run on CUDA GPUs" in s.reason, s


@pytest.mark.parametrize("op,shape,dtype,group,want", [
    ("all_gather", (64,), np.float32, 8, "oneshot_ll"),       # 8 x 256 B gathered
    ("psum_scatter", (8 * 64,), np.float32, 8, "oneshot_ll"),
    ("all_gather", (64, 2), np.float32, 8, "oneshot_ll"),
    ("all_gather", (1 << 16,), np.float32, 8, "xla"),        # 8 x 256 KiB > 1 MiB crossover
    ("psum_scatter", (1 << 19,), np.float32, 8, "xla"),      # 2 MiB summed
    ("all_gather", (64,), np.int8, 8, "xla"),                # no kernel for int8
    ("all_gather", (64,), np.float32, 1, "xla"),             # a group of one: a copy
    ("all_gather", (8192,), np.float32, 8, "oneshot_sentinel"),   # 32 KiB pieces
    ("psum_scatter", (8 * 8192,), np.float32, 8, "oneshot_sentinel"),
    ("psum_scatter", (8 * 8192,), jnp.bfloat16, 8, "oneshot_ll"),  # 16 KiB bf16 pieces
    ("all_gather", (8192,), np.int32, 8, "oneshot_ll"),      # no sentinel kernel for int32
])
def test_auto_takes_the_measured_kernel_within_the_crossover(mesh1, monkeypatch, op, shape, dtype,
                                                       group, want):
  # Lowered for CUDA (no GPU needed) with the workspace lookup forced; the
  # crossover is all_reduce's (JAXLL_AUTO_MAX_BYTES pins it here)
  from jaxll import placement
  monkeypatch.setenv("JAXLL_AUTO_MAX_BYTES", str(1 << 20))
  monkeypatch.setattr(placement, "unserved", lambda ctx, axes: (group, ""))
  made = []  # (auto decides the size before it builds a workspace)
  monkeypatch.setattr(placement, "workspace_for",
                      lambda ctx, axes: made.append(axes) or (7, group, ""))
  fn = {"all_gather": lambda v: jaxll.all_gather(v, "tp", tiled=True),
        "psum_scatter": lambda v: jaxll.psum_scatter(v, "tp", tiled=True)}[op]
  x = _put(mesh1, np.zeros((8 * shape[0],) + shape[1:], dtype), P("tp"))
  f = jax.jit(jax.shard_map(fn, mesh=mesh1, in_specs=P("tp"), out_specs=P("tp")))
  text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
  site = [s for s in jaxll.recent_call_sites() if s.op == op][-1]
  assert site.algorithm == want and not site.reason.startswith("auto"), site
  assert ("jaxll_gather_scatter" in text) == (want != "xla")
  assert bool(made) == (want != "xla"), made
  if want != "xla":
    from jaxll import algorithms
    assert f"algorithm = {algorithms.SPECS[want].code} : i64" in text, text[-3000:]
    # (the attribute XLA's record stage reads: the kernel node may start early)
    assert "uses_pdl = true" in text, text[-3000:]


def test_auto_kernel_choice_follows_the_measured_crossovers():
  # the tuning table's rows (jaxll/tuning/gather_scatter.json): LL16 below the
  # measured piece size, sentinel from it; group sizes between the measured
  # ones take the nearest measured one below
  from jaxll import choice
  pick = lambda op, n, piece, dt: choice.gather_scatter_auto(
      op, n, piece * (1 if op == "all_gather" else n), dt)[0]
  table = choice.tuning("gather_scatter")["sentinel_from_bytes"]
  for op, widths in table.items():
    for width, row in widths.items():
      dt = np.float32 if width == "4" else jnp.bfloat16
      for n, start in ((int(n), start) for n, start in row.items()):
        if start is None:
          assert pick(op, n, 65536, dt) == "oneshot_ll"
          continue
        assert pick(op, n, start // 2, dt) == "oneshot_ll", (op, width, n)
        assert pick(op, n, start, dt) == "oneshot_sentinel", (op, width, n)
  assert pick("all_gather", 3, 4096, np.float32) == "oneshot_sentinel"  # as N=2
  assert pick("all_gather", 7, 4096, np.float32) == "oneshot_ll"        # as N=4
  assert pick("all_gather", 7, 32768, np.float32) == "oneshot_sentinel"
  assert pick("all_gather", 8, 32768, np.int32) == "oneshot_ll"
  kernel, why = choice.gather_scatter_auto("psum_scatter", 8, 8 * 32768, np.float32)
  assert kernel == "oneshot_sentinel" and "32768" in why, why


@pytest.mark.parametrize("dtype,ok", [(np.float32, True), (jnp.bfloat16, True), (np.int32, False)])
def test_sentinel_request_lowers_for_floating_types_only(mesh1, monkeypatch, dtype, ok):
  # Lowered for CUDA with the workspace lookup forced: the sentinel kernel's
  # code for floating types; int32 (all ones is a valid int32) refused clearly
  from jaxll import algorithms, placement
  monkeypatch.setattr(placement, "workspace_for", lambda ctx, axes: (7, 8, ""))
  x = _put(mesh1, np.zeros((8 * 16,), dtype), P("tp"))
  f = jax.jit(jax.shard_map(lambda v: jaxll.all_gather(v, "tp", tiled=True,
                                                       algorithm="oneshot_sentinel"),
                            mesh=mesh1, in_specs=P("tp"), out_specs=P("tp")))
  if not ok:
    with pytest.raises(jaxll.AlgorithmUnavailableError, match="no all_gather kernel for int32"):
      f.trace(x).lower(lowering_platforms=("cuda",))
    return
  text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
  assert f"algorithm = {algorithms.SPECS['oneshot_sentinel'].code} : i64" in text


def _lower_for_cuda(mesh1, monkeypatch, fn, x, group=8):
  """Lowers shard_map(fn) for CUDA (no GPU needed) with the workspace lookup
  forced; returns the text and the call sites recorded."""
  from jaxll import placement
  monkeypatch.setenv("JAXLL_AUTO_MAX_BYTES", str(1 << 20))
  monkeypatch.setattr(placement, "unserved", lambda ctx, axes: (group, ""))
  monkeypatch.setattr(placement, "workspace_for", lambda ctx, axes: (7, group, ""))
  before = len(jaxll.recent_call_sites())
  f = jax.jit(jax.shard_map(fn, mesh=mesh1, in_specs=P("tp"), out_specs=P("tp")))
  text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
  return text, jaxll.recent_call_sites()[before:]


@pytest.mark.parametrize("op,shape,dim,tiled,segment", [
    ("all_gather", (2, 64), 1, True, 64),            # (2, 8 x 64): 2 segments of 64
    ("all_gather", (2, 3, 16), -1, True, 16),        # the last dimension
    ("all_gather", (2, 3, 16), 1, False, 48),        # stacked at 1: segments of 3 x 16
    ("all_gather", (1, 3, 16), 1, True, 48),         # a leading 1: one segment
    ("psum_scatter", (2, 8 * 16), 1, True, 16),
    ("psum_scatter", (2, 3, 8 * 4), -1, True, 4),
    ("psum_scatter", (2, 8, 16), 1, False, 16),
])
def test_any_dimension_lowers_to_the_kernel_with_its_segments(mesh1, monkeypatch, op, shape,
                                                               dim, tiled, segment):
  # a gather or scatter along a later dimension takes the kernel, told the
  # segment its pieces lie in (elements; the whole piece along dimension 0)
  fn = {"all_gather": lambda v: jaxll.all_gather(v[0], "tp", axis=dim, tiled=tiled)[None],
        "psum_scatter": lambda v: jaxll.psum_scatter(v[0], "tp", scatter_dimension=dim,
                                                     tiled=tiled)[None]}[op]
  x = _put(mesh1, np.zeros((8,) + shape, np.float32), P("tp"))
  text, sites = _lower_for_cuda(mesh1, monkeypatch, fn, x)
  (site,) = [s for s in sites if s.op == op]
  assert site.algorithm == "oneshot_ll", site
  assert site.dimension == dim % (len(shape) + (0 if tiled or op != "all_gather" else 1)), site
  assert f"segment = {segment} : i64" in text, text[-3000:]


def test_segments_of_any_size_take_a_kernel(mesh1, monkeypatch):
  # 32 KiB float32 pieces take the sentinel kernel (the table's choice for the
  # piece size) along dimension 0 and along the last dimension, where the
  # segments (8 and 4 bytes) are shorter than its 16-byte unit: the kernel
  # moves such pieces element by element; every kernel named explicitly serves
  from jaxll import algorithms
  for shape, segment in (((8, 4096, 2), 2), ((8, 8192, 1), 1)):
    x = _put(mesh1, np.zeros(shape, np.float32), P("tp"))
    _, sites = _lower_for_cuda(mesh1, monkeypatch,
                               lambda v: jaxll.all_gather(v[0], "tp", tiled=True)[None], x)
    assert [s.algorithm for s in sites] == ["oneshot_sentinel"], sites
    text, sites = _lower_for_cuda(
        mesh1, monkeypatch, lambda v: jaxll.all_gather(v[0], "tp", axis=1, tiled=True)[None], x)
    assert [s.algorithm for s in sites] == ["oneshot_sentinel"], sites
    assert f"segment = {segment} : i64" in text
  for algorithm in ("oneshot_ll", "oneshot_sentinel", "oneshot_barrier"):
    _, sites = _lower_for_cuda(mesh1, monkeypatch, lambda v: jaxll.psum_scatter(
        v[0], "tp", scatter_dimension=1, tiled=True, algorithm=algorithm)[None],
        _put(mesh1, np.zeros((8, 3, 8 * 3), np.float32), P("tp")))
    assert [s.algorithm for s in sites] == [algorithm], sites
  assert algorithms.SPECS["oneshot_ll"].code != algorithms.SPECS["oneshot_sentinel"].code


def test_gradients_along_a_later_dimension_take_the_kernels(mesh1, monkeypatch):
  # the transpose of a gather along dimension 1 is the scatter along dimension
  # 1, and back: both lowered to the kernel
  x = _put(mesh1, np.zeros((8, 4, 16), np.float32), P("tp"))

  def loss(v):
    g = jaxll.all_gather(v, "tp", axis=1, tiled=True)          # (4, 8 x 16)
    s = jaxll.psum_scatter(g * g, "tp", scatter_dimension=1, tiled=True)
    return jnp.sum(s * s)

  grad = lambda v: jax.grad(loss)(v[0])[None]
  text, sites = _lower_for_cuda(mesh1, monkeypatch, grad, x)
  ops = sorted((s.op, s.dimension, s.algorithm) for s in sites)
  assert ops == [("all_gather", 1, "oneshot_ll")] * 2 + [("psum_scatter", 1, "oneshot_ll")] * 2, ops
  assert text.count("jaxll_gather_scatter") >= 4
