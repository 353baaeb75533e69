"""One process of a fault-injection run, started by jaxll.tools.launch with N
processes that share the GPU(s). Each scenario runs a jitted step (a chain of
CALLS all-reduces over a mesh axis, its output fed back as the next step's
donated input, as a training loop does) and injects one fault from one process;
every process reports, per step, how long the step took, whether its output was
right, poisoned or wrong, and the exception (type and first line) it raised, if
any, plus what check_errors() and reset() did.

  python fault_checks.py --scenario killed|late|mismatch|skip|layouts

killed    process 1 exits for good before step KILL (process 0 must see the
          failure, never a silent wrong value; reset cannot recover a group with
          a dead rank)
late      process 1 sleeps 0.5 x the timeout before step LATE (must succeed)
mismatch  process 1 calls with another element count at step 10, with another
          dtype at step 20 and another algorithm at step 30; after each, every
          process calls jaxll.reset() and goes on with the same compiled step
skip      process 1 skips step 10; both reset after step 12 and go on
layouts   (4 processes) dp and tp reductions interleaved in one step, and two
          meshes over the same devices (rank orders reversed) used alternately
          in one jitted function, 200 steps each, checked against numpy
"""
import argparse
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--scenario", required=True,
                    choices=("killed", "late", "mismatch", "skip", "layouts"))
parser.add_argument("--dtype", default="float32")
opts = parser.parse_args()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxll.tools import launch  # noqa: E402

pid = launch.init_worker()
import jaxll  # noqa: E402

n = jax.device_count()
CALLS = 8          # all-reduces per step: enough for XLA to record a command buffer
COUNT = 1024
TIMEOUT_MS = jaxll.get_config().timeout_ms
report = {"pid": pid, "n": n, "scenario": opts.scenario, "steps": [], "errors": [],
          "timeout_ms": TIMEOUT_MS, "on_error": jaxll.on_error_mode()}
def first_line(e: BaseException) -> str:
  lines = [l for l in str(e).splitlines() if l.strip()]
  return f"{type(e).__name__}: {lines[0] if lines else ''}"[:400]


mesh = Mesh(np.array(jax.devices()), ("x",))
spec = NamedSharding(mesh, P("x"))


def make_step(count=COUNT, dtype=opts.dtype, algorithm="oneshot_ll"):
  dt = jnp.dtype(dtype)

  def body(v):
    for _ in range(CALLS):
      s = jaxll.all_reduce(v, "x", algorithm=algorithm)
      v = s // n if dt == jnp.int32 else s * dt.type(1.0 / n)
    return v

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")),
              donate_argnums=0)
  x = fresh(count, dtype)
  return f.lower(x).compile(), x


def global_array(sharding, full):
  """The global array whose blocks on this process's devices are cut from
  `full` (no cross-process transfer: XLA's NCCL cannot pair processes that
  share one GPU)."""
  idx = sharding.addressable_devices_indices_map(full.shape)
  return jax.make_array_from_single_device_arrays(
      full.shape, sharding, [jax.device_put(full[idx[d]], d) for d in idx])


def fresh(count=COUNT, dtype=opts.dtype):
  """Every rank holds the value 2 (the averaging step keeps it)."""
  return global_array(spec, np.full((n * count,), 2, dtype=jnp.dtype(dtype)))


def classify(v, want=2):
  a = np.asarray(v.addressable_shards[0].data)
  bits = a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])
  # poison is all-ones bits; the step's averaging turns a float poison into
  # the canonical NaN, which is poison still
  if (bits == np.iinfo(bits.dtype).max).all() or (a.dtype.kind == "f" and np.isnan(a).all()):
    return "poisoned"
  if (a == want).all():
    return "right"
  return "WRONG"


def run_steps(step, x, first, last, inject=None, host_sync=True):
  """Steps first..last-1; inject(i) may replace the step of this process."""
  for i in range(first, last):
    t0 = time.monotonic()
    rec = {"step": i}
    try:
      replaced = inject(i) if inject else None
      if replaced is None:
        x = step(x)
        rec["state"] = classify(x) if host_sync else "?"
      else:
        rec["state"] = replaced
    except Exception as e:  # what the user sees
      rec["exception"] = first_line(e)
      x = None
    rec["seconds"] = round(time.monotonic() - t0, 3)
    report["steps"].append(rec)
    launch.progress(f"step {i}: {rec}")
    if x is None:
      return None
  return x


def checked(label):
  try:
    jaxll.check_errors()
    report[label] = "no error"
  except jaxll.CollectiveError as e:
    report[label] = first_line(e)


def do_reset(label, timeout_s=30):
  t0 = time.monotonic()
  try:
    jaxll.reset(timeout_s=timeout_s)
    report[label] = f"ok in {time.monotonic() - t0:.2f} s"
  except Exception as e:
    report[label] = f"{first_line(e)} after {time.monotonic() - t0:.1f} s"


