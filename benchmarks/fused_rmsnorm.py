"""jaxll.all_reduce_rmsnorm: the fused kernel (algorithm="fused", or the
--fused variants) against the composition (jaxll.all_reduce with --composed,
default auto, then XLA's fused norm math), per call,
in steady state: a jitted chain of --chain steps ``(x, r) = f(x, r, w)`` (as in
a decoder, where the normed output feeds the next layer's matmul and the new
residual its residual add; here normed stands in for the next layer's partial
sums), compiled once, run --runs times back to back with one
sync at the end (a rep), for --reps reps, the chains taking turns rep by rep;
the median per step is kept, and beside the ratio of the medians the median of
the reps' ratios, composed rep over the fused rep timed after it ("paired");
"host" is the part of a step until the calls returned, before the sync: near
the whole step, the host is what bounds it. Without --donate each run's x and
residual are new buffers and XLA records its command buffers again at every
run (on one H200 that bound the steps of 2 processes and of virtual ranks, not
those of 8 processes); --donate keeps the addresses, XLA replays the recorded
command buffers and the device bounds the steps. Runs in N
jax.distributed processes (jaxll.tools.launch; they share GPU 0 where there are fewer
GPUs), shapes of decode steps (tokens x hidden). --profile adds the device
time per kernel of one run of each chain (process 0, JAX's profiler).

--virtual N[,N...] runs the same two chains in this one process on N virtual
ranks of GPU 0 instead (jaxll.tools.testing: every call forks onto the N ranks'
streams, or with --launch one runs all N ranks as one kernel launch, one graph
node instead of a fork, N kernels and a join; --launch streams,one does both,
a row each; the composed step is the virtual all-reduce (--composed, or the
kernel jaxll.all_reduce's auto table names) and XLA's
norm math over all N ranks' rows, the fused step the virtual fused call; both
captured into XLA's command buffers; that norm math alone is timed too), and
adds the kernels' own times from
CUDA graphs of back-to-back calls (the fused kernel; the composition's
all-reduce of the same bytes; the graph floor).

  python benchmarks/fused_rmsnorm.py --processes 2 --json out.json
  python benchmarks/fused_rmsnorm.py --processes 8 --shapes 1x8192,2x8192,4x8192,8x8192,16x8192,32x8192,64x8192,128x8192
  python benchmarks/fused_rmsnorm.py --virtual 2,8 --shapes 1x8192,16x8192
  python benchmarks/fused_rmsnorm.py --virtual 2,8 --fused fused_ll,fused_sentinel
  python benchmarks/fused_rmsnorm.py --virtual 2,8 --launch streams,one --donate
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

SHAPES = [(1, 4096), (8, 4096), (1, 8192), (8, 8192), (32, 8192)]


# the fused variants (all_reduce_rmsnorm's algorithm names) and their protocols
PROTOCOLS = {"fused": "auto", "fused_ll": "ll", "fused_sentinel": "sentinel",
             "fused_twoshot_ll": "twoshot_ll", "fused_twoshot_sentinel": "twoshot_sentinel"}


def parse_launch(text: str) -> list[str]:
  """"streams,one" -> the virtual launch modes."""
  modes = [v.strip() for v in text.split(",") if v.strip()]
  if not modes or any(m not in ("streams", "one") for m in modes):
    raise argparse.ArgumentTypeError(f"--launch takes streams and/or one; got {text!r}")
  return modes


def parse_fused(text: str) -> list[str]:
  """"fused_ll,fused_sentinel" -> the variants, each a key of PROTOCOLS."""
  names = [v.strip() for v in text.split(",") if v.strip()]
  bad = [v for v in names if v not in PROTOCOLS]
  if not names or bad:
    raise argparse.ArgumentTypeError(f"--fused takes {', '.join(PROTOCOLS)}; got {text!r}")
  return names


def protocol_serves(n: int, tokens: int, hidden: int, protocol: str) -> bool:
  """Whether the virtual fused call can run this protocol for the shape (bf16):
  auto and LL16 serve every shape; sentinel and the two-shot exchanges refuse
  some (asked of the kernel by one untimed call, which raises ValueError)."""
  if protocol in ("auto", "ll"):
    return True
  from jaxll.tools import testing
  try:
    testing.rmsnorm_kernel_time_us(n, tokens, hidden, iters=1, reps=1, protocol=protocol)
  except ValueError:
    return False
  return True


def parse_shapes(text: str) -> list[tuple[int, int]]:
  """"1x8192,8x8192" -> [(1, 8192), (8, 8192)] (tokens x hidden, both positive)."""
  shapes = []
  for part in text.split(","):
    try:
      tokens, hidden = (int(v) for v in part.lower().split("x"))
    except ValueError:
      raise argparse.ArgumentTypeError(f"a shape is TOKENSxHIDDEN, got {part!r}") from None
    if tokens < 1 or hidden < 1:
      raise argparse.ArgumentTypeError(f"tokens and hidden must be positive, got {part!r}")
    shapes.append((tokens, hidden))
  return shapes


def donation(donate: bool):
  """(donate_argnums for the chains, fresh(x, r): what a call may be given):
  with --donate the chains take x and the residual as donated buffers, so
  each call is given copies (a donated array is gone after the call)."""
  if not donate:
    return (), lambda x, r: (x, r)
  import jax.numpy as jnp
  return (0, 1), lambda x, r: (jnp.copy(x), jnp.copy(r))


def worker(opts) -> None:
  import jax
  if opts.cpu:  # a dry run of the harness on CPU devices (XLA's path everywhere)
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from jaxll.tools import launch
  launch.init_worker()
  import jaxll
  from jaxll import rmsnorm as fused

  n = jax.device_count()
  mesh = jax.make_mesh((n,), ("tp",))
  donated, fresh = donation(opts.donate)

  def put(full, spec):
    sharding = NamedSharding(mesh, spec)
    idx = sharding.addressable_devices_indices_map(full.shape)
    return jax.make_array_from_single_device_arrays(
        full.shape, sharding, [jax.device_put(full[i], d) for d, i in idx.items()])

  rows = []
  for tokens, hidden in opts.shapes:
    rng = np.random.default_rng(tokens + hidden)
    x = put(rng.standard_normal((n * tokens, hidden)).astype(jnp.bfloat16), P("tp"))
    r0 = put(rng.standard_normal((tokens, hidden)).astype(jnp.bfloat16), P())
    w = put(np.ones(hidden, jnp.bfloat16), P())
    row = {"tokens": tokens, "hidden": hidden, "dtype": "bfloat16", "ranks": n,
           "donate": opts.donate}
    composed = "auto" if opts.cpu else opts.composed  # (a forced kernel refuses CPU)

    def composed_step(x, r, w):  # jaxll.all_reduce, then XLA's norm math
      return fused.residual_rmsnorm(jaxll.all_reduce(x, "tp", algorithm=composed), r, w, eps=1e-6)

    def fused_step(algorithm):
      return lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp", algorithm=algorithm)

    compiled = {}
    for name, step in [("composed", composed_step)] + [(v, fused_step(v)) for v in opts.fused]:
      def chain(x, r, w, step=step):
        for _ in range(opts.chain):  # unrolled: a while loop would sync the host every step
          x, r = step(x, r, w)
        return x, r
      f = jax.jit(jax.shard_map(chain, mesh=mesh, in_specs=(P("tp"), P(), P()),
                                out_specs=(P("tp"), P()), check_vma=False), donate_argnums=donated)
      try:
        row[f"{name}_paths"] = sorted({s.algorithm for s in jaxll.explain(f, x, r0, w)})
        compiled[name] = f.lower(x, r0, w).compile()
      except ValueError as e:  # (fused_sentinel on a shape it cannot serve; every rank alike)
        row[f"{name}_paths"], row[f"{name}_us"] = [f"n/a: {e}"], None
        continue
      launch.barrier()
      jax.block_until_ready(compiled[name](*fresh(x, r0), w))
    # every process times the same chain at once (a barrier before each rep)
    times = time_interleaved(compiled, (x, r0, w), opts.runs, opts.reps, opts.chain,
                             before_rep=launch.barrier, fresh=fresh)
    add_times(row, times)
    for name, f in (compiled.items() if opts.profile else ()):
      def traced(f=f):
        launch.barrier()  # (after the profiler started on process 0: see tp_decode)
        xs, r = fresh(x, r0)
        for _ in range(2):
          xs, r = f(xs, r, w)
        r.block_until_ready()
      if jax.process_index() == 0:
        from jaxll.tools import profile as kernel_profile
        ktimes = kernel_profile.kernel_times(traced, f"/tmp/jaxll_fused_trace_{os.getpid()}")
        steps = 2 * opts.chain
        row[f"{name}_kernels"] = {kernel_profile.short_name(k): [c / steps, t / steps]
                                  for k, (c, t) in ktimes.items()}
      else:
        traced()
    # (what algorithm="auto" takes for this shape; not timed: it is one of the two)
    auto = jax.shard_map(lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp"), mesh=mesh,
                         in_specs=(P("tp"), P(), P()), out_specs=(P("tp"), P()), check_vma=False)
    row["auto_paths"] = sorted({s.algorithm for s in jaxll.explain(jax.jit(auto), x, r0, w)})
    add_speedups(row, opts.fused)
    rows.append(row)
  jaxll.check_errors()
  launch.report({"rows": rows})


def add_speedups(row: dict, variants: list[str]) -> None:
  """`{variant}_speedup`: the composed step's median over that fused variant's
  (None where it did not run); `{variant}_paired_speedup`: the median over
  reps of the ratio of the two reps timed one after the other (drift in clocks
  or load between reps cancels); `speedup`: the first variant's."""
  for v in variants:
    us = row.get(f"{v}_us")
    row[f"{v}_speedup"] = row["composed_us"] / us if us else None
    pairs = zip(row.get("composed_reps_us", []), row.get(f"{v}_reps_us") or [])
    ratios = [c / f for c, f in pairs]
    row[f"{v}_paired_speedup"] = statistics.median(ratios) if us and ratios else None
  row["speedup"] = row[f"{variants[0]}_speedup"]


