"""GPU tier, several processes: N jax.distributed processes on the local GPU
run jaxll inside jitted shard_map over the global mesh, through workspaces
whose memory is shared by CUDA IPC (tests/mp_scripts/allreduce_checks.py). With
one GPU, all N processes share it (CUDA MPS is started when available).
Marked ``gpu``."""

import pytest

from jaxll import launch
from mp_checks import CHECKS, GPU_ENV, TIMEOUT, describe, verify

pytestmark = pytest.mark.gpu

# XLA's own all-reduce (NCCL) cannot run several ranks on one GPU, so auto must
# not hand large messages to it here
ENV = dict(GPU_ENV, JAXLL_AUTO_MAX_BYTES=str(1 << 40))


@pytest.fixture(scope="module")
def mps():
  """One MPS daemon for every run of this module, where MPS exists."""
  if not launch.mps_available():
    yield False
    return
  daemon = launch.MpsDaemon()
  yield daemon
  daemon.stop()


@pytest.mark.parametrize("n", [2, 4, 8])
def test_processes_share_the_gpu(n, mps):
  args = ["--steps", "1000"] + (["--latency"] if n in (2, 8) else [])
  workers = launch.run(CHECKS, n, args=args, timeout=TIMEOUT, env=ENV, mps=mps,
                       devices=["0"] * n)
  verify(workers, min_cases=100)
  print(describe(workers, f"N={n} processes on one GPU, MPS={workers[0].mps}"))
