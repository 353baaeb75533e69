"""Launcher check on CPU: join jax.distributed, run jaxll.all_reduce over the
global mesh (it lowers to XLA's all-reduce on CPU, through gloo), report."""
import os
import sys

import jax

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_cpu_collectives_implementation", "gloo")

from jaxll.tools import launch  # noqa: E402

mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
pid = launch.init_worker()
launch.progress("joined")
if mode == "fail" and pid == 1:
  os._exit(3)  # a crash: no jax.distributed shutdown
if mode == "hang" and pid == 0:
  import time
  time.sleep(3600)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jaxll  # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("x",))
local = np.full((1, 4), pid + 1, np.float32)
x = jax.make_array_from_single_device_arrays(
    (jax.device_count(), 4), NamedSharding(mesh, P("x")),
    [jax.device_put(local, d) for d in jax.local_devices()])
f = jax.jit(jax.shard_map(lambda v: jaxll.all_reduce(v, "x"), mesh=mesh,
                          in_specs=P("x"), out_specs=P("x")))
out = f(x)
site = jaxll.explain(f, x)[0]
launch.report({"pid": pid, "processes": jax.process_count(), "devices": jax.device_count(),
               "sum": np.asarray(out.addressable_data(0)).tolist(), "path": site.algorithm})