if opts.scenario == "killed":
  step, x = make_step()
  launch.barrier()
  KILL = 20
  if pid == 1:
    x = run_steps(step, x, 0, KILL)
    launch.report(report)
    os._exit(0)  # gone for good: no goodbye to jax.distributed either
  x = run_steps(step, x, 0, KILL + 5)
  checked("check_errors")
  report["errors_text"] = jaxll.errors()[:1]
  do_reset("reset", timeout_s=10)
  launch.report(report)
  os._exit(0)  # jax.distributed's shutdown would wait for the dead process

elif opts.scenario == "late":
  step, x = make_step()
  launch.barrier()
  LATE = 10

  def inject(i):
    if pid == 1 and i == LATE:
      time.sleep(0.5 * TIMEOUT_MS / 1000)
    return None

  run_steps(step, x, 0, 20, inject)
  checked("check_errors")

elif opts.scenario == "mismatch":
  step, x = make_step()
  others = {10: make_step(count=COUNT - 7)[0],
            20: make_step(dtype="int32" if opts.dtype != "int32" else "float32")[0],
            30: make_step(algorithm="twoshot_ll")[0]}
  other_in = {10: lambda: fresh(COUNT - 7),
              20: lambda: fresh(dtype="int32" if opts.dtype != "int32" else "float32"),
              30: lambda: fresh()}
  launch.barrier()
  for start in (0, 10, 20, 30):
    def inject(i, start=start):
      if pid == 1 and i == start and start:
        out = others[start](other_in[start]())
        return "other call: " + classify(out)
      return None
    x = run_steps(step, x if x is not None else fresh(), start, start + 10, inject)
    checked(f"check_errors_after_{start + 9}")
    if start and report[f"check_errors_after_{start + 9}"] != "no error":
      launch.barrier()
      do_reset(f"reset_after_{start + 9}")
      x = None
  checked("check_errors_at_end")

elif opts.scenario == "skip":
  step, x = make_step()
  launch.barrier()

  def inject(i):
    return "skipped" if pid == 1 and i == 10 else None

  x = run_steps(step, x, 0, 13, inject)
  checked("check_errors_after_12")
  launch.barrier()
  do_reset("reset")
  run_steps(step, fresh(), 13, 30)
  checked("check_errors_at_end")

elif opts.scenario == "layouts":
  if n != 4:
    raise SystemExit("layouts needs 4 processes")
  grid = Mesh(np.array(jax.devices()).reshape(2, 2), ("dp", "tp"))
  rng = np.random.default_rng(0)
  full = rng.integers(-50, 50, size=(4, 256)).astype(np.float32)

  def dp_tp(v):
    a = jaxll.all_reduce(v, "tp")
    b = jaxll.all_reduce(a, "dp")
    c = jaxll.all_reduce(v * 2, "tp")
    d = jaxll.all_reduce(c + b, ("dp", "tp"))
    return jaxll.all_reduce(d, "dp") * np.float32(1 / 8)

  f = jax.jit(jax.shard_map(dp_tp, mesh=grid, in_specs=P(("dp", "tp")),
                            out_specs=P(("dp", "tp"))))
  x = global_array(NamedSharding(grid, P(("dp", "tp"))), full.reshape(-1))
  g = full.reshape(2, 2, 256)  # device (i, j) of the grid holds g[i, j]
  b = g.sum((0, 1))                            # tp then dp: the total
  c = np.broadcast_to((g * 2).sum(1, keepdims=True), g.shape)
  d = (c + b).sum((0, 1))                      # over all four devices
  want = 2 * d / 8                             # dp sum of identical values, / 8
  compiled = f.lower(x).compile()
  launch.barrier()
  ok = 0
  for i in range(200):
    got = np.asarray(compiled(x).addressable_shards[0].data)
    ok += bool(np.array_equal(got, want))
  report["dp_tp_steps_right"] = ok

  # Two meshes over the same devices (JAX wants one device order in a jitted
  # function): a line of 4 reducing over all of it, and a 2 x 2 grid reducing
  # over its second axis (groups of 2), used alternately. The value is
  # replicated (every rank holds the same row), so moving between the meshes
  # needs no communication, and each averaging all-reduce leaves it unchanged.
  devs = np.array(jax.devices())
  mesh_a, mesh_b = Mesh(devs, ("a",)), Mesh(devs.reshape(2, 2), ("b", "c"))
  row = full[0]
  xa = global_array(NamedSharding(mesh_a, P()), row)

  def alternate(v):
    for k in range(6):
      m, ax, scale = (mesh_a, "a", 0.25) if k % 2 == 0 else (mesh_b, "c", 0.5)
      v = jax.shard_map(lambda u, ax=ax, scale=scale: jaxll.all_reduce(u, ax) * np.float32(scale),
                        mesh=m, in_specs=P(), out_specs=P(), check_vma=False)(v)
    return v

  h = jax.jit(alternate).lower(xa).compile()
  launch.barrier()
  ok = 0
  for i in range(200):
    out = h(xa)
    ok += all(np.array_equal(np.asarray(s.data), row) for s in out.addressable_shards)
  report["alternate_meshes_steps_right"] = ok
  report["workspaces_used"] = sorted({s.workspace for f_ in (f, jax.jit(alternate))
                                      for s in jaxll.explain(f_, x if f_ is f else xa)})
  checked("check_errors_at_end")

launch.barrier()
launch.report(report)
