"""What ``jaxll.route`` costs per call: a jitted tensor-parallel MLP step
(sequence-parallel input gathered with all_gather, the row-parallel partial
sums reduced with psum, the gradients of the input, whose backward is a
psum_scatter, and of both weights, an SGD update, all in one shard_map over
the "tp" axis), called in a loop of --calls calls with the
same arguments, timed as the unrouted step, ``jaxll.route(step)`` and
``jax.jit(jaxll.route(step))``. Each is called once first (trace and compile);
the timed loops then take no trace and no compile (counted, and the run fails
otherwise). The three loops take turns for --reps repetitions; each variant's
median time per call is kept, with its ratio to the unrouted step's median and
the median of its per-rep ratios to the unrouted loop of the same rep
("paired").

On GPUs a loop synchronizes once, at its end. On CPU devices every call is
waited for: XLA's CPU collectives deadlock when the runs of several calls
overlap on the virtual devices (a rendezvous that waits for a device busy in
the next run), so a CPU figure is the whole step, dispatch and execution.

--dispatch adds the part that is route's own: a one-device step with no
collective (two elementwise ops), called without waiting, unrouted against
routed, the same loops; the difference is the Python that looks the call's
signature up.

  python benchmarks/route_cost.py --cpu --out benchmarks/results/cpu_route_cost.json
  python benchmarks/route_cost.py --calls 500 --reps 21
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--cpu", action="store_true",
                 help="8 virtual CPU devices (XLA's path for every call site)")
  p.add_argument("--devices", type=int, default=8, help="devices of the tp axis (default 8)")
  p.add_argument("--calls", type=int, default=200, help="calls per timed loop (default 200)")
  p.add_argument("--reps", type=int, default=15, help="timed loops per variant (default 15)")
  p.add_argument("--tokens", type=int, default=64, help="rows of the activations (default 64)")
  p.add_argument("--hidden", type=int, default=256, help="model width (default 256)")
  p.add_argument("--ffn", type=int, default=1024, help="MLP width (default 1024)")
  p.add_argument("--dispatch", action="store_true",
                 help="also time route's own part on a one-device step without collectives")
  p.add_argument("--out", help="write the results as JSON here")
  return p.parse_args(argv)


def make_step(jax, mesh, lr=1e-3):
  """The jitted step: (x, w_in, w_out) -> (loss, x's gradient, w_in', w_out')."""
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P

  def loss(x, w_in, w_out):
    h = jax.lax.all_gather(x, "tp", axis=0, tiled=True)   # sequence-parallel rows
    a = jnp.tanh(h @ w_in)                                  # column-parallel
    y = jax.lax.psum(a @ w_out, "tp")                       # row-parallel partial sums
    return jnp.mean(y * y)

  def body(x, w_in, w_out):
    value, (g_x, g_in, g_out) = jax.value_and_grad(loss, argnums=(0, 1, 2))(x, w_in, w_out)
    return value, g_x, w_in - lr * g_in, w_out - lr * g_out

  specs = (P("tp", None), P(None, "tp"), P("tp", None))
  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs,
                               out_specs=(P(),) + specs)), specs


def time_loops(jax, variants, args, calls, reps, sync_each):
  """Per variant, the seconds per call of each rep (the variants take turns)."""
  times = {name: [] for name in variants}
  for _ in range(reps):
    for name, fn in variants.items():
      t0 = time.perf_counter()
      out = None
      for _ in range(calls):
        out = fn(*args)
        if sync_each:
          jax.block_until_ready(out)
      jax.block_until_ready(out)
      times[name].append((time.perf_counter() - t0) / calls)
  return times


def summarize(times, base):
  """Per variant: median, min and max per call, the ratio of its median to the
  unrouted one's, and the median over reps of its loop's time over the
  unrouted loop's of the same rep ("paired": slow drifts of the machine cancel)."""
  rows = []
  ref = statistics.median(times[base])
  for name, ts in times.items():
    med = statistics.median(ts)
    paired = statistics.median(t / b for t, b in zip(ts, times[base]))
    rows.append({"variant": name, "median_us": round(med * 1e6, 2),
                 "min_us": round(min(ts) * 1e6, 2), "max_us": round(max(ts) * 1e6, 2),
                 "vs_unrouted": round(med / ref, 4), "paired": round(paired, 4)})
  return rows


def table(title, rows):
  lines = [title, f"{'variant':<22} {'median us':>10} {'min us':>9} {'max us':>9} "
                  f"{'vs unrouted':>12} {'paired':>7}"]
  for r in rows:
    lines.append(f"{r['variant']:<22} {r['median_us']:>10.1f} {r['min_us']:>9.1f} "
                 f"{r['max_us']:>9.1f} {r['vs_unrouted']:>12.3f} {r['paired']:>7.3f}")
  return "\n".join(lines)


