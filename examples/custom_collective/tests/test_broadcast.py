"""custom_collective.broadcast: on 8 CPU devices (XLA's path) against the
root's rows; its GPU lowering (cross-lowered for CUDA on any machine) chained
with jaxll's own calls; and, with a GPU, the kernel itself on virtual ranks
and in 2 and 4 processes sharing it (pytest -m gpu)."""

import os
import sys

import numpy as np
import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import custom_collective as cc  # noqa: E402
import jaxll  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def mesh():
  devs = jax.devices("cpu")
  if len(devs) < 8:
    pytest.skip("needs 8 CPU devices")
  return jax.make_mesh((8,), ("x",), devices=devs[:8])


@pytest.mark.parametrize("dtype", [np.float32, np.int32, jnp.bfloat16, np.int8])
@pytest.mark.parametrize("root", [0, 5])
@pytest.mark.parametrize("check_vma", [True, False])
def test_every_rank_gets_the_roots_rows_on_cpu(mesh, dtype, root, check_vma):
  x = (np.arange(8 * 3 * 7) % 100).reshape(8 * 3, 7).astype(dtype)
  f = jax.jit(jax.shard_map(lambda v: cc.broadcast(v, "x", root=root), mesh=mesh,
                            in_specs=P("x"), out_specs=P(), check_vma=check_vma))
  got = np.asarray(f(jax.device_put(x, NamedSharding(mesh, P("x")))))
  np.testing.assert_array_equal(got, x[3 * root:3 * root + 3])


def test_gpu_lowering_is_chained_with_jaxll_calls(mesh, monkeypatch):
  # Cross-lowered for CUDA (no GPU needed), with the workspace lookup forced:
  # the broadcast takes the order value of the all-reduce before it and hands
  # its own to the one after it.
  import sys
  from jaxll import placement
  ALL_REDUCE = sys.modules["jaxll.all_reduce"]  # (the module; jaxll.all_reduce is the function)
  monkeypatch.setattr(placement, "workspace_for", lambda ctx, axes: (7, 8, ""))
  monkeypatch.setattr(ALL_REDUCE, "decide", lambda ctx, aval, axes, op, requested:
                      ALL_REDUCE.Decision("oneshot_ll", "forced by the test", 7, 8))
  monkeypatch.setattr(cc, "_ext", object())  # as if the kernel were loaded

  def body(v):
    a = jaxll.all_reduce(v, "x")
    b = cc.broadcast(v * 2, "x", root=3)
    return a, jaxll.all_reduce(b, "x")

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P(), P())))
  x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, P("x")))
  text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
  import re
  calls = re.findall(r"(%\w+):2 = stablehlo\.custom_call @(\w+)\((%[\w#]+), (%[\w#]+)\)", text)
  assert [c[1] for c in calls] == ["jaxll_all_reduce", "custom_broadcast", "jaxll_all_reduce"]
  assert calls[1][3] == calls[0][0] + "#1" and calls[2][3] == calls[1][0] + "#1", calls
  assert "workspace = 7" in text and "root = 3" in text


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_kernel_on_virtual_ranks(n):
  if not (cc.kernels_available() and any(d.platform == "gpu" for d in jax.devices())):
    pytest.skip("needs a GPU and the compiled kernel")
  rng = np.random.default_rng(n)
  for shape, dtype in (((1,), np.int8), ((37,), np.float32), ((1000, 3), np.int32),
                       ((4096,), np.uint8), ((300_001,), np.float32)):
    x = rng.integers(0, 100, size=(n, *shape)).astype(dtype)
    for root in sorted({0, n - 1, n // 2}):
      got = cc.virtual_broadcast(x, root=root)
      for r in range(n):
        np.testing.assert_array_equal(got[r], x[root], err_msg=f"rank {r}, root {root}, {shape}")
  with pytest.raises(ValueError, match="root must be in"):
    cc.virtual_broadcast(np.zeros((n, 4), np.float32), root=n)


@pytest.mark.gpu
@pytest.mark.parametrize("processes", [2, 4])
def test_kernel_in_processes_sharing_a_gpu(processes):
  if not (cc.kernels_available() and any(d.platform == "gpu" for d in jax.devices())):
    pytest.skip("needs a GPU and the compiled kernel")
  from jaxll.tools import launch
  workers = launch.run(os.path.join(HERE, "gpu_worker.py"), processes, timeout=600,
                       devices=["0"] * processes,
                       env={"PYTHONPATH": os.pathsep.join(sys.path)})
  for w in workers:
    assert w.result["errors"] == [], w.result
    assert w.result["checked"] >= 20, w.result
