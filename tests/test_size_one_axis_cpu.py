"""CPU tier: every jaxll collective over a mesh axis of size 1 (a (1, 8) mesh,
the size-1 axis "one"): the result is jax.lax's (a ragged all-to-all, which
XLA:CPU cannot run, against numpy), explain lists the call site, and lowered
for CUDA a group of one device goes to XLA's collective under auto while a
kernel named explicitly serves it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll


@pytest.fixture(scope="module")
def mesh(cpu_devices):
  return jax.sharding.Mesh(np.array(cpu_devices).reshape(1, 8), ("one", "tp"))


X = np.random.default_rng(0).standard_normal((8 * 4, 8)).astype(np.float32)
W = np.ones(8, np.float32)
IDS = np.arange(8, dtype=np.int32)

# collective -> (jaxll's body, jax.lax's body or None, extra inputs)
CASES = {
    "all_reduce": (lambda v: jaxll.all_reduce(v, "one"), lambda v: jax.lax.psum(v, "one")),
    "all_reduce_rmsnorm": (
        lambda v: jaxll.all_reduce_rmsnorm(v, v, jnp.asarray(W), "one")[0],
        lambda v: (lambda s: s * jax.lax.rsqrt(jnp.mean(s * s, -1, keepdims=True) + 1e-6))(
            jax.lax.psum(v, "one") + v)),
    "all_gather": (lambda v: jaxll.all_gather(v, "one", tiled=True),
                   lambda v: jax.lax.all_gather(v, "one", tiled=True)),
    "psum_scatter": (lambda v: jaxll.psum_scatter(v, "one", tiled=True),
                     lambda v: jax.lax.psum_scatter(v, "one", tiled=True)),
    "ppermute": (lambda v: jaxll.ppermute(v, "one", [(0, 0)]),
                 lambda v: jax.lax.ppermute(v, "one", [(0, 0)])),
    "all_to_all": (lambda v: jaxll.all_to_all(v, "one", 0, 1, tiled=True),
                   lambda v: jax.lax.all_to_all(v, "one", 0, 1, tiled=True)),
    "ragged_all_to_all": (
        lambda v: jaxll.ragged_all_to_all(v, jnp.zeros_like(v), jnp.array([1]), jnp.array([2]),
                                          jnp.array([0]), jnp.array([2]), axis_name="one"),
        None),
}


def _run(mesh, body, check_vma=True):
  spec = P(("one", "tp"))
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec,
                            check_vma=check_vma))
  return f, jax.device_put(X, NamedSharding(mesh, spec))


@pytest.mark.parametrize("collective", list(CASES))
@pytest.mark.parametrize("check_vma", [True, False])
def test_a_size_one_axis_gives_jax_lax_result(mesh, collective, check_vma):
  ours, theirs = CASES[collective]
  f, x = _run(mesh, ours, check_vma)
  got = np.asarray(f(x))
  if theirs is None:  # ragged: rows 1 and 2 of each device's rows to rows 0 and 1
    want = np.zeros_like(X).reshape(8, 4, 8)
    want[:, :2] = X.reshape(8, 4, 8)[:, 1:3]
    want = want.reshape(X.shape)
  else:
    g, _ = _run(mesh, theirs, check_vma)
    want = np.asarray(g(x))
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  sites = jaxll.explain(f, x)
  op = {"all_reduce": "sum", "all_reduce_rmsnorm": "sum+rmsnorm"}.get(collective, collective)
  assert op in [s.op for s in sites], sites
  assert all(s.group_size == 1 for s in sites), sites


@pytest.mark.parametrize("collective", ["all_gather", "ppermute", "all_to_all",
                                        "ragged_all_to_all"])
def test_lowered_for_cuda_a_group_of_one(mesh, monkeypatch, collective):
  # auto leaves a group of one device to XLA (a copy); a kernel named serves it
  from jaxll import placement
  monkeypatch.setattr(placement, "unserved", lambda ctx, axes: (1, ""))
  monkeypatch.setattr(placement, "workspace_for", lambda ctx, axes: (7, 1, ""))
  ours, _ = CASES[collective]
  f, x = _run(mesh, ours)
  f.trace(x).lower(lowering_platforms=("cuda",))
  (site,) = [s for s in jaxll.recent_call_sites()[-3:] if s.op == collective][-1:]
  assert site.algorithm == "xla" and "group of one device" in site.reason, site
  named = {"all_gather": lambda v: jaxll.all_gather(v, "one", tiled=True,
                                                    algorithm="oneshot_ll"),
           "ppermute": lambda v: jaxll.ppermute(v, "one", [(0, 0)], algorithm="oneshot_ll"),
           "all_to_all": lambda v: jaxll.all_to_all(v, "one", 0, 1, tiled=True,
                                                    algorithm="oneshot_ll"),
           "ragged_all_to_all": lambda v: jaxll.ragged_all_to_all(
               v, jnp.zeros_like(v), jnp.array([1]), jnp.array([2]), jnp.array([0]),
               jnp.array([2]), axis_name="one", algorithm="oneshot_ll")}[collective]
  f, x = _run(mesh, named)
  text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
  assert jaxll.recent_call_sites()[-1].algorithm == "oneshot_ll"
  assert "jaxll_" in text
