"""GPU tier 3, several GPUs of one host (real peer access and NVLink): the
end-to-end checks of tests/mp_scripts/allreduce_checks.py (every algorithm and
dtype, sizes 1 element to 6 MB, a 2-D mesh reduced over each axis, 1000 steps
in a loop, >10^4 calls mixing algorithms, a gradient, outputs bitwise equal
across ranks) with 2, 4 and 8 GPUs, in three layouts: one process driving all
of them, one process per GPU, and two processes driving half of them each.
Skipped, with the reason, where fewer GPUs are visible. Marked ``gpu``."""

import jax
import pytest

from jaxll.tools import launch
from mp_checks import CHECKS, GPU_ENV as ENV, TIMEOUT, describe, verify

pytestmark = pytest.mark.gpu


def _gpus(n):
  try:
    count = len(jax.devices("cuda"))
  except RuntimeError:
    count = 0
  if count < n:
    pytest.skip(f"needs {n} GPUs of one host; {count} visible")
  return [str(i) for i in range(n)]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_one_process_drives_every_gpu(n):
  gpus = _gpus(n)
  workers = launch.run(CHECKS, 1, args=["--latency"], timeout=TIMEOUT, env=ENV, mps=False,
                       devices=[",".join(gpus)])
  assert workers[0].result["devices"] == list(range(n))
  verify(workers, min_cases=100)
  print(describe(workers, f"{n} GPUs, one process"))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_one_process_per_gpu(n):
  workers = launch.run(CHECKS, n, args=["--latency"], timeout=TIMEOUT, env=ENV, mps=False,
                       devices=_gpus(n))
  verify(workers, min_cases=100)
  print(describe(workers, f"{n} GPUs, one process each"))


@pytest.mark.parametrize("n", [4, 8])
def test_processes_driving_several_gpus_each(n):
  # peer access among the GPUs of one process, CUDA IPC across the two
  gpus = _gpus(n)
  halves = [",".join(gpus[:n // 2]), ",".join(gpus[n // 2:])]
  workers = launch.run(CHECKS, 2, timeout=TIMEOUT, env=ENV, mps=False, devices=halves)
  verify(workers, min_cases=100)
  print(describe(workers, f"{n} GPUs, two processes of {n // 2}"))
