"""GPU tier, several processes: N jax.distributed processes on the local GPU(s)
run jaxll inside jitted shard_map over the global mesh, through workspaces
whose memory is shared by CUDA IPC (tests/mp_scripts/gpu_allreduce.py). With
one GPU, all N processes share it (CUDA MPS is started when available).
Marked ``gpu``."""

import os
import time

import pytest

from jaxll import launch

pytestmark = pytest.mark.gpu

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mp_scripts",
                      "gpu_allreduce.py")
ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "NCCL_NVLS_ENABLE": "0",
       "JAXLL_TIMEOUT_MS": "20000", "JAXLL_SETUP_TIMEOUT_MS": "120000", "XLA_FLAGS": ""}
# seconds one run may take before its workers are killed and the test fails
TIMEOUT = float(os.environ.get("JAXLL_MP_TEST_TIMEOUT", "500"))


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
  t0 = time.monotonic()
  workers = launch.run(SCRIPT, n, args=args, timeout=TIMEOUT, env=ENV, mps=mps)
  print(f"\nN={n}: {time.monotonic() - t0:.0f} s; process 0's sections (s): "
        f"{workers[0].result['seconds']}")
  errors = [e for w in workers for e in w.result["errors"]]
  assert not errors, errors
  cases = workers[0].result["cases"]
  assert len(cases) > 100
  for w in workers:
    for name, case in w.result["cases"].items():
      assert case["ok"], (w.process_id, name)
  # ranks of one group agree bit for bit (a case name identifies its group)
  by_name = {}
  for w in workers:
    for name, case in w.result["cases"].items():
      by_name.setdefault(name, set()).add(case["hash"])
  split = [name for name, hashes in by_name.items() if len(hashes) > 1]
  assert not split, split[:5]
  if "latency_us" in workers[0].result:
    lat = {a: sorted(w.result["latency_us"][a] for w in workers)
           for a in workers[0].result["latency_us"]}
    print(f"\nN={n} processes on one GPU, MPS={workers[0].mps}: jitted chain of 50, us per "
          f"call at 4 KiB (per process, sorted): {lat}; paths "
          f"{workers[0].result['latency_path']}")
