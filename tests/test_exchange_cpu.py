"""CPU tier: jaxll.ppermute and jaxll.all_to_all against jax.lax.ppermute and
jax.lax.all_to_all on 8 virtual CPU devices: values (bitwise), shapes, dtypes,
check_vma types, grad (the inverse permutation; split and concat swapped),
vmap, multi-axis names, errors, routing and path reporting. On CPU every call
lowers to XLA's collective; the kernels' own layout arithmetic (the runs of a
piece) is checked against numpy here, the kernels on the GPU tier
(test_gpu_exchange.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll
from jaxll import exchange


def _random(shape, dtype, seed=0):
  rng = np.random.default_rng(seed)
  if jnp.issubdtype(dtype, jnp.integer):
    return rng.integers(-50, 50, size=shape).astype(dtype)
  return rng.standard_normal(shape).astype(dtype)


def _run(mesh, body, x, in_spec=P("tp"), out_spec=P("tp"), check_vma=True):
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_spec, out_specs=out_spec,
                            check_vma=check_vma))
  return f(jax.device_put(x, NamedSharding(mesh, in_spec)))


def _same(a, b):
  assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
  np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


PERMS = {
    "ring": [(i, (i + 1) % 8) for i in range(8)],
    "swap": [(i, i ^ 1) for i in range(8)],
    "partial": [(0, 3), (5, 1), (2, 2)],
    "negative": [(1, -1), (-2, 0)],
    "empty": [],
}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32, jnp.int8])
@pytest.mark.parametrize("perm", list(PERMS), ids=str)
@pytest.mark.parametrize("check_vma", [True, False])
def test_ppermute_matches_lax(mesh1, dtype, perm, check_vma):
  x = _random((8 * 3, 5), dtype, seed=1)
  got = _run(mesh1, lambda v: jaxll.ppermute(v, "tp", PERMS[perm]), x, check_vma=check_vma)
  want = _run(mesh1, lambda v: jax.lax.ppermute(v, "tp", PERMS[perm]), x, check_vma=check_vma)
  _same(got, want)


def test_ppermute_grad_is_the_inverse_permutation(mesh1):
  put = lambda a: jax.device_put(a, NamedSharding(mesh1, P("tp")))
  x = put(_random((8 * 2, 3), jnp.float32, seed=2))
  w = put(_random((8 * 2, 3), jnp.float32, seed=3))
  perm = PERMS["partial"]

  def loss(fn):
    f = jax.shard_map(lambda v, u: fn(v, "tp", perm) * u, mesh=mesh1,
                      in_specs=(P("tp"), P("tp")), out_specs=P("tp"))
    return jax.jit(jax.grad(lambda v: jnp.sum(f(v, w) ** 2)))

  _same(loss(jaxll.ppermute)(x), loss(jax.lax.ppermute)(x))
  jaxpr = str(jax.make_jaxpr(loss(jaxll.ppermute))(x))
  assert "jaxll_ppermute" in jaxpr and "ppermute[" not in jaxpr.replace("jaxll_ppermute", "")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32])
@pytest.mark.parametrize("split,concat,tiled,shape", [
    (0, 0, True, (8 * 16, 3)), (0, 1, True, (8 * 8, 4)), (1, 0, True, (8 * 2, 16)),
    (1, 1, True, (8, 8, 3)), (2, 0, True, (8, 3, 16)), (-1, 0, True, (8 * 2, 8)),
    (0, 0, False, (8 * 8, 8, 3)), (1, 0, False, (8, 8, 3)), (2, 1, False, (8, 3, 8)),
    (1, 1, False, (8, 8, 5))])
@pytest.mark.parametrize("check_vma", [True, False])
def test_all_to_all_matches_lax(mesh1, dtype, split, concat, tiled, shape, check_vma):
  x = _random(shape, dtype, seed=4)
  got = _run(mesh1, lambda v: jaxll.all_to_all(v, "tp", split, concat, tiled=tiled), x,
             check_vma=check_vma)
  split_pos = split % len(shape)  # (jax.lax.all_to_all takes no negative dimension)
  want = _run(mesh1, lambda v: jax.lax.all_to_all(v, "tp", split_pos, concat, tiled=tiled), x,
              check_vma=check_vma)
  _same(got, want)


@pytest.mark.parametrize("split,concat,tiled,shape", [
    (0, 0, True, (8 * 16, 3)), (1, 0, True, (8 * 2, 16)), (2, 1, True, (8, 3, 16)),
    (1, 1, False, (8, 8, 5)), (0, 0, False, (8 * 8, 8, 3))])
def test_all_to_all_grad_swaps_split_and_concat(mesh1, split, concat, tiled, shape):
  x = jax.device_put(_random(shape, jnp.float32, seed=5), NamedSharding(mesh1, P("tp")))

  def grad(fn):
    f = jax.shard_map(lambda v: fn(v, "tp", split, concat, tiled=tiled), mesh=mesh1,
                      in_specs=P("tp"), out_specs=P("tp"))
    return jax.jit(jax.grad(lambda v: jnp.sum(f(v) ** 3)))

  _same(grad(jaxll.all_to_all)(x), grad(jax.lax.all_to_all)(x))


def test_all_to_all_grad_moving_a_dimension(mesh1):
  # jax.lax.all_to_all(tiled=False) with split != concat has no working
  # gradient on these jax versions (its transpose inserts a dimension again);
  # jaxll's is the all-to-all back, as jax.lax.all_to_all computes it forward.
  x = _random((8 * 8, 8, 3), jnp.float32, seed=6)
  f = jax.shard_map(lambda v: jaxll.all_to_all(v, "tp", 0, 1), mesh=mesh1,
                    in_specs=P("tp"), out_specs=P("tp"))
  y, vjp = jax.vjp(jax.jit(f), jax.device_put(x, NamedSharding(mesh1, P("tp"))))
  ct = _random(y.shape, jnp.float32, seed=8)
  (g,) = vjp(jax.device_put(ct, NamedSharding(mesh1, P("tp"))))
  _same(g, _run(mesh1, lambda c: jax.lax.all_to_all(c, "tp", 1, 0), ct))


@pytest.mark.parametrize("perm", ["ring", "partial"])
def test_ppermute_vmap(mesh1, perm):
  x = _random((8 * 2, 3), jnp.float32, seed=9)
  body = lambda fn: (lambda v: jax.vmap(lambda r: fn(r, "tp", PERMS[perm]))(
      jnp.stack([v, 2 * v, -v])))
  _same(_run(mesh1, body(jaxll.ppermute), x), _run(mesh1, body(jax.lax.ppermute), x))


def test_ppermute_vmap_over_its_own_axis():
  xs = jnp.arange(8 * 3, dtype=jnp.float32).reshape(8, 3)
  perm = PERMS["ring"]  # (JAX's rule takes only a whole permutation here)
  got = jax.vmap(lambda r: jaxll.ppermute(r, "b", perm), axis_name="b")(xs)
  want = jax.vmap(lambda r: jax.lax.ppermute(r, "b", perm), axis_name="b")(xs)
  _same(got, want)


@pytest.mark.parametrize("split,concat,tiled", [(0, 0, True), (1, 0, True), (0, 1, False)])
def test_all_to_all_vmap(mesh1, split, concat, tiled):
  x = _random((8 * 8, 16), jnp.float32, seed=10)
  body = lambda fn: (lambda v: jax.vmap(
      lambda r: fn(r, "tp", split, concat, tiled=tiled), in_axes=1, out_axes=0)(
          v.reshape(8, 2, 8)).reshape(8, 16))
  _same(_run(mesh1, body(jaxll.all_to_all), x), _run(mesh1, body(jax.lax.all_to_all), x))


def test_all_to_all_vmap_over_its_own_axis():
  xs = jnp.arange(8 * 8 * 2, dtype=jnp.float32).reshape(8, 8, 2)
  got = jax.vmap(lambda r: jaxll.all_to_all(r, "b", 0, 0, tiled=True), axis_name="b")(xs)
  want = jax.vmap(lambda r: jax.lax.all_to_all(r, "b", 0, 0, tiled=True), axis_name="b")(xs)
  _same(got, want)


def test_multi_axis_names(mesh2):
  x = _random((8 * 8, 3), jnp.float32, seed=11)
  axes = ("dp", "tp")
  perm = [(i, (3 * i + 1) % 8) for i in range(8)]
  spec = P(axes)
  for ours, ref in ((lambda v: jaxll.ppermute(v, axes, perm),
                     lambda v: jax.lax.ppermute(v, axes, perm)),
                    (lambda v: jaxll.all_to_all(v, axes, 0, 1, tiled=True),
                     lambda v: jax.lax.all_to_all(v, axes, 0, 1, tiled=True))):
    _same(_run(mesh2, ours, x, spec, spec), _run(mesh2, ref, x, spec, spec))
  # over one axis of two
  x2 = _random((8 * 4, 3), jnp.float32, seed=12)
  _same(_run(mesh2, lambda v: jaxll.ppermute(v, "tp", [(0, 1), (1, 0)]), x2, spec, spec),
        _run(mesh2, lambda v: jax.lax.ppermute(v, "tp", [(0, 1), (1, 0)]), x2, spec, spec))


def test_pytrees_and_empty_axes(mesh1):
  x = _random((8 * 2, 8), jnp.float32, seed=13)
  perm = PERMS["ring"]
  got = _run(mesh1, lambda v: jaxll.ppermute({"a": v, "b": (v * 2,)}, "tp", perm), x,
             out_spec={"a": P("tp"), "b": (P("tp"),)})
  want = _run(mesh1, lambda v: jax.lax.ppermute({"a": v, "b": (v * 2,)}, "tp", perm), x,
              out_spec={"a": P("tp"), "b": (P("tp"),)})
  jax.tree_util.tree_map(_same, got, want)
  v = jnp.ones(3)
  assert jaxll.ppermute(v, (), []) is v
  assert jaxll.all_to_all(v, (), 0, 0) is v


def test_errors_are_jax_errors(mesh1):
  x = _random((8 * 3, 8), jnp.float32, seed=14)
  # a repeated destination or source
  for fn in (jaxll.ppermute, jax.lax.ppermute):
    with pytest.raises(ValueError, match="sources and destinations must be unique"):
      _run(mesh1, lambda v: fn(v, "tp", [(0, 1), (2, 1)]), x)
  # all_to_all: the split dimension must match the group
  for fn in (jaxll.all_to_all, jax.lax.all_to_all):
    with pytest.raises(ValueError, match="all_to_all"):
      _run(mesh1, lambda v: fn(v, "tp", 0, 0), x)
    with pytest.raises(ValueError, match="divisible"):
      _run(mesh1, lambda v: fn(v, "tp", 0, 0, tiled=True), x)
  with pytest.raises(TypeError, match="perm must be pairs"):
    _run(mesh1, lambda v: jaxll.ppermute(v, "tp", [0, 1]), x)
  with pytest.raises(TypeError, match="split_axis must be an int"):
    _run(mesh1, lambda v: jaxll.all_to_all(v, "tp", 0.5, 0), x)
  with pytest.raises(ValueError, match="algorithm must be one of"):
    jaxll.ppermute(x, "tp", [], algorithm="twoshot_ll")
  with pytest.raises(ValueError, match="cannot keep deterministic mode"):
    jaxll.all_to_all(x, "tp", 0, 0, algorithm="xla", deterministic=True)


def test_named_kernel_on_cpu_raises_and_explain_reports(mesh1):
  x = _random((8 * 8, 8), jnp.float32, seed=15)
  with pytest.raises(jaxll.AlgorithmUnavailableError, match="ppermute.*oneshot_ll"):
    _run(mesh1, lambda v: jaxll.ppermute(v, "tp", PERMS["ring"], algorithm="oneshot_ll"), x)
  f = jax.shard_map(lambda v: (jaxll.ppermute(v, "tp", PERMS["ring"]),
                               jaxll.all_to_all(v, "tp", 0, 0, tiled=True)),
                    mesh=mesh1, in_specs=P("tp"), out_specs=(P("tp"), P("tp")))
  sites = jaxll.explain(f, jax.device_put(x, NamedSharding(mesh1, P("tp"))))
  assert [s.op for s in sites] == ["ppermute", "all_to_all"], sites
  assert all(s.algorithm == "xla" and "jaxll kernels run on CUDA GPUs" in s.reason
             for s in sites), sites
  assert sites[1].dimension == 0 and sites[0].group_size == 8


def test_route_replaces_both(mesh1):
  x = _random((8 * 2, 8), jnp.float32, seed=16)  # (all_to_all splits dimension 1)
  perm = PERMS["partial"]
  body = lambda v: (jax.lax.ppermute(v, "tp", perm),
                    jax.lax.all_to_all(v, "tp", 1, 0, tiled=True))
  f = jax.shard_map(body, mesh=mesh1, in_specs=P("tp"), out_specs=(P("tp"), P("tp")))
  xs = jax.device_put(x, NamedSharding(mesh1, P("tp")))
  routed = jaxll.route(f)
  jax.tree_util.tree_map(_same, routed(xs), jax.jit(f)(xs))
  sites = jaxll.explain(jax.jit(routed), xs)
  assert sorted(s.op for s in sites) == ["all_to_all", "ppermute"], sites
  # and their gradients
  loss = lambda g: jax.jit(jax.grad(lambda v: sum(jnp.sum(o ** 2) for o in g(v))))
  _same(loss(routed)(xs), loss(f)(xs))
  sites = jaxll.explain(loss(routed), xs)
  assert sorted(s.op for s in sites) == ["all_to_all"] * 2 + ["ppermute"] * 2, sites
  left = jaxll.route(f, collectives=("psum",))
  assert jaxll.explain(jax.jit(left), xs) == []


@pytest.mark.parametrize("shape,split,concat", [
    ((8, 3), 0, 0), ((2, 8, 3), 1, 0), ((4, 16, 6), 1, 2), ((16, 2, 3), 0, 2), ((3, 8), 1, 1)])
def test_segments_place_pieces_as_numpy_does(shape, split, concat):
  # The runs the kernel is given (exchange.all_to_all_segments) read rank j's
  # piece j of every input and write piece j of every output where
  # jax.lax.all_to_all would: emulate the kernel's addressing with them.
  n = 8 if shape[split] % 8 == 0 else 4
  if shape[split] % n:
    pytest.skip("shape not divisible")
  xs = [np.arange(np.prod(shape)).reshape(shape) + 1000 * r for r in range(n)]
  count = int(np.prod(shape)) // n
  seg_in, seg_out = exchange.all_to_all_segments(shape, split, concat, n)

  def piece(j, seg):  # element indices of piece j of a message in runs of `seg`
    return [((u // seg) * n + j) * seg + u % seg for u in range(count)]

  out_shape = list(shape)
  out_shape[split] //= n
  out_shape[concat] *= n
  for r in range(n):
    y = np.zeros(int(np.prod(out_shape)), dtype=np.int64)
    for j in range(n):  # rank j's piece r arrives as piece j of rank r's output
      y[piece(j, seg_out)] = xs[j].ravel()[piece(r, seg_in)]
    want = np.concatenate([np.split(x, n, axis=split)[r] for x in xs], axis=concat)
    np.testing.assert_array_equal(y.reshape(out_shape), want)


@pytest.mark.parametrize("nbytes,want", [(64, "oneshot_ll"), (1 << 19, "oneshot_sentinel"),
                                         (1 << 21, "xla")])
def test_lowered_for_cuda(mesh1, monkeypatch, nbytes, want):
  # Lowered for CUDA (no GPU needed) with the workspace lookup forced: auto's
  # choice by size, the custom calls and their attributes (the permutation packed
  # four bits a rank, the runs of an all-to-all's pieces)
  from jaxll import algorithms, placement
  monkeypatch.setenv("JAXLL_AUTO_MAX_BYTES", str(1 << 20))
  monkeypatch.setattr(placement, "unserved", lambda ctx, axes: (8, ""))
  monkeypatch.setattr(placement, "workspace_for", lambda ctx, axes: (7, 8, ""))
  perm = [(i, 7 - i) for i in range(7)]  # (rank 7 sends nothing)
  cols = nbytes // 32
  x = jax.device_put(np.zeros((8 * 8, cols), np.float32), NamedSharding(mesh1, P("tp")))
  body = lambda v: (jaxll.ppermute(v, "tp", perm), jaxll.all_to_all(v, "tp", 0, 1, tiled=True))
  f = jax.jit(jax.shard_map(body, mesh=mesh1, in_specs=P("tp"), out_specs=(P("tp"), P("tp"))))
  text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
  sites = {s.op: s for s in jaxll.recent_call_sites()[-2:]}
  assert sites["ppermute"].algorithm == want and sites["all_to_all"].algorithm == want, sites
  if want == "xla":
    assert "jaxll_ppermute" not in text and "jaxll_all_to_all" not in text
    return
  dests = sum((7 - i) << (4 * i) for i in range(7))
  assert f"dests = {dests} : i64" in text and "senders = 127 : i64" in text, text[-3000:]
  assert text.count(f"algorithm = {algorithms.SPECS[want].code} : i64") == 2
  # (8, cols) split along 0 into rows, concatenated along 1: the input's pieces
  # are whole, the output's in runs of cols elements
  assert f"in_segment = {cols} : i64, out_segment = {cols} : i64" in text, text[-3000:]
