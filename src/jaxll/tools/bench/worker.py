"""One process of ``python -m jaxll.tools.bench --mode processes`` (run by
jaxll.tools.launch).

Every process joins jax.distributed; on the global mesh (one device per process)
it times, for each size and algorithm, a jitted shard_map chain of dependent
steps ``w = v + all_reduce(w)`` (or the all-gather / reduce-scatter step of
``timing.chain_step``) in steady state (timing.py), and the same
chain with jaxll's empty-kernel custom call in place of the collective (the
custom-call floor of that setting). The programs are timed in interleaved
repetitions, so drifts hit all of them alike. Reports per-process medians.

  python -m jaxll.tools.bench.worker --sizes 4096 --algorithms oneshot_ll --chain 200 --runs 20 --reps 9
"""
import argparse
import statistics


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--sizes", type=int, nargs="+", required=True)
  p.add_argument("--algorithms", nargs="+", required=True)
  p.add_argument("--dtype", default="float32")
  p.add_argument("--collective", default="all_reduce")
  p.add_argument("--chain", type=int, default=200)
  p.add_argument("--runs", type=int, default=20)
  p.add_argument("--reps", type=int, default=9)
  opts = p.parse_args()

  from jaxll.tools import launch
  pid = launch.init_worker()

  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxll
  from jaxll.tools.bench.timing import chain_step, steady_per_call_us

  n = jax.device_count()
  mesh = jax.make_mesh((n,), ("x",))
  dt = np.dtype(jax.numpy.dtype(opts.dtype))

  def noop(w):
    return jax.ffi.ffi_call("jaxll_noop", jax.ShapeDtypeStruct(w.shape, w.dtype),
                            input_output_aliases={0: 0})(w)

  def chain_of(step):
    def body(v):
      w = v
      for _ in range(opts.chain):
        w = v + step(w)
      return w
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")),
                   donate_argnums=0)

  programs = []  # (size, name, compiled function, input)
  paths = {}
  for nbytes in opts.sizes:
    count = max(1, nbytes // dt.itemsize)
    local = (np.random.default_rng(pid).random((1, count)) * 1e-3).astype(dt)
    x = jax.make_array_from_single_device_arrays(
        (n, count), NamedSharding(mesh, P("x")),
        [jax.device_put(local, d) for d in jax.local_devices()])
    programs.append((nbytes, "floor", chain_of(noop), x))
    for algo in opts.algorithms:
      f = chain_of(chain_step(opts.collective, algo, n))
      try:
        paths[f"{nbytes}:{algo}"] = jaxll.explain(f, x)[0].algorithm
      except jaxll.AlgorithmUnavailableError as e:  # e.g. no sentinel kernel for int32
        paths[f"{nbytes}:{algo}"] = f"n/a: {e}"
        continue
      programs.append((nbytes, algo, f, x))
  # Compile everything, meet, then run: no process loads a module while its
  # peers' kernels already spin on a shared GPU waiting for it.
  from jaxll import internals
  programs = [(b, name, f.lower(x).compile(), x) for b, name, f, x in programs]
  internals.distributed_client().wait_at_barrier("jaxll-bench-compiled", 300_000)
  for _, _, f, x in programs:
    jax.block_until_ready(f(jax.numpy.copy(x)))  # (f donates its argument)
  launch.progress("compiled")
  samples = {(b, name): [] for b, name, _, _ in programs}
  for _ in range(opts.reps):
    for b, name, f, x in programs:
      samples[b, name].append(steady_per_call_us(f, x, opts.chain, opts.runs, 1))
  jaxll.check_errors()
  launch.report({"pid": pid, "devices": n, "paths": paths,
                 "us": {f"{b}:{name}": statistics.median(v) for (b, name), v in samples.items()}})


if __name__ == "__main__":
  main()
