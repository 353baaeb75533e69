"""Does XLA put jaxll's custom calls into command buffers (CUDA graphs)?

For a jitted chain of K custom calls, prints the time per call in steady state
(jaxll.tools.bench.timing.steady_per_call_us) for the no-op FFI call (jaxll_noop) and for
jaxll.all_reduce on a one-device mesh. Run it
under different XLA_FLAGS to compare, e.g. with command buffers off:
XLA_FLAGS=--xla_gpu_enable_command_buffer=

  python benchmarks/cmd_buffer_probe.py
"""
import functools
import os

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll
from jaxll.tools.bench.timing import steady_per_call_us

K, RUNS, REPS = 200, 20, 9


def report(name, f, x):
  print(f"{name:36s} per call: {steady_per_call_us(f, x, K, RUNS, REPS):6.2f} us", flush=True)


dev = jax.devices("cuda")[0]
print("XLA_FLAGS =", repr(os.environ.get("XLA_FLAGS", "")))
noop = jax.ffi.ffi_call("jaxll_noop", jax.ShapeDtypeStruct((4,), np.float32),
                        input_output_aliases={0: 0})


@functools.partial(jax.jit, donate_argnums=0)
def noop_chain(v):
  for _ in range(K):
    v = noop(v)
  return v


report("jaxll_noop chain", noop_chain, jax.device_put(np.ones(4, np.float32), dev))

mesh = jax.make_mesh((1,), ("x",), devices=[dev])
xs = jax.device_put(np.ones(1024, np.float32), NamedSharding(mesh, P("x")))
for algo in ("oneshot_ll", "xla"):
  def body(v, algo=algo):
    for _ in range(K):
      v = jaxll.all_reduce(v, "x", algorithm=algo)
    return v
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")),
              donate_argnums=0)
  report(f"all_reduce({algo}) chain, 1 GPU", f, xs)
