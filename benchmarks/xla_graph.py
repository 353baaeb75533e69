"""What XLA's CUDA graphs hold around a jaxll call: node types and edge types.

Builds benchmarks/graph_probe.cc (nvcc, CUPTI), loads it into this process, and
runs short jitted chains on a one-GPU mesh, ``v = f(v) * 0.5`` with f the empty
FFI call (``jaxll_noop``) or ``jaxll.all_reduce``; every CUDA graph XLA
instantiates for them is written out: its nodes (kernel, child graph, empty, ...)
and its edges with their types (default or programmatic). Run it under the
XLA_FLAGS to compare, e.g. ``XLA_FLAGS=--xla_gpu_enable_pdl=true``.

  python benchmarks/xla_graph.py --out graphs.txt
"""
from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def cuda_dirs() -> tuple[list[str], list[str]]:
  """Include and library folders of the CUDA toolkit nvcc belongs to (CUPTI
  may sit under extras/CUPTI)."""
  nvcc = shutil.which("nvcc")
  if nvcc is None:
    raise SystemExit("nvcc is not on the PATH: the graph probe is built with it")
  root = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
  inc = [os.path.join(root, d) for d in ("include", "extras/CUPTI/include")]
  lib = [os.path.join(root, d) for d in ("lib64", "lib", "extras/CUPTI/lib64", "lib64/stubs",
                                         "lib/stubs")]
  return [d for d in inc if os.path.isdir(d)], [d for d in lib if os.path.isdir(d)]


def build_probe(folder: str) -> str:
  inc, lib = cuda_dirs()
  so = os.path.join(folder, "graph_probe.so")
  cmd = ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-o", so,
         os.path.join(HERE, "graph_probe.cc")]
  cmd += [f"-I{d}" for d in inc] + [f"-L{d}" for d in lib]
  cmd += [f"-Xlinker=-rpath={d}" for d in lib if "stubs" not in d] + ["-lcupti", "-lcuda"]
  subprocess.run(cmd, check=True)
  return so


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", default="xla_graphs.txt")
  p.add_argument("--steps", type=int, default=3, help="steps of each jitted chain")
  p.add_argument("--algorithm", default="oneshot_ll")
  p.add_argument("--bytes", type=int, default=8)
  args = p.parse_args()

  probe = ctypes.CDLL(build_probe(tempfile.mkdtemp()))
  if probe.graph_probe_start(args.out.encode()) != 0:
    raise SystemExit("CUPTI would not subscribe (is another profiler attached?)")

  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxll

  dev = jax.devices("cuda")[0]
  half = np.float32(0.5)
  noop = jax.ffi.ffi_call("jaxll_noop", jax.ShapeDtypeStruct((4,), np.float32),
                          input_output_aliases={0: 0})

  @jax.jit
  def noop_chain(v):
    for _ in range(args.steps):
      v = noop(v) * half
    return v

  mesh = jax.make_mesh((1,), ("x",), devices=[dev])

  def body(v):
    for _ in range(args.steps):
      v = jaxll.all_reduce(v, "x", algorithm=args.algorithm) * half
    return v

  reduce_chain = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
  chains = [("noop*0.5", noop_chain, jax.device_put(np.ones(4, np.float32), dev)),
            (f"all_reduce[{args.algorithm}]*0.5, {args.bytes} B", reduce_chain,
             jax.device_put(np.ones(max(1, args.bytes // 4), np.float32),
                            NamedSharding(mesh, P("x"))))]
  header = (f"{dev.device_kind}, jax {jax.__version__}, "
            f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, {args.steps} steps a chain")
  probe.graph_probe_note(header.encode())
  for name, f, x in chains:
    probe.graph_probe_note(f"chain {name}: compile and 3 runs".encode())
    for _ in range(3):
      x = jax.block_until_ready(f(x))
    # (a one-device all-reduce is the identity: each run halves v `steps` times)
    want = np.float32(0.5) ** (3 * args.steps)
    if not np.all(np.asarray(x) == want):
      raise SystemExit(f"chain {name} computed {np.asarray(x)[:4]}, not {want}")
  jaxll.check_errors()
  count = probe.graph_probe_stop()
  print(f"{count} graphs instantiated; written to {args.out}")
  with open(args.out) as fh:
    print(fh.read())


if __name__ == "__main__":
  main()