def time_interleaved(compiled: dict, args, runs: int, reps: int, chain: int,
                     before_rep=None, fresh=None) -> dict[str, dict[str, list[float]]]:
  """Per compiled chain (name -> executable), per rep, the time per step
  ("reps") and the host's share of it ("dispatch": until the last of the
  calls returned, before the sync), us; a rep is `runs` back-to-back calls
  with one sync at the end. The chains take turns rep by rep (composed,
  fused, ..., composed, ...), so a slow spell of the device falls on all of
  them rather than on one. `fresh(x, r)`: what a rep starts from (donation's:
  copies, ready before the rep's clock starts)."""
  import jax
  out = {name: {"reps": [], "dispatch": []} for name in compiled}
  for _ in range(reps):
    for name, f in compiled.items():
      if before_rep is not None:
        before_rep()
      xs, r, w = args
      if fresh is not None:
        xs, r = jax.block_until_ready(fresh(xs, r))
      t0 = time.perf_counter()
      for _ in range(runs):
        xs, r = f(xs, r, w)
      t1 = time.perf_counter()
      r.block_until_ready()
      t2 = time.perf_counter()
      out[name]["reps"].append((t2 - t0) / (runs * chain) * 1e6)
      out[name]["dispatch"].append((t1 - t0) / (runs * chain) * 1e6)
  return out