def main(argv=None):
  opts = parse_args(argv)
  if opts.cpu:
    flag = f"--xla_force_host_platform_device_count={opts.devices}"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    os.environ["JAX_PLATFORMS"] = "cpu"
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import NamedSharding

  import jaxll

  devices = jax.devices()[:opts.devices]
  if len(devices) < opts.devices:
    sys.exit(f"route_cost.py needs {opts.devices} devices, jax sees {len(jax.devices())} "
             f"(--cpu for virtual CPU devices)")
  on_cpu = devices[0].platform == "cpu"
  mesh = jax.make_mesh((opts.devices,), ("tp",), devices=devices)
  step, specs = make_step(jax, mesh)
  rng = np.random.default_rng(0)
  shapes = ((opts.tokens, opts.hidden), (opts.hidden, opts.ffn), (opts.ffn, opts.hidden))
  args = tuple(jax.device_put(0.05 * rng.standard_normal(s).astype(np.float32),
                              NamedSharding(mesh, spec)) for s, spec in zip(shapes, specs))
  variants = {"unrouted": step, "jaxll.route(step)": jaxll.route(step),
              "jit(jaxll.route(step))": jax.jit(jaxll.route(step))}
  outs = {name: jax.block_until_ready(fn(*args)) for name, fn in variants.items()}
  # The routed steps compute the unrouted one's bits where every collective is
  # XLA's (CPU); on GPUs jaxll's kernels sum in rank order and XLA compiles a
  # different program around them, so there the results agree within rounding.
  for name, out in outs.items():
    for a, b in zip(out, outs["unrouted"]):
      a, b = np.asarray(a), np.asarray(b)
      same = np.array_equal(a, b) if on_cpu else np.allclose(a, b, rtol=1e-4, atol=1e-6)
      if not same:
        sys.exit(f"{name} differs from the unrouted step (largest difference "
                 f"{np.abs(a.astype(np.float64) - b).max():.3g})")
  sites = len(jaxll.explain(jaxll.route(step), *args))
  if sites == 0 or jaxll.explain(step, *args):
    sys.exit("the routed step should have jaxll call sites and the unrouted one none")

  compiles = [0]

  def listener(event, duration_secs, **kwargs):
    if event == COMPILE_EVENT:
      compiles[0] += 1

  def timed(variants, args, calls, sync_each):
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
      return time_loops(jax, variants, args, calls, opts.reps, sync_each)
    finally:
      jax.monitoring.unregister_event_duration_listener(listener)

  step_times = timed(variants, args, opts.calls, sync_each=on_cpu)
  dispatch_rows = None
  if opts.dispatch:
    logging.getLogger("jaxll").setLevel(logging.ERROR)  # (no collective: route warns)
    small = jax.jit(lambda x, y: (x * 2 + y, y - x))
    pair = (jnp.ones(16), jnp.ones(16))
    light = {"unrouted": small, "jaxll.route(step)": jaxll.route(small),
             "jit(jaxll.route(step))": jax.jit(jaxll.route(small))}
    for fn in light.values():
      jax.block_until_ready(fn(*pair))
    dispatch_rows = summarize(timed(light, pair, opts.calls * 10, sync_each=False), "unrouted")
  if compiles[0]:
    sys.exit(f"{compiles[0]} compiles during the timed loops: not steady state")

  rows = summarize(step_times, "unrouted")
  device = f"{len(devices)} x {devices[0].device_kind}"
  host = (f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} at the end "
          f"(other processes share them)")
  method = (f"{opts.calls} calls per loop, {opts.reps} loops per variant taking turns, "
            f"median per call; " + ("every call waited for (CPU)" if on_cpu else
                                    "one sync per loop"))
  print(f"jaxll.route cost, {device}, jax {jax.__version__}: {method}")
  print(f"host: {host}")
  print(f"step: tokens {opts.tokens}, hidden {opts.hidden}, ffn {opts.ffn}; "
        f"{sites} jaxll call sites in the routed step")
  print(table("\nthe tensor-parallel step", rows))
  if dispatch_rows:
    print(table(f"\nroute's own part: a one-device step without collectives, "
                f"{opts.calls * 10} calls per loop, no wait", dispatch_rows))
  if opts.out:
    with open(opts.out, "w") as f:
      json.dump({"device": device, "host": host, "jax": jax.__version__, "method": method,
                 "command": "python benchmarks/route_cost.py " + " ".join(sys.argv[1:]),
                 "step": {"tokens": opts.tokens, "hidden": opts.hidden, "ffn": opts.ffn,
                          "call_sites": sites},
                 "rows": rows, "dispatch": dispatch_rows}, f, indent=1)
      f.write("\n")


if __name__ == "__main__":
  main()
