"""One process of the determinism check (run by jaxll.tools.launch; processes
sharing one GPU): calls in deterministic mode (docs/determinism.md) through
jitted shard_maps, reported as digests of this rank's results, for the test to
compare with the same calls on virtual ranks (tests/test_gpu_determinism.py).

- all_reduce of float32 messages of DETERMINISM_COUNTS elements, with
  algorithm auto (a kernel at every size: the largest is past auto's
  crossover to XLA) and each reproducible kernel named;
- psum_scatter past the crossover, against numpy's rank-order float32 sum;
- all_reduce_rmsnorm at every DETERMINISM_ROWS shape and DETERMINISM_TOKENS
  count: token t's rows must be the same bits at every token count.

  python determinism_check.py
"""
import hashlib
import os
import sys

import numpy as np

import jax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxll.tools import launch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mp_checks import (DETERMINISM_COUNTS, DETERMINISM_ROWS, DETERMINISM_TOKENS,  # noqa: E402
                       determinism_inputs)

pid = launch.init_worker()
import jaxll  # noqa: E402

n = jax.device_count()
mesh = jax.make_mesh((n,), ("tp",))
pos = list(mesh.devices.flat).index(jax.local_devices()[0])  # this process's rank
report = {"pid": pid, "rank": pos, "errors": [], "digests": {}, "paths": {}}
KERNELS = ("oneshot_ll", "oneshot_sentinel", "twoshot_ll", "twoshot_sentinel")


def put(array, spec):
  sharding = NamedSharding(mesh, spec)
  idx = sharding.addressable_devices_indices_map(array.shape)
  return jax.make_array_from_single_device_arrays(
      array.shape, sharding, [jax.device_put(array[i], d) for d, i in idx.items()])


def mine(out):
  return np.asarray(out.addressable_data(0))


def digest(a) -> str:
  return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def run(name, f, *args):
  """Runs jitted `f`, whose every call site must be a jaxll kernel; records
  the sites' paths and returns this rank's outputs."""
  launch.progress(name)
  sites = jaxll.explain(f, *args)
  report["paths"][name] = [(s.op, s.algorithm, s.reason) for s in sites]
  if not sites or any(s.algorithm in ("xla", "composed") for s in sites):
    report["errors"].append(f"{name}: not every call took a kernel: {report['paths'][name]}")
  outs = f(*args)
  return [mine(o) for o in (outs if isinstance(outs, (tuple, list)) else (outs,))]


# 1. all_reduce, every size, auto and every kernel named
for count in DETERMINISM_COUNTS:
  full = determinism_inputs((n, count), "float32", seed=count)
  x = put(full, P("tp"))
  for algorithm in ("auto",) + KERNELS:
    f = jax.jit(jax.shard_map(
        lambda v, a=algorithm: jaxll.all_reduce(v, "tp", algorithm=a, deterministic=True),
        mesh=mesh, in_specs=P("tp"), out_specs=P()))
    (out,) = run(f"all_reduce {count} {algorithm}", f, x)
    report["digests"][f"all_reduce {count} {algorithm}"] = digest(out)

# 2. psum_scatter past the crossover, against numpy
count = 2 * DETERMINISM_COUNTS[-1] * n
full = determinism_inputs((n, count), "float32", seed=7)
f = jax.jit(jax.shard_map(lambda v: jaxll.psum_scatter(v[0], "tp", tiled=True,
                                                       deterministic=True),
                          mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))
(out,) = run("psum_scatter", f, put(full, P("tp")))
total = full[0].copy()
for r in range(1, n):
  total = total + full[r]
if not np.array_equal(out.view(np.uint32), np.split(total, n)[pos].view(np.uint32)):
  report["errors"].append("psum_scatter: not numpy's rank-order float32 sum")

# 3. all_reduce_rmsnorm: token t's rows the same bits at every token count
most = max(DETERMINISM_TOKENS)
for hidden, dtype in DETERMINISM_ROWS:
  x_all = determinism_inputs((n, most, hidden), dtype, seed=hidden)
  residual_all = determinism_inputs((most, hidden), dtype, seed=hidden + 1)
  weight = (1 + 0.1 * np.random.default_rng(hidden).standard_normal(hidden)).astype(dtype)
  f = jax.jit(jax.shard_map(
      lambda a, r, w: jaxll.all_reduce_rmsnorm(a, r, w, "tp", eps=1e-5, deterministic=True),
      mesh=mesh, in_specs=(P("tp"), P(), P()), out_specs=(P(), P())))
  rows = {}
  for tokens in DETERMINISM_TOKENS:
    x = put(x_all[:, :tokens].reshape(n * tokens, hidden), P("tp"))
    name = f"rmsnorm {hidden} {dtype} {tokens}"
    normed, new = run(name, f, x, put(residual_all[:tokens], P()), put(weight, P()))
    report["digests"][name] = [digest(normed), digest(new)]
    rows[tokens] = normed
  for tokens, normed in rows.items():
    if not np.array_equal(normed.view(np.uint8), rows[most][:tokens].view(np.uint8)):
      report["errors"].append(f"rmsnorm {hidden} {dtype}: {tokens} tokens' rows differ from "
                              f"the same rows in a call of {most}")

jaxll.check_errors()
launch.report(report)
