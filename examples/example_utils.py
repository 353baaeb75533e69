"""What the workload examples share: picking the devices (all local GPUs, or 8
CPU devices where there is none), re-running a script in N jax.distributed
processes through jaxll.tools.launch, replicated arrays built without cross-process
transfers, and the --processes / --json plumbing."""

import json
import os
import subprocess
import sys


def add_common_args(parser):
  parser.add_argument("--collective", choices=("psum", "jaxll", "both"), default="both")
  parser.add_argument("--processes", type=int, default=0,
                      help="run in N local jax.distributed processes (jaxll.tools.launch): one "
                           "GPU each where there are N, else all sharing GPU 0")
  parser.add_argument("--json", default=None, help="write the report here")
  parser.add_argument("--mps", choices=("auto", "on", "off"), default="auto",
                      help="with --processes: a private CUDA MPS daemon (auto: where "
                           "nvidia-cuda-mps-control and a GPU exist)")
  parser.add_argument("--worker", action="store_true", help=argparse_suppress())
  parser.add_argument("--shared-gpu", action="store_true", help=argparse_suppress())
  parser.add_argument("--cpu", action="store_true", help=argparse_suppress())


def argparse_suppress():
  import argparse
  return argparse.SUPPRESS


def _gpu_count() -> int:
  try:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
  except (OSError, subprocess.SubprocessError):
    return 0
  return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def main(opts, run, print_report, script):
  """Runs `run(opts)` here, or in opts.processes processes; prints the report
  (process 0's) and writes it to opts.json."""
  if opts.processes and not opts.worker:
    report = _launch(opts, script)
  else:
    _setup(opts)
    report = run(opts)
    if opts.worker:
      from jaxll.tools import launch
      launch.report(report)
      return report
  print_report(report)
  if opts.json:
    with open(opts.json, "w") as f:
      json.dump(report, f, indent=1)
  return report


def _setup(opts):
  if not opts.worker and "xla_force_host_platform_device_count" not in os.environ.get(
      "XLA_FLAGS", ""):
    # 8 CPU devices where there is no GPU (harmless where there is one)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=8").strip()
  import jax
  if opts.cpu:
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  elif not opts.worker:
    try:
      jax.devices("cuda")
    except RuntimeError:
      jax.config.update("jax_platforms", "cpu")
  if opts.worker:
    from jaxll.tools import launch
    launch.init_worker()


def _launch(opts, script):
  from jaxll.tools import launch
  n, gpus = opts.processes, _gpu_count()
  devices = ([str(i) for i in range(n)] if gpus >= n else ["0"] * n) if gpus else None
  shared = devices is not None and len(set(devices)) < n
  args, skip = [], False
  for a in sys.argv[1:]:
    if skip:
      skip = False
    elif a == "--processes":
      skip = True
    elif not a.startswith("--processes="):
      args.append(a)
  args += ["--worker"] + (["--shared-gpu"] if shared else []) + ([] if gpus else ["--cpu"])
  env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "NCCL_NVLS_ENABLE": "0"}
  # The caller's choice beats launch's default, except for processes sharing a
  # GPU under MPS: there launch's small default keeps the clients within the
  # GPU's hardware work queues (4 processes asking for 32 each found no device).
  if "CUDA_DEVICE_MAX_CONNECTIONS" in os.environ and not shared:
    env["CUDA_DEVICE_MAX_CONNECTIONS"] = os.environ["CUDA_DEVICE_MAX_CONNECTIONS"]
  if not gpus:  # one CPU device per process
    env["XLA_FLAGS"] = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                                if "xla_force_host_platform_device_count" not in f)
  if shared:
    env["JAXLL_AUTO_MAX_BYTES"] = str(1 << 40)  # never hand a call to XLA's NCCL
  mps = {"auto": "auto", "on": True, "off": False}[opts.mps]
  workers = launch.run(os.path.abspath(script), n, args=args, timeout=3600, env=env,
                       devices=devices, mps=mps if gpus else False)
  return workers[0].result


def describe(opts, devices) -> str:
  import jax
  d = devices[0]
  if opts.worker and opts.shared_gpu:
    return (f"1 {d.device_kind} shared by {jax.process_count()} processes "
            f"({len(devices)} JAX devices, one per process)")
  where = f"{len(devices)} CPU devices" if d.platform == "cpu" else f"{len(devices)} x {d.device_kind}"
  if opts.worker:
    where += f", {jax.process_count()} processes"
  return where


def line_up(opts):
  """In a launched worker: waits for every process to get here. Called between
  compiling a step and running it: jaxll's waits are bounded (JAXLL_TIMEOUT_MS,
  10 s by default), so a process that starts its first collective while a peer
  still compiles (XLA's autotuning runs on the GPU, slowly where other processes
  keep it busy) would give up on that peer."""
  if opts.worker:
    from jaxll.tools import launch
    launch.barrier()


def psum_unavailable(opts) -> str | None:
  """Why the psum run cannot happen here (None: it can)."""
  if opts.shared_gpu:
    return "XLA's all-reduce (NCCL) cannot pair processes that share one GPU"
  return None


def replicated(mesh, a):
  """A replicated global array built on each local device (no cross-process
  transfer: jax.device_put of a global array checks the processes through XLA's
  NCCL, which cannot pair processes sharing one GPU)."""
  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P
  a = np.asarray(a)
  sharding = NamedSharding(mesh, P())
  return jax.make_array_from_single_device_arrays(
      a.shape, sharding, [jax.device_put(a, d) for d in sharding.addressable_devices])
