"""CPU tier: jaxll.ragged_all_to_all on 8 virtual CPU devices, where XLA has no
ragged all-to-all and jaxll lowers the call to its composition (an all-to-all
of padded slices and a scatter): values against numpy (bitwise), for every
dtype, row shape, number of slices a peer, empty and skewed slices; JAX's
typing and errors; grad (operand and output) and vmap against numpy; routing
of jax.lax.ragged_all_to_all (which cannot run on the CPU by itself); and the
lowering for CUDA (no GPU needed): the kernel's custom call, its aliasing,
auto's choice and why a call goes to XLA. The kernel itself runs on the GPU
tier (test_gpu_ragged.py, tests/mp_scripts/ragged_check.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll


def case(n, slices, rows, row_shape, dtype, seed, *, skew=False):
  """Every rank's operand, output and (4, N, K) offset and size vectors of a
  consistent call (slices packed in the operand; each receiver packs what it
  gets in source order after row 0)."""
  rng = np.random.default_rng(seed)
  send = rng.integers(0, rows // (n * slices) + 1, size=(n, n, slices))
  send[rng.random(send.shape) < 0.2] = 0
  if skew:
    send[:, 0, :] = rows // (2 * slices)
  for r in range(n):  # (a rank's slices fit its operand)
    while send[r].sum() > rows:
      send[r].flat[np.argmax(send[r])] -= 1
  k = n * slices
  vec = np.zeros((4, n, k), np.int32)
  out_rows = 1
  for r in range(n):
    vec[0, r] = np.concatenate([[0], np.cumsum(send[r].ravel())[:-1]])
    vec[1, r] = send[r].ravel()
  for d in range(n):
    vec[2, :, d * slices:(d + 1) * slices] = 1 + np.concatenate(
        [[0], np.cumsum(send[:, d].ravel())[:-1]]).reshape(n, slices)
    vec[3, d] = send[:, d].ravel()
    out_rows = max(out_rows, 2 + int(send[:, d].sum()))
  if jnp.issubdtype(dtype, jnp.integer):
    x = rng.integers(-100, 100, size=(n, rows, *row_shape)).astype(dtype)
    o = rng.integers(-100, 100, size=(n, out_rows, *row_shape)).astype(dtype)
  else:
    x = rng.standard_normal((n, rows, *row_shape)).astype(dtype)
    o = rng.standard_normal((n, out_rows, *row_shape)).astype(dtype)
  return x, o, vec


def reference(x, o, vec):
  """numpy's ragged all-to-all of every rank's arguments."""
  n, k = vec.shape[1], vec.shape[2]
  slices = k // n
  want = o.copy()
  for s in range(n):
    for i in range(k):
      io, ss, oo = vec[0, s, i], vec[1, s, i], vec[2, s, i]
      want[i // slices, oo:oo + ss] = x[s, io:io + ss]
  return want


def sharded(mesh, fn, n_in=6, check_vma=True):
  spec = P(mesh.axis_names[0])
  return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * n_in, out_specs=spec,
                               check_vma=check_vma))


def put(mesh, *arrays):
  return tuple(jax.device_put(a, NamedSharding(mesh, P(mesh.axis_names[0]))) for a in arrays)


def _same(a, b):
  a, b = np.asarray(a), np.asarray(b)
  assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
  np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def _ragged(*a, **kw):
  return jaxll.ragged_all_to_all(*(v[0] for v in a), axis_name="tp", **kw)[None]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32, jnp.int8])
@pytest.mark.parametrize("row_shape,slices", [((), 1), ((3,), 2), ((2, 5), 3), ((16,), 1)])
@pytest.mark.parametrize("skew", [False, True])
@pytest.mark.parametrize("check_vma", [True, False])
def test_matches_numpy(mesh1, dtype, row_shape, slices, skew, check_vma):
  x, o, vec = case(8, slices, 48, row_shape, dtype, seed=slices, skew=skew)
  got = sharded(mesh1, _ragged, check_vma=check_vma)(*put(mesh1, x, o, *vec))
  _same(got, reference(x, o, vec))


@pytest.mark.parametrize("n,axes", [(2, ("dp",)), (4, ("tp",)), (8, ("dp", "tp"))])
def test_groups_of_every_size_and_multi_axis_names(mesh2, n, axes):
  # over dp (2), tp (4), and (dp, tp) row-major (8): the devices of each group
  # exchange among themselves; device index d = 4 dp + tp is rank d // 4 of its
  # group over dp, d % 4 over tp, d over both
  x, o, vec = case(n, 2, 24, (3,), np.float32, seed=n)
  rank = [d // 4 if axes == ("dp",) else d % n for d in range(8)]
  spec = P(("dp", "tp"))

  def body(*a):
    return jaxll.ragged_all_to_all(*(v[0] for v in a), axis_name=axes)[None]

  f = jax.jit(jax.shard_map(body, mesh=mesh2, in_specs=(spec,) * 6, out_specs=spec))
  args = [jax.device_put(a[rank], NamedSharding(mesh2, spec)) for a in (x, o, *vec)]
  got = np.asarray(f(*args))
  want = reference(x, o, vec)
  for d in range(8):
    _same(got[d], want[rank[d]])


def test_gradients_match_numpy(mesh1):
  x, o, vec = case(8, 2, 32, (4,), np.float32, seed=3)
  w = np.random.default_rng(4).standard_normal(o.shape).astype(np.float32)
  args = put(mesh1, x, o, *vec)
  f = sharded(mesh1, _ragged)
  gx, go = jax.jit(jax.grad(lambda a, b: jnp.sum(f(a, b, *args[2:]) * w), argnums=(0, 1)))(
      *args[:2])
  want_x, want_o = np.zeros_like(x), w.copy()
  for s in range(8):
    for i in range(16):
      io, ss, oo = vec[0, s, i], vec[1, s, i], vec[2, s, i]
      want_x[s, io:io + ss] = w[i // 2, oo:oo + ss]
      want_o[i // 2, oo:oo + ss] = 0
  _same(gx, want_x)
  _same(go, want_o)
  # forward mode: the tangents take the same exchange
  _, tangent = jax.jvp(lambda a, b: f(a, b, *args[2:]), args[:2], args[:2])
  _same(tangent, reference(x, o, vec))


def test_vmap_over_a_batch(mesh1):
  # a batch of 3 independent exchanges, vmapped inside the body, equals
  # three separate calls (JAX's rule: the batch folded into the rows)
  cases = [case(8, 1, 16, (2,), np.float32, seed=10 + b) for b in range(3)]
  rows = max(c[1].shape[1] for c in cases)  # (one output shape for the batch)
  cases = [(x, np.pad(o, ((0, 0), (0, rows - o.shape[1]), (0, 0))), v) for x, o, v in cases]
  xs, os_ = (np.stack([c[i] for c in cases], 1) for i in (0, 1))
  vecs = [np.stack([c[2][j] for c in cases], 1) for j in range(4)]

  def body(*a):
    return jax.vmap(lambda *v: jaxll.ragged_all_to_all(*v, axis_name="tp"))(
        *(v[0] for v in a))[None]

  got = np.asarray(sharded(mesh1, body)(*put(mesh1, xs, os_, *vecs)))
  for b, (x, o, vec) in enumerate(cases):
    _same(got[:, b], reference(x, o, vec))


def test_route_serves_jax_lax_ragged_all_to_all(mesh1):
  # XLA:CPU cannot run jax.lax.ragged_all_to_all; routed, it runs, with its
  # gradient, and explain lists the call sites
  x, o, vec = case(8, 2, 32, (5,), np.float32, seed=8)
  lax_body = lambda *a: jax.lax.ragged_all_to_all(*(v[0] for v in a), axis_name="tp")[None]
  args = put(mesh1, x, o, *vec)
  with pytest.raises(Exception, match="ragged"):
    sharded(mesh1, lax_body)(*args).block_until_ready()
  routed = jax.jit(jaxll.route(jax.shard_map(lax_body, mesh=mesh1, in_specs=(P("tp"),) * 6,
                                              out_specs=P("tp"))))
  _same(routed(*args), reference(x, o, vec))
  sites = jaxll.explain(routed, *args)
  assert [(s.op, s.algorithm) for s in sites] == [("ragged_all_to_all", "composed")], sites
  assert "XLA:CPU has no ragged all-to-all" in sites[0].reason
  grad = jax.jit(jax.grad(lambda a: jnp.sum(routed(a, *args[1:]) ** 2)))
  direct = jax.jit(jax.grad(lambda a: jnp.sum(sharded(mesh1, _ragged)(a, *args[1:]) ** 2)))
  _same(grad(args[0]), direct(args[0]))


def test_types_are_jaxs(mesh1):
  # under check_vma the result varies over the axis, as jax.lax's (typed by
  # JAX's own rule) does; integer offsets of any width are taken
  x, o, vec = case(8, 1, 16, (), np.float32, seed=2)
  seen = {}

  def body(*a):
    r = jaxll.ragged_all_to_all(a[0][0], a[1][0], *(v[0].astype(jnp.int16) for v in a[2:]),
                                axis_name="tp")
    seen["aval"] = jax.typeof(r)
    return r[None]

  _same(sharded(mesh1, body)(*put(mesh1, x, o, *vec)), reference(x, o, vec))
  assert seen["aval"].shape == o.shape[1:] and seen["aval"].dtype == np.float32


def test_errors_name_the_argument(mesh1):
  x, o, vec = case(8, 1, 16, (), np.float32, seed=2)
  args = put(mesh1, x, o, *vec)

  def run(**kw):
    def body(*a):
      a = [v[0] for v in a]
      fixes = kw.get("fix", lambda a: a)
      return jaxll.ragged_all_to_all(*fixes(a), axis_name=kw.get("axis", "tp"),
                                     algorithm=kw.get("algorithm", "auto"))[None]
    return sharded(mesh1, body)(*args)

  with pytest.raises(ValueError, match="send_sizes must be a non-empty integer vector"):
    run(fix=lambda a: a[:3] + [a[3].astype(jnp.float32)] + a[4:])
  with pytest.raises(ValueError, match="must have one length"):
    run(fix=lambda a: a[:5] + [a[5][:4]])
  with pytest.raises(ValueError, match="not a multiple of the group size 8"):
    run(fix=lambda a: a[:2] + [v[:4] for v in a[2:]])
  with pytest.raises(ValueError, match="rows .every dimension but the first. have one shape"):
    run(fix=lambda a: [a[0][:, None], a[1]] + a[2:])
  with pytest.raises(ValueError, match="algorithm must be one of"):
    run(algorithm="oneshot_sentinel")
  with pytest.raises(NameError, match="unknown axis name 'ep'"):
    run(axis="ep")
  with pytest.raises(jaxll.AlgorithmUnavailableError, match="jaxll.ragged_all_to_all"):
    run(algorithm="oneshot_ll")  # (on the CPU)
  with pytest.raises(ValueError, match="cannot keep deterministic mode"):
    jaxll.ragged_all_to_all(x[0], o[0], *vec[:, 0], axis_name="tp", algorithm="xla",
                            deterministic=True)


def _lower_for_cuda(mesh, monkeypatch, fn, args, group=8):
  from jaxll import placement
  monkeypatch.setenv("JAXLL_AUTO_MAX_BYTES", str(1 << 20))
  monkeypatch.setattr(placement, "unserved", lambda ctx, axes: (group, ""))
  monkeypatch.setattr(placement, "workspace_for", lambda ctx, axes: (7, group, ""))
  before = len(jaxll.recent_call_sites())
  f = sharded(mesh, fn, n_in=len(args))
  text = f.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  return text, jaxll.recent_call_sites()[before:]


def test_lowered_for_cuda(mesh1, monkeypatch):
  # the kernel's custom call, its result aliasing the output operand, int32
  # offsets; auto by size; more slices a peer than the kernel takes go to XLA
  x, o, vec = case(8, 2, 32, (6,), np.float32, seed=1)
  args = put(mesh1, x, o, *vec.astype(np.int32))
  text, sites = _lower_for_cuda(mesh1, monkeypatch, _ragged, args)
  assert [s.algorithm for s in sites] == ["oneshot_ll"], sites
  assert "jaxll_ragged_all_to_all" in text
  assert "output_operand_aliases" in text and "operand_index = 1" in text, text[-3000:]
  big = put(mesh1, np.zeros((8, 1 << 16, 8), np.float32), np.zeros((8, 8, 8), np.float32),
            *np.zeros((4, 8, 16), np.int32))
  _, sites = _lower_for_cuda(mesh1, monkeypatch, _ragged, big)
  assert sites[0].algorithm == "xla" and "auto crossover" in sites[0].reason, sites
  many = put(mesh1, x, o, *np.zeros((4, 8, 8 * 33), np.int32))
  _, sites = _lower_for_cuda(mesh1, monkeypatch, _ragged, many)
  assert sites[0].algorithm == "xla" and "33 slices a peer" in sites[0].reason, sites
  with pytest.raises(jaxll.AlgorithmUnavailableError, match="33 slices a peer"):
    _lower_for_cuda(mesh1, monkeypatch, lambda *a: _ragged(*a, algorithm="oneshot_ll"), many)
  _, sites = _lower_for_cuda(mesh1, monkeypatch, lambda *a: _ragged(*a, algorithm="xla"), args)
  assert sites[0].algorithm == "xla" and "requested" in sites[0].reason


def test_groups_of_the_axis_take_xla(mesh1, monkeypatch):
  x, o, vec = case(4, 1, 16, (), np.float32, seed=5)
  xs, os_ = np.concatenate([x, x]), np.concatenate([o, o])
  vecs = np.concatenate([vec, vec], axis=1)
  groups = [[0, 1, 2, 3], [4, 5, 6, 7]]

  def body(*a):
    return jaxll.ragged_all_to_all(*(v[0] for v in a), axis_name="tp",
                                   axis_index_groups=groups)[None]

  args = put(mesh1, xs, os_, *vecs)
  want = reference(x, o, vec)
  _same(sharded(mesh1, body)(*args), np.concatenate([want, want]))
  _, sites = _lower_for_cuda(mesh1, monkeypatch, body, args)
  assert sites[0].algorithm == "xla" and "axis_index_groups" in sites[0].reason, sites
