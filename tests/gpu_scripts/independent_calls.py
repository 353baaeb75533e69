"""Many independent jaxll all-reduces in one jitted function on a one-GPU mesh,
run under the XLA_FLAGS the caller sets (tests/test_gpu_virtual.py runs it
under flags that let XLA reorder or overlap independent work). Every call reads
and advances the same workspace's epochs, so the calls must stay ordered: each
result must equal its input (a group of one), and no call may time out.

  python tests/gpu_scripts/independent_calls.py [RUNS]
Prints "INDEPENDENT_CALLS OK <calls>" on success; exits non-zero otherwise.
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll

runs = int(sys.argv[1]) if len(sys.argv) > 1 else 300
dev = jax.devices("cuda")[0]
mesh = jax.make_mesh((1,), ("tp",), devices=[dev])
algos = ["oneshot_ll", "oneshot_sentinel", "twoshot_ll", "twoshot_sentinel"]
sizes = [1, 300, 5000, 70_001]
sites = [(a, c) for a in algos for c in sizes]
rng = np.random.default_rng(0)
xs = [jax.device_put(rng.standard_normal(c).astype(np.float32), NamedSharding(mesh, P("tp")))
      for _, c in sites]


def body(*vs):
  # no call depends on another: XLA is free to order (or overlap) them
  return [jaxll.all_reduce(v, "tp", algorithm=a) for v, (a, _) in zip(vs, sites)]


f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp"),) * len(sites),
                          out_specs=[P("tp")] * len(sites)))
assert [s.algorithm for s in jaxll.explain(f, *xs)] == [a for a, _ in sites]
hlo = f.lower(*xs).compile().as_text()
calls = hlo.count('custom_call_target="jaxll_all_reduce"')
assert calls == len(sites), calls


@jax.jit
def mismatches(outs, ins):
  return sum(jnp.sum(o != i) for o, i in zip(outs, ins))


bad = jnp.int32(0)
for _ in range(runs):
  bad = bad + mismatches(f(*xs), xs)
bad = int(bad)
jaxll.check_errors()
if bad:
  print(f"INDEPENDENT_CALLS FAILED: {bad} elements differ from the input")
  sys.exit(1)
print(f"INDEPENDENT_CALLS OK {runs * len(sites)}")
