"""The multi-process launcher (jaxll.launch) on CPU, and the pure logic of
workspaces that span processes."""

import os

import pytest

from jaxll import distributed, launch
from mp_checks import CHECKS, verify

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "mp_scripts", "cpu_worker.py")
ENV = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}


def test_two_processes_join_and_reduce():
  workers = launch.run(WORKER, 2, timeout=120, mps=False, env=ENV)
  assert [w.process_id for w in workers] == [0, 1]
  for w in workers:
    assert w.returncode == 0 and w.reported and not w.mps
    assert w.result["processes"] == 2 and w.result["devices"] == 2
    assert w.result["path"] == "xla"  # CPU: XLA's all-reduce (gloo) across processes
    assert w.result["sum"] == [[3.0, 3.0, 3.0, 3.0]]


def test_failed_worker_is_reported_with_output():
  with pytest.raises(launch.LaunchError, match="process 1 exited with 3") as e:
    launch.run(WORKER, 2, args=["fail"], timeout=120, mps=False, env=ENV)
  assert "[jaxll.launch process 1] joined" in str(e.value)  # progress marks are shown


@pytest.mark.parametrize("processes,devices", [(1, 8), (2, 4)])
def test_end_to_end_checks_dry_run_on_cpu(processes, devices):
  # The GPU tiers' end-to-end checks (tests/mp_scripts/allreduce_checks.py) on
  # CPU devices: every call lowers to XLA's all-reduce (gloo across processes),
  # so this checks the harness itself: sharding and gathering with several
  # devices per process, references, per-group bitwise agreement, 2-D groups.
  args = ["--platform", "cpu", "--cpu-devices", devices, "--steps", "20", "--stress", "4"]
  workers = launch.run(CHECKS, processes, args=args, timeout=300, mps=False, env=ENV)
  assert [len(w.result["devices"]) for w in workers] == [devices] * processes
  verify(workers, min_cases=30)
  names = workers[0].result["cases"]
  assert "2d/b/auto/5/group0" in names and "2d/a/auto/70001/group0" in names
  assert workers[0].result["stress_calls"] == 12


def test_hang_fails_after_timeout():
  with pytest.raises(launch.LaunchError, match="timed out after 12 s"):
    launch.run(WORKER, 2, args=["hang"], timeout=12, mps=False, env=ENV)


def test_mps_required_but_missing(monkeypatch):
  monkeypatch.setattr(launch.shutil, "which", lambda name: None)
  with pytest.raises(launch.LaunchError, match="mps=True"):
    launch.run(WORKER, 1, mps=True, env=ENV)


def test_grid_bound_agreement():
  # 8 ranks on one GPU (N processes on one device) share its resident blocks
  one_gpu = [{"uuid": "a", "bound": 264}] * 8
  assert distributed.agree_max_blocks(one_gpu) == 33
  # one rank per GPU: each GPU's own bound, the smallest wins
  gpus = [{"uuid": str(i), "bound": 264 - i} for i in range(4)]
  assert distributed.agree_max_blocks(gpus) == 261
  # two GPUs with 2 and 1 ranks
  mixed = [{"uuid": "a", "bound": 100}, {"uuid": "a", "bound": 100}, {"uuid": "b", "bound": 60}]
  assert distributed.agree_max_blocks(mixed) == 50


def test_mps_workers_get_few_work_queues(tmp_path, monkeypatch):
  # Under MPS all clients share one pool of hardware work queues: the launcher
  # caps CUDA_DEVICE_MAX_CONNECTIONS (32 from the caller's environment would
  # exhaust the pool at 8 processes) unless `env` asks for a value.
  script = tmp_path / "env.py"
  script.write_text("import os\nfrom jaxll import launch\n"
                    "launch.report({k: os.environ.get(k) for k in "
                    "('CUDA_DEVICE_MAX_CONNECTIONS', 'CUDA_MPS_PIPE_DIRECTORY')})\n")
  monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32")
  daemon = object.__new__(launch.MpsDaemon)  # a shared daemon, not started here
  daemon.env = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe")}
  w = launch.run(str(script), 2, timeout=60, mps=daemon)
  assert all(x.mps for x in w)
  assert [x.result for x in w] == [{"CUDA_DEVICE_MAX_CONNECTIONS": "4",
                                    "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe")}] * 2
  w = launch.run(str(script), 1, timeout=60, mps=daemon,
                 env={"CUDA_DEVICE_MAX_CONNECTIONS": "8"})
  assert w[0].result["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"
  w = launch.run(str(script), 1, timeout=60, mps=False)
  assert w[0].result["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
