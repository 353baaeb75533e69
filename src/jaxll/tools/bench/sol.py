"""The machine, the speed-of-light inputs and the per-call floors a benchmark
run measures first."""

from __future__ import annotations

import functools
import platform
import statistics
import subprocess

from jaxll.tools.bench.timing import steady_method, steady_per_call_us


def machine_info() -> dict:
  import jax
  import jaxlib
  info = {"python": platform.python_version(), "jax": jax.__version__,
          "jaxlib": jaxlib.__version__, "host": platform.node()}
  try:
    gpus = jax.devices("cuda")
  except RuntimeError:
    gpus = []
  info["gpu"] = gpus[0].device_kind if gpus else None
  info["gpu_count"] = len(gpus)
  try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30).stdout.split()
    info["driver"] = out[0] if out else None
  except (OSError, subprocess.SubprocessError):
    info["driver"] = None
  from jaxll.native import ext
  v = ext.built_cuda_version if ext is not None else 0
  info["cuda_runtime_built"] = f"{v // 1000}.{(v % 1000) // 10}"
  info["nccl"] = _package_version("nvidia-nccl")
  info["cuda_plugin"] = _package_version("jax-cuda")
  return info


def _package_version(prefix: str) -> str | None:
  from importlib import metadata
  for dist in metadata.distributions():
    name = (dist.metadata.get("Name") or "").lower()
    if name.startswith(prefix):
      return f"{name} {dist.version}"
  return None


def probe_sol(ordinal: int, reps: int) -> dict:
  """The speed-of-light bound on one GPU: 2 L2 round trips (one
  ``__threadfence()`` each) + one remote store, the store from a flag ping-pong
  between two blocks on two streams; medians of ``reps`` probes."""
  from jaxll.tools import testing as jt

  l2 = statistics.median(jt.probe_l2_fence_us(ordinal, 20000, False) for _ in range(reps))
  one_way = statistics.median(
      jt.probe_pingpong_one_way_us(ordinal, ordinal, 20000) for _ in range(reps))
  return {"l2_rtt_us": l2, "pingpong_one_way_us": one_way,
          "sol_us": 2 * l2 + (2 * one_way - 2 * l2) / 2}


def measure_sol(args) -> dict:
  """Speed-of-light inputs and per-call floors, on GPU 0 (and GPU pairs)."""
  import jax
  import numpy as np

  from jaxll.native import ext
  from jaxll.tools import testing as jt

  dev = jax.devices("cuda")[0]
  o = dev.local_hardware_id
  reps = max(3, args.reps // 3)
  store_fence = statistics.median(jt.probe_l2_fence_us(o, 20000, True) for _ in range(reps))
  sol = {"device": dev.device_kind, "store_fence_us": store_fence, **probe_sol(o, reps)}
  l2 = sol["l2_rtt_us"]
  pairs = {}
  gpus = jax.devices("cuda")
  for a in gpus:
    for b in gpus:
      if a.id < b.id and ext.can_access_peer(a.local_hardware_id, b.local_hardware_id):
        ow = statistics.median(
            jt.probe_pingpong_one_way_us(a.local_hardware_id, b.local_hardware_id, 20000)
            for _ in range(reps))
        pairs[f"{a.id}-{b.id}"] = {"pingpong_one_way_us": ow, "sol_us": 2 * l2 + (2 * ow - 2 * l2) / 2}
  sol["pairs"] = pairs

  # Per-call floor of a trivial FFI custom call in a jitted chain (command buffers on).
  noop = jax.ffi.ffi_call("jaxll_noop", jax.ShapeDtypeStruct((4,), np.float32),
                          input_output_aliases={0: 0})

  @functools.partial(jax.jit, donate_argnums=0)
  def chain(v):
    for _ in range(args.chain):
      v = noop(v)
    return v

  x = jax.device_put(np.ones(4, np.float32), dev)
  sol["ffi_call_floor_us"] = steady_per_call_us(chain, x, args.chain, args.runs, args.reps)
  sol["ffi_call_floor_method"] = steady_method(args)
  sol["graph_node_floor_us"] = {
      str(n): statistics.median(jt.graph_floor_us(n, iters=args.iters, reps=args.reps))
      for n in (args.ranks if "virtual" in args.mode else [])}
  return sol
