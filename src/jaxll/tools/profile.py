"""Device time per kernel of a piece of JAX work, from JAX's profiler (CUPTI);
used by benchmarks/fused_rmsnorm.py and examples/tp_decode.py (--profile).

  from jaxll.tools import profile
  times = profile.kernel_times(lambda: f(x).block_until_ready(), "/tmp/trace")
  # {kernel name: (launches, total microseconds)}

The kernel events come from the GPU planes of the trace (one line per stream),
so kernels launched from CUDA graphs are counted too. A kernel's time runs from
its first block's start to its last block's end: for a collective it includes
the time spent waiting for the peers.
"""
from __future__ import annotations

import collections
import glob
import os
import shutil


def kernel_times(work, trace_dir: str) -> dict[str, tuple[int, float]]:
  import jax
  from jax.profiler import ProfileData
  shutil.rmtree(trace_dir, ignore_errors=True)
  jax.profiler.start_trace(trace_dir)
  try:
    work()
  finally:
    jax.profiler.stop_trace()
  files = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
  if not files:
    raise RuntimeError(f"the profiler wrote no trace under {trace_dir}")
  count: dict[str, int] = collections.Counter()
  total: dict[str, float] = collections.defaultdict(float)
  for plane in ProfileData.from_file(files[0]).planes:
    if not plane.name.startswith("/device:GPU"):
      continue
    for line in plane.lines:
      if "stream" not in line.name.lower():  # (skip the summary lines)
        continue
      for event in line.events:
        if event.name.lower().startswith(("memcpy", "memset")):  # copies, not kernels
          continue
        count[event.name] += 1
        total[event.name] += event.duration_ns / 1e3
  return {name: (count[name], total[name]) for name in count}


def is_collective(kernel: str) -> bool:
  """jaxll's kernels and NCCL's (XLA's all-reduce on GPUs)."""
  name = kernel[len("void "):] if kernel.startswith("void ") else kernel
  return "jaxll::" in name or name.startswith("nccl")


def split(times: dict[str, tuple[int, float]]) -> tuple[float, float]:
  """(microseconds in collective kernels, microseconds in all kernels)."""
  coll = sum(t for name, (_, t) in times.items() if is_collective(name))
  return coll, sum(t for _, t in times.values())


def short_name(kernel: str, width: int = 60) -> str:
  """A kernel's name without template arguments and parameters, cut to `width`."""
  name = kernel.replace("(anonymous namespace)::", "")
  depth, out = 0, []
  for ch in name:  # drop template arguments and the parameter list
    if ch in "<(":
      depth += 1
    elif ch in ">)":
      depth -= 1
    elif depth == 0:
      out.append(ch)
  name = "".join(out).replace("void ", "").strip()
  return name[-width:]
