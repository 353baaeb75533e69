"""One process of the free-and-rebuild check (run by jaxll.tools.launch; processes
sharing one GPU): a jitted jaxll.all_reduce over a workspace spanning the
processes runs and is checked against numpy; then every process calls
jaxll.free_workspaces() at the same point (collective), the same function runs
again (lowered again, so a new workspace is built: the processes' setups pair
up by count) and is checked again, three times in all. Each round's workspace
id must be new and the old one gone from jaxll.workspaces().

  python free_check.py [--rounds 3] [--platform cpu]

With ``--platform cpu`` (a dry run for CI) the calls lower to XLA's all-reduce
and no workspace is built.
"""
import argparse
import os

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--platform", choices=("gpu", "cpu"), default="gpu")
opts = parser.parse_args()
GPU = opts.platform == "gpu"
if not GPU:
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

if not GPU:
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_cpu_collectives_implementation", "gloo")

from jaxll.tools import launch  # noqa: E402

pid = launch.init_worker()
import jaxll  # noqa: E402

n = jax.device_count()
mesh = jax.make_mesh((n,), ("tp",))
algorithm = "oneshot_ll" if GPU else "auto"
report = {"pid": pid, "errors": [], "workspaces": [], "paths": []}
full = np.arange(n * 1000, dtype=np.float32).reshape(n, 1000) % 97
sharding = NamedSharding(mesh, P("tp"))
x = jax.make_array_from_single_device_arrays(
    full.shape, sharding,
    [jax.device_put(full[i], d) for d, i in sharding.addressable_devices_indices_map(full.shape).items()])
want = full.sum(0)

for r in range(opts.rounds):
  launch.progress(f"round {r}")
  f = jax.jit(jax.shard_map(lambda v: jaxll.all_reduce(v, "tp", algorithm=algorithm),
                            mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))
  report["paths"].append([s.algorithm for s in jaxll.explain(f, x)])
  compiled = f.lower(x).compile()
  launch.barrier()
  got = np.asarray(compiled(x).addressable_data(0))[0]
  if not np.array_equal(got, want):
    report["errors"].append(f"round {r}: {int(np.sum(got != want))} elements off")
  jaxll.check_errors()
  ids = [w.id for w in jaxll.workspaces()]
  report["workspaces"].append(ids)
  if GPU and (len(ids) != 1 or any(ids[0] in earlier for earlier in report["workspaces"][:-1])):
    report["errors"].append(f"round {r}: workspaces {ids} (earlier {report['workspaces'][:-1]})")
  jaxll.free_workspaces()
  if jaxll.workspaces():
    report["errors"].append(f"round {r}: workspaces left after free_workspaces")
launch.report(report)
