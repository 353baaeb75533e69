"""One process of test_kernel_in_processes_sharing_a_gpu (run by jaxll.tools.launch):
broadcasts of several sizes and roots through the kernel, interleaved with
jaxll all-reduces in one jitted program, repeated; every result checked."""
import numpy as np

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import custom_collective as cc
import jaxll
from jaxll.tools import launch

launch.init_worker()
n = jax.device_count()
mesh = jax.make_mesh((n,), ("x",))
report = {"errors": [], "checked": 0}


def put(full):
  sharding = NamedSharding(mesh, P("x"))
  idx = sharding.addressable_devices_indices_map(full.shape)
  return jax.make_array_from_single_device_arrays(
      full.shape, sharding, [jax.device_put(full[i], d) for d, i in idx.items()])


for count in (1, 3, 1000, 70_001):
  for root in (0, n - 1):
    full = np.random.default_rng(count + root).standard_normal((n, count)).astype(np.float32)

    def body(v):
      s = jaxll.all_reduce(v, "x", algorithm="oneshot_ll")
      b = cc.broadcast(v, "x", root=root)
      return b, jaxll.all_reduce(b, "x", algorithm="oneshot_ll") - s

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P(), P())))
    assert [s.algorithm for s in jaxll.explain(f, put(full))] == ["oneshot_ll"] * 2
    compiled = f.lower(put(full)).compile()
    launch.barrier()
    x = put(full)
    # every rank's block is (1, count): the results, replicated, have that shape
    want_b = full[root:root + 1]
    want_d = n * want_b.astype(np.float64) - full.astype(np.float64).sum(0, keepdims=True)
    for _ in range(5):
      b, d = compiled(x)
      got_b = np.asarray(b.addressable_data(0))
      got_d = np.asarray(d.addressable_data(0), np.float64)
      if got_b.shape != want_b.shape or got_d.shape != want_d.shape:
        report["errors"].append(f"broadcast {count} root {root}: shapes {got_b.shape}, "
                                f"{got_d.shape}, want {want_b.shape}")
      elif not np.array_equal(got_b.view(np.uint32), want_b.view(np.uint32)):
        bad = int(np.sum(got_b.view(np.uint32) != want_b.view(np.uint32)))
        report["errors"].append(f"broadcast {count} root {root}: {bad} elements' bits wrong")
      if not np.allclose(got_d, want_d, rtol=1e-4, atol=1e-3 * n):
        report["errors"].append(f"all-reduce after broadcast {count} root {root}: wrong")
      report["checked"] += 1
jaxll.check_errors()
launch.report(report)
