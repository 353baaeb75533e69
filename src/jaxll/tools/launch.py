"""Runs a script in N local processes joined by ``jax.distributed``: the test
launcher for multi-process jaxll, usable for any multi-process JAX check.

  from jaxll.tools import launch
  workers = launch.run("check.py", 4, args=["--size", "4096"], timeout=300)
  results = [w.result for w in workers]

Each worker runs ``python check.py ...`` with the coordinator address, process
count and its process id in its environment; the script calls
:func:`init_worker` (which calls ``jax.distributed.initialize``) and reports a
JSON-serialisable result with :func:`report`. :func:`run` returns a
:class:`Worker` per process, in process order (its ``result``, ``output``,
``returncode``), or raises :class:`LaunchError` (a digest of every worker's output
in its message, the workers in its ``workers``) when a worker fails, reports
nothing, or the run passes `timeout` (then every worker is killed: a hang fails
the caller instead of blocking it).

Process i gets GPU ``i % G`` of the G the host has (the entries of the caller's
``CUDA_VISIBLE_DEVICES`` where set, else ``nvidia-smi -L``'s) as its
``CUDA_VISIBLE_DEVICES``, unless `devices` says otherwise: a GPU a process of its
own where there are enough, processes sharing them where there are not.

With ``mps="auto"`` (default) it starts a private CUDA MPS control daemon when
processes share a GPU and ``nvidia-cuda-mps-control`` is present, so the workers'
kernels run concurrently on the shared GPU (jaxll's kernels spin waiting for each
other; without MPS processes time-slice the GPU and each call waits for a slice
switch), and stops it afterwards. ``mps=False`` never starts one; ``mps=True`` requires it;
``mps=MpsDaemon()`` uses one the caller started (and stops) for several runs.
Workers an MPS daemon serves get ``CUDA_DEVICE_MAX_CONNECTIONS=4`` unless `env`
sets it: MPS clients share one pool of hardware work queues, and 8 clients asking
for 32 each fail with CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

_ENV_COORD = "JAXLL_LAUNCH_COORDINATOR"
_ENV_NUM = "JAXLL_LAUNCH_NUM_PROCESSES"
_ENV_ID = "JAXLL_LAUNCH_PROCESS_ID"
_RESULT = "JAXLL_LAUNCH_RESULT "
_PROGRESS = "[jaxll.tools.launch process "
# CUDA_DEVICE_MAX_CONNECTIONS of a worker that an MPS daemon serves, unless the
# caller's `env` sets it.
MPS_MAX_CONNECTIONS = 4


class LaunchError(RuntimeError):
  """A launched worker failed, reported nothing, or the run timed out. The
  message holds a digest of every worker's output (its progress marks and
  errors, then its last 40 lines); `workers` holds each :class:`Worker`, whole
  output included (empty when no worker started)."""

  def __init__(self, message: str, workers: list | None = None):
    super().__init__(message)
    self.workers = list(workers or [])


@dataclasses.dataclass
class Worker:
  process_id: int
  returncode: int | None
  output: str
  result: object = None
  reported: bool = False  # the script called report()
  mps: bool = False       # an MPS daemon served this run


def init_worker(**kwargs) -> int:
  """In a launched worker: joins ``jax.distributed`` as this worker's process
  and returns its process id. Extra keyword arguments go to
  ``jax.distributed.initialize``."""
  import jax
  pid = int(os.environ[_ENV_ID])
  jax.distributed.initialize(coordinator_address=os.environ[_ENV_COORD],
                             num_processes=int(os.environ[_ENV_NUM]), process_id=pid,
                             **kwargs)
  return pid


def report(result) -> None:
  """In a launched worker: hands `result` (JSON-serialisable) to the launcher."""
  print(_RESULT + json.dumps(result), flush=True)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class MpsDaemon:
  """A private CUDA MPS control daemon (its own pipe and log directories).
  Pass it to several :func:`run` calls to share it; ``stop()`` when done."""

  def __init__(self):
    self.dir = tempfile.mkdtemp(prefix="jaxll-mps-")
    self.env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(self.dir, "pipe"),
                "CUDA_MPS_LOG_DIRECTORY": os.path.join(self.dir, "log")}
    for d in self.env.values():
      os.makedirs(d)
    env = dict(os.environ, **self.env)
    r = subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, capture_output=True,
                       text=True, timeout=30)
    if r.returncode != 0:
      shutil.rmtree(self.dir, ignore_errors=True)
      raise OSError(f"nvidia-cuda-mps-control -d failed: {r.stderr.strip() or r.returncode}")

  def stop(self):
    env = dict(os.environ, **self.env)
    try:
      subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, capture_output=True,
                     text=True, timeout=30)
      # "quit" returns before the daemon and its server are gone; a new daemon
      # started meanwhile leaves its clients without a device.
      deadline = time.monotonic() + 30
      while time.monotonic() < deadline and _mps_processes_running():
        time.sleep(0.2)
    finally:
      shutil.rmtree(self.dir, ignore_errors=True)


def _mps_processes_running() -> bool:
  try:
    r = subprocess.run(["pgrep", "-f", "nvidia-cuda-mps-(control|server)"], capture_output=True,
                       timeout=10)
  except (OSError, subprocess.SubprocessError):
    return False
  return r.returncode == 0


def _have_gpu() -> bool:
  if shutil.which("nvidia-smi") is None:
    return False
  try:
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
  except (OSError, subprocess.SubprocessError):
    return False


def _host_gpus() -> list[str]:
  """The GPUs run() hands out: the entries of CUDA_VISIBLE_DEVICES where it is
  set (up to the first that hides the rest, as CUDA reads it), else the indices
  nvidia-smi lists; none without a GPU."""
  visible = os.environ.get("CUDA_VISIBLE_DEVICES")
  if visible is not None:
    gpus = []
    for entry in (e.strip() for e in visible.split(",")):
      if not entry or entry.startswith("-"):
        break
      gpus.append(entry)
    return gpus
  if shutil.which("nvidia-smi") is None:
    return []
  try:
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.SubprocessError):
    return []
  if r.returncode != 0:
    return []
  return [str(i) for i in range(sum(1 for l in r.stdout.splitlines() if l.startswith("GPU ")))]


def _shares_gpu(devices: list[str] | None) -> bool:
  """Whether processes given these CUDA_VISIBLE_DEVICES share a GPU (None: every
  process sees every GPU)."""
  if devices is None:
    return True
  seen: set[str] = set()
  for d in devices:
    mine = {e.strip() for e in str(d).split(",") if e.strip()}
    if mine & seen:
      return True
    seen |= mine
  return False


def _start_mps(mps):
  if mps is False or isinstance(mps, MpsDaemon):
    return None
  if not mps_available():
    if mps is True:
      raise LaunchError("mps=True but nvidia-cuda-mps-control or a GPU is missing")
    return None
  try:
    return MpsDaemon()
  except (OSError, subprocess.SubprocessError) as e:
    if mps is True:
      raise LaunchError(str(e)) from None
    return None


def run(script: str, n: int, *, args=(), timeout: float = 300, mps="auto",
        env: dict | None = None, devices: list[str] | None = None,
        python: str = sys.executable) -> list[Worker]:
  """Runs `script` in `n` processes joined by jax.distributed (a local
  coordinator); returns one :class:`Worker` per process, in process order, each
  with the result its script passed to :func:`report`. Raises LaunchError on a
  failed worker, a missing result or a timeout, with a digest of every worker's
  output in its message and the workers (whole outputs) in its ``workers``.

  `devices[i]`, if given, becomes process i's CUDA_VISIBLE_DEVICES (``"0"`` for
  every process: all share GPU 0); by default process i gets the host's GPU
  ``i % G`` (see the module's docstring), and where there is no GPU nothing is
  set. ``mps="auto"`` starts MPS only where processes share a GPU."""
  if n < 1:
    raise ValueError(f"n must be at least 1, got {n}")
  if devices is not None and len(devices) != n:
    raise ValueError(f"devices must have one entry per process ({n}), got {len(devices)}")
  if devices is None:
    gpus = _host_gpus()
    devices = [gpus[i % len(gpus)] for i in range(n)] if gpus else None
  daemon = _start_mps(mps) if mps != "auto" or _shares_gpu(devices) else None
  shared = mps if isinstance(mps, MpsDaemon) else None
  serving = daemon or shared
  coord = f"127.0.0.1:{_free_port()}"
  procs, logs = [], []
  try:
    for i in range(n):
      wenv = dict(os.environ, **(env or {}))
      if serving is not None:
        wenv.update(serving.env)
        # MPS clients share one pool of hardware work queues: 8 processes asking
        # for 32 each (what virtual-rank runs set) exhaust it.
        if "CUDA_DEVICE_MAX_CONNECTIONS" not in (env or {}):
          wenv["CUDA_DEVICE_MAX_CONNECTIONS"] = str(MPS_MAX_CONNECTIONS)
      wenv.update({_ENV_COORD: coord, _ENV_NUM: str(n), _ENV_ID: str(i)})
      if devices is not None:
        wenv["CUDA_VISIBLE_DEVICES"] = str(devices[i])
      log = tempfile.TemporaryFile(mode="w+")
      logs.append(log)
      procs.append(subprocess.Popen([python, script, *map(str, args)], env=wenv, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + timeout
    timed_out = False
    while [p.poll() for p in procs].count(None):
      if time.monotonic() > deadline:
        timed_out = True
        break
      if any(p.returncode not in (None, 0) for p in procs):
        # one failed: give the others a moment to fail too, then stop them
        time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
        break
      time.sleep(0.05)
    _kill(procs)
    workers = []
    for i, (p, log) in enumerate(zip(procs, logs)):
      log.seek(0)
      out = log.read()
      result, seen = None, False
      for line in out.splitlines():
        if line.startswith(_RESULT):
          result, seen = json.loads(line[len(_RESULT):]), True
      workers.append(Worker(i, p.returncode, out, result, seen, serving is not None))
    problems = []
    if timed_out:
      problems.append(f"timed out after {timeout} s")
    for w in workers:
      if w.returncode != 0:
        problems.append(f"process {w.process_id} exited with {w.returncode}")
      elif not w.reported:
        problems.append(f"process {w.process_id} reported no result")
    if problems:
      tails = "\n".join(f"--- process {w.process_id} (exit {w.returncode}) ---\n"
                        + _digest(w.output) for w in workers)
      hint = ""
      if serving is not None and any("no supported devices found" in w.output for w in workers):
        asked = (env or {}).get("CUDA_DEVICE_MAX_CONNECTIONS", MPS_MAX_CONNECTIONS)
        hint = (f"hint: under MPS a process found no GPU. Each MPS client takes "
                f"CUDA_DEVICE_MAX_CONNECTIONS hardware work queues from one pool "
                f"(here {asked} x {n} processes; launch's default is {MPS_MAX_CONNECTIONS} "
                f"where env does not set it); a server of another MPS daemon still "
                f"running does this too. mps=False runs without MPS.\n")
      raise LaunchError("; ".join(problems) + f" ({'MPS' if serving else 'no MPS'})\n" + hint
                        + tails, workers)
    return workers
  finally:
    _kill(procs)  # also when the caller is interrupted: no worker outlives the run
    for log in logs:
      log.close()
    if daemon is not None:
      daemon.stop()


def _kill(procs) -> None:
  for p in procs:
    if p.poll() is None:
      try:
        os.killpg(p.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      p.wait()


def _digest(output: str, tail: int = 40, marks: int = 20) -> str:
  """The lines of a worker's output worth reading: its progress marks and
  errors (first `marks` of them), then its last `tail` lines."""
  lines = output.splitlines()
  notable = [l for l in lines[:-tail] if l.startswith(_PROGRESS) or "Error" in l
             or "Traceback" in l][:marks]
  return "\n".join(notable + (["..."] if notable else []) + lines[-tail:])


_barriers = [0]


def barrier(timeout_s: float = 300) -> None:
  """In a launched worker: waits until every process of the run reaches its
  barrier of the same number (the n-th call of each process meets the n-th of
  every other), through jax.distributed's key-value store."""
  from jaxll import internals
  _barriers[0] += 1
  internals.distributed_client().wait_at_barrier(f"jaxll-launch-{_barriers[0]}",
                                                  int(timeout_s * 1000))


def progress(message: str) -> None:
  """In a launched worker: a progress mark, shown with the output of a failed run."""
  print(f"{_PROGRESS}{os.environ.get(_ENV_ID, '?')}] {message}", flush=True)


def mps_available() -> bool:
  """Whether run(mps="auto") can start MPS here (it does for processes that share a GPU)."""
  return shutil.which("nvidia-cuda-mps-control") is not None and _have_gpu()