def add_times(row: dict, times: dict[str, dict[str, list[float]]]) -> None:
  """`{name}_us` (median per step), `{name}_reps_us` (every rep's) and
  `{name}_dispatch_us` (median of the host's share) per chain."""
  for name, t in times.items():
    row[f"{name}_reps_us"] = t["reps"]
    row[f"{name}_us"] = statistics.median(t["reps"])
    row[f"{name}_dispatch_us"] = statistics.median(t["dispatch"])


def virtual_rows(opts) -> list[dict]:
  """The two chains on N virtual ranks of GPU 0, per N of --virtual and shape
  (each row also written to --json as soon as it is measured)."""
  # (every virtual rank's kernel needs a hardware queue of its own: before CUDA starts)
  os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
  import jax
  import jax.numpy as jnp
  import numpy as np

  from jaxll import algorithms, choice
  from jaxll import rmsnorm as fused
  from jaxll.tools import testing

  try:
    dev = jax.devices("cuda")[0]
  except RuntimeError:
    sys.exit("fused_rmsnorm.py --virtual needs a CUDA GPU (virtual ranks run jaxll's kernels)")
  donated, fresh = donation(opts.donate)
  rows, floors = [], {}
  for n, launch, (tokens, hidden) in ((n, l, s) for n in opts.virtual for l in opts.launch
                                      for s in opts.shapes):
    one_launch = launch == "one"
    if (n, launch) not in floors:
      floors[n, launch] = statistics.median(testing.graph_floor_us(
          n, iters=opts.graph_iters, one_launch=one_launch))
    floor = floors[n, launch]
    rng = np.random.default_rng(tokens + hidden)
    x = jax.device_put(jnp.asarray(rng.standard_normal((n, tokens, hidden)), jnp.bfloat16), dev)
    r0 = jnp.broadcast_to(jnp.asarray(rng.standard_normal((tokens, hidden)), jnp.bfloat16),
                          (n, tokens, hidden))
    r0 = jax.device_put(r0, dev)
    w = jax.device_put(jnp.ones(hidden, jnp.bfloat16), dev)
    cb = not opts.no_command_buffer
    t_row = time.perf_counter()
    row = {"mode": "virtual", "tokens": tokens, "hidden": hidden, "dtype": "bfloat16",
           "ranks": n, "launch": launch, "command_buffer": cb, "donate": opts.donate}

    # (auto: the kernel jaxll.all_reduce's auto table names for this group
    # and size; a virtual call needs one named)
    ar = opts.composed
    if ar == "auto":
      ar = choice.choose_auto(n, tokens * hidden * 2, np.dtype(jnp.bfloat16), "sum")[0]
      ar = "oneshot_ll" if ar == algorithms.XLA else ar
    row["composed_algorithm"] = ar

    def composed(x, r, w, ar=ar):
      y = testing.virtual_all_reduce(x, algorithm=ar, device=dev, command_buffer=cb,
                                     one_launch=one_launch)
      return fused.residual_rmsnorm(y, r, w, eps=1e-6)

    def fused_step(x, r, w, protocol="auto"):
      return testing.virtual_fused_rmsnorm(x, r, w, eps=1e-6, device=dev, command_buffer=cb,
                                           protocol=protocol, one_launch=one_launch)

    # (xla_norm: XLA's norm math alone over the N ranks' rows, the
    # composed step's part after its all-reduce; timed, not compared)
    steps = [("composed", composed)] + [
        (v, functools.partial(fused_step, protocol=PROTOCOLS[v])) for v in opts.fused] + [
        ("xla_norm", lambda x, r, w: fused.residual_rmsnorm(x, r, w, eps=1e-6))]
    compiled, one = {}, {}
    for name, step in steps:
      if name in PROTOCOLS and not protocol_serves(n, tokens, hidden, PROTOCOLS[name]):
        row[f"{name}_us"] = row[f"{name}_kernel_us"] = None
        continue
      def chain(x, r, w, step=step):
        for _ in range(opts.chain):
          x, r = step(x, r, w)
        return x, r
      compiled[name] = jax.jit(chain, donate_argnums=donated).lower(x, r0, w).compile()
      jax.block_until_ready(compiled[name](*fresh(x, r0), w))
      one[name] = [np.asarray(v.astype(jnp.float32)) for v in jax.jit(step)(x, r0, w)]
      if name in PROTOCOLS:
        row[f"{name}_kernel_us"] = statistics.median(testing.rmsnorm_kernel_time_us(
            n, tokens, hidden, dtype="bfloat16", iters=opts.graph_iters,
            protocol=PROTOCOLS[name], one_launch=one_launch)) - floor
        # one step of each, compared (XLA's mean adds in its own order: normed
        # may differ in the last bit; new_residual is the same sum, rounded once)
        row[f"{name}_new_residual_equal"] = bool(np.array_equal(one["composed"][1], one[name][1]))
        row[f"{name}_normed_max_abs_diff"] = float(
            np.max(np.abs(one["composed"][0] - one[name][0])))
    t_timed = time.perf_counter()
    add_times(row, time_interleaved(compiled, (x, r0, w), opts.runs, opts.reps, opts.chain,
                                    fresh=fresh))
    row["timed_wall_s"] = time.perf_counter() - t_timed
    add_speedups(row, opts.fused)
    row["all_reduce_kernel_us"] = statistics.median(testing.kernel_time_us(
        n, tokens * hidden * 2, dtype="bfloat16", algorithm=ar,
        iters=opts.graph_iters, one_launch=one_launch)) - floor
    row["graph_floor_us"] = floor
    row["row_wall_s"] = time.perf_counter() - t_row
    rows.append(row)
    if opts.json:  # (after every row: a run cut short keeps the rows it finished)
      with open(opts.json, "w") as f:
        json.dump({"virtual": opts.virtual, "launch": opts.launch, "rows": rows}, f, indent=1)
    fused_text = "; ".join(
        f"{v} n/a" if row[f"{v}_us"] is None else
        f"{v} {row[f'{v}_us']:7.2f} us (host {row[f'{v}_dispatch_us']:.2f}), {row[f'{v}_speedup']:.2f}x, paired {row[f'{v}_paired_speedup']:.2f}x (kernel {row[f'{v}_kernel_us']:.2f} us, "
        f"new_residual equal: {row[f'{v}_new_residual_equal']}, normed max |diff| "
        f"{row[f'{v}_normed_max_abs_diff']:.3g})" for v in opts.fused)
    print(f"{tokens:3d} x {hidden:5d} bf16, {n} virtual ranks ({launch}): composed ({ar}) {row['composed_us']:7.2f} us "
          f"(host {row['composed_dispatch_us']:.2f}); "
          f"{fused_text}; XLA's norm alone {row['xla_norm_us']:.2f} us; kernels above the graph "
          f"floor ({floor:.2f} us), all-reduce ({ar}) {row['all_reduce_kernel_us']:.2f} us", flush=True)
  return rows


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--processes", type=int, default=2)
  p.add_argument("--chain", type=int, default=64)
  p.add_argument("--runs", type=int, default=20)
  p.add_argument("--reps", type=int, default=9)
  p.add_argument("--json", default=None)
  p.add_argument("--shapes", type=parse_shapes, default=SHAPES,
                 help="tokens x hidden per rank, e.g. 1x8192,8x8192 (default: "
                      + ",".join(f"{t}x{h}" for t, h in SHAPES) + ")")
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--cpu", action="store_true", help="dry run on CPU devices (no kernels)")
  p.add_argument("--profile", action="store_true",
                 help="also the device time per kernel and step (JAX's profiler, process 0)")
  p.add_argument("--virtual", type=lambda t: [int(v) for v in t.split(",")], default=None,
                 help="N[,N...]: virtual ranks of GPU 0 in this process instead of processes")
  p.add_argument("--graph-iters", type=int, default=200,
                 help="--virtual: calls per CUDA graph for the kernel times")
  p.add_argument("--composed", default="auto",
                 help="the composition's all-reduce algorithm (default auto: jaxll.all_reduce's "
                      "own choice; --virtual: the kernel its auto table names)")
  p.add_argument("--fused", type=parse_fused, default=["fused"],
                 help="fused variants to time against the composition, comma-separated: "
                      "fused (the kernel's protocol choice), fused_ll, fused_sentinel, "
                      "fused_twoshot_ll, fused_twoshot_sentinel")
  p.add_argument("--donate", action="store_true",
                 help="compile the chains with x and the residual donated: the buffers keep their "
                      "addresses from run to run, so XLA replays its command buffers rather than "
                      "recording them again at every run, and the host runs ahead of the device")
  p.add_argument("--launch", type=parse_launch, default=["streams"],
                 help="--virtual: how each virtual call runs, comma-separated: streams (forked "
                      "onto the ranks' streams, a kernel each; default), one (every rank in one "
                      "kernel launch)")
  p.add_argument("--no-command-buffer", action="store_true",
                 help="--virtual: keep the virtual calls out of XLA's command buffers")
  opts = p.parse_args()
  if opts.virtual:
    if any(not 1 <= n <= 8 for n in opts.virtual):
      sys.exit("--virtual takes rank counts in 1..8")
    virtual_rows(opts)
    return
  if opts.worker:
    worker(opts)
    return
  from jaxll.tools import launch
  args = ["--worker", "--chain", str(opts.chain), "--runs", str(opts.runs),
          "--reps", str(opts.reps), "--shapes", ",".join(f"{t}x{h}" for t, h in opts.shapes),
          "--fused", ",".join(opts.fused), "--composed", opts.composed] + (["--cpu"] if opts.cpu else []) + (
              ["--profile"] if opts.profile else []) + (["--donate"] if opts.donate else [])
  gpus = [str(i) for i in range(opts.processes)]
  try:
    if opts.cpu:
      raise ImportError
    import subprocess
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    if sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) < opts.processes:
      gpus = ["0"] * opts.processes
  except ImportError:
    gpus = None
  except (OSError, subprocess.SubprocessError):
    sys.exit("fused_rmsnorm.py needs NVIDIA GPUs (or --cpu for a dry run)")
  workers = launch.run(os.path.abspath(__file__), opts.processes, args=args, timeout=1800,
                       devices=gpus, mps=False if opts.cpu else "auto", env={"XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                                          "NCCL_NVLS_ENABLE": "0"})
  rows = workers[0].result["rows"]
  for r in rows:
    fused_text = "; ".join(
        f"{v} n/a" if r[f"{v}_us"] is None else
        f"{v} {r[f'{v}_us']:7.2f} us (host {r[f'{v}_dispatch_us']:.2f}; {','.join(r[f'{v}_paths'])}), "
        f"{r[f'{v}_speedup']:.2f}x, "
        f"paired {r[f'{v}_paired_speedup']:.2f}x"
        for v in opts.fused)
    print(f"{r['tokens']:3d} x {r['hidden']:5d} bf16, {r['ranks']} ranks: composed "
          f"{r['composed_us']:7.2f} us (host {r['composed_dispatch_us']:.2f}; "
          f"{','.join(r['composed_paths'])}); {fused_text}; "
          f"auto: {','.join(r['auto_paths'])}")
    for name in ["composed"] + opts.fused:
      for kernel, (launches, us) in sorted(r.get(f"{name}_kernels", {}).items(), key=lambda kv: -kv[1][1]):
        print(f"    {name:8s} {us:7.2f} us/step in {launches:4.1f} launches/step of {kernel}")
  if opts.json:
    with open(opts.json, "w") as f:
      json.dump({"gpus": gpus, "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
