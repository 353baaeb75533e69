"""The multi-process launcher (jaxll.tools.launch) on CPU, and the pure logic of
workspaces that span processes."""

import os
import time

import pytest

from jaxll import distributed
from jaxll.tools import launch
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
  assert "[jaxll.tools.launch process 1] joined" in str(e.value)  # progress marks are shown
  # and the whole outputs stay on the exception
  assert [w.process_id for w in e.value.workers] == [0, 1]
  assert e.value.workers[1].returncode == 3  # (process 0: killed once process 1 failed)
  assert "[jaxll.tools.launch process 1] joined" in e.value.workers[1].output


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


def test_free_and_build_again_dry_run_on_cpu():
  # tests/mp_scripts/free_check.py (the GPU tier's free-and-rebuild check) on
  # CPU devices in 2 processes: the calls go to XLA, free_workspaces runs in
  # every process each round
  script = os.path.join(HERE, "mp_scripts", "free_check.py")
  workers = launch.run(script, 2, args=["--platform", "cpu"], timeout=300, mps=False, env=ENV)
  for w in workers:
    assert w.result["errors"] == [] and w.result["paths"] == [["xla"]] * 3, w.result
    assert w.result["workspaces"] == [[]] * 3


def test_hang_fails_after_timeout():
  with pytest.raises(launch.LaunchError, match="timed out after 12 s"):
    launch.run(WORKER, 2, args=["hang"], timeout=12, mps=False, env=ENV)


def test_mps_required_but_missing(monkeypatch):
  monkeypatch.setattr(launch.shutil, "which", lambda name: None)
  with pytest.raises(launch.LaunchError, match="mps=True"):
    launch.run(WORKER, 1, mps=True, env=ENV)


def test_processes_get_the_hosts_gpus_in_turn(tmp_path, monkeypatch):
  # One GPU a process where the host has enough, shared in turn where it has
  # not; MPS (under "auto") only for processes that share a GPU.
  script = tmp_path / "gpu.py"
  script.write_text("import os\nfrom jaxll.tools import launch\n"
                    "launch.report(os.environ.get('CUDA_VISIBLE_DEVICES'))\n")
  started = []
  monkeypatch.setattr(launch, "_start_mps", lambda mps: started.append(mps))
  monkeypatch.setattr(launch, "_host_gpus", lambda: ["0", "1"])
  w = launch.run(str(script), 2, timeout=60, env=ENV)
  assert [x.result for x in w] == ["0", "1"] and started == []
  w = launch.run(str(script), 3, timeout=60, env=ENV)
  assert [x.result for x in w] == ["0", "1", "0"] and started == ["auto"]
  w = launch.run(str(script), 2, timeout=60, env=ENV, devices=["1", "1"])  # the caller's choice
  assert [x.result for x in w] == ["1", "1"] and started == ["auto", "auto"]
  monkeypatch.setattr(launch, "_host_gpus", lambda: [])  # no GPU: nothing set, as before
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  w = launch.run(str(script), 2, timeout=60, env=ENV, mps=False)
  assert [x.result for x in w] == [None, None]


def test_host_gpus_follow_cuda_visible_devices(monkeypatch):
  for visible, gpus in [("2,3", ["2", "3"]), (" 4 , 5 ", ["4", "5"]),
                        ("GPU-aa,GPU-bb", ["GPU-aa", "GPU-bb"]),
                        ("0,-1,2", ["0"]), ("", []), ("-1", [])]:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert launch._host_gpus() == gpus, visible
  assert launch._shares_gpu(["0", "0"]) and launch._shares_gpu(["0,1", "1,2"])
  assert not launch._shares_gpu(["0", "1"]) and not launch._shares_gpu(["0,1", "2,3"])
  assert launch._shares_gpu(None)  # (every process sees every GPU)


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
  # a GPU shared by processes: their grids together stay below its SM count
  # (an H200: 132 SMs, 264 resident blocks), so one SM is always free of them
  h200 = {"uuid": "a", "bound": 264, "sms": 132}
  assert distributed.agree_max_blocks([h200] * 4) == 32
  assert distributed.agree_max_blocks([h200] * 2) == 65
  # one rank on it: the whole bound
  assert distributed.agree_max_blocks([h200]) == 264
  # PDL stays off where processes share a GPU (workspace.cc, use_pdl)
  assert distributed.shares_gpu([h200] * 2)
  assert not distributed.shares_gpu(gpus)
  assert distributed.shares_gpu(mixed)
  assert not distributed.shares_gpu([h200])


def test_mps_workers_get_few_work_queues(tmp_path, monkeypatch):
  # Under MPS all clients share one pool of hardware work queues: the launcher
  # caps CUDA_DEVICE_MAX_CONNECTIONS (32 from the caller's environment would
  # exhaust the pool at 8 processes) unless `env` asks for a value.
  script = tmp_path / "env.py"
  script.write_text("import os\nfrom jaxll.tools import launch\n"
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


# --- the agreement protocol of workspaces spanning processes, with a fake store ---

import threading  # noqa: E402
import types  # noqa: E402


class _Store:
  """jax.distributed's key-value store, shared by the threads that play processes."""

  def __init__(self):
    self.data, self.cv = {}, threading.Condition()

  def key_value_set(self, key, value):
    with self.cv:
      assert key not in self.data, f"{key} set twice"
      self.data[key] = value
      self.cv.notify_all()

  key_value_set_bytes = key_value_set

  def blocking_key_value_get(self, key, timeout_ms):
    with self.cv:
      if not self.cv.wait_for(lambda: key in self.data, timeout_ms / 1000):
        raise TimeoutError(key)
      return self.data[key]

  blocking_key_value_get_bytes = blocking_key_value_get


def _run_processes(monkeypatch, hosts, fail=None, absent=(), timeout_ms=5000):
  """Runs distributed.build for a group of one GPU per process (len(hosts)
  processes, process p on host hosts[p]) in threads; `fail` = (step, process)
  makes that process's device_uuid ("facts"), create_workspace ("build") or
  workspace_connect ("connect") raise; the processes in `absent` never start.
  Returns per process: the result or the exception, and the workspaces it freed."""
  store, local = _Store(), threading.local()

  class PerProcess(dict):  # each process numbers its workspaces on its own
    def get(self, key, default=None):
      return local.generation.get(key, default)

    def __setitem__(self, key, value):
      local.generation[key] = value

  monkeypatch.setattr(distributed, "_generation", PerProcess())
  monkeypatch.setattr(distributed, "_client", lambda: store)
  monkeypatch.setattr(distributed.socket, "gethostname", lambda: hosts[local.pid])
  freed = {p: [] for p in range(len(hosts))}
  calls = {}

  def create_workspace(groups, virtual, scratch, timeout_ms, max_blocks=0, shared_gpu=False):
    calls[local.pid] = (max_blocks, shared_gpu)
    if fail == ("build", local.pid):
      raise RuntimeError("out of memory")
    return 100 + local.pid

  def workspace_connect(comm, handles):
    assert [h for g in handles for h in g if h] == [b"ipc%d" % p for p in range(len(hosts))
                                                    if p != local.pid]
    if fail == ("connect", local.pid):
      raise RuntimeError("cudaIpcOpenMemHandle failed")

  def device_uuid(o):
    if fail == ("facts", local.pid):
      raise RuntimeError("CUDA driver version is insufficient")
    return f"gpu-of-{hosts[local.pid]}"

  def workspace_ipc_handles(comm):
    if fail == ("vanish", local.pid):  # (the process dies before it publishes its handles)
      raise SystemExit
    return [b"ipc%d" % local.pid]

  fake = types.SimpleNamespace(
      device_uuid=device_uuid,
      device_block_bound=lambda o, carveout: 264, device_sm_count=lambda o: 132,
      workspace_ipc_handles=workspace_ipc_handles, workspace_connect=workspace_connect,
      # (a failed setup keeps what it exported: a peer may have mapped it)
      free_workspace=lambda comm, keep_exported=False: freed[local.pid].append(
          comm if keep_exported else ("freed outright", comm)))
  monkeypatch.setattr(distributed, "ext", fake)
  monkeypatch.setattr(distributed.native, "create_workspace", create_workspace)
  devs = [types.SimpleNamespace(id=p, process_index=p, local_hardware_id=0)
          for p in range(len(hosts))]
  config = types.SimpleNamespace(scratch_bytes=1 << 20, timeout_ms=1000)
  monkeypatch.setenv("JAXLL_SETUP_TIMEOUT_MS", str(timeout_ms))
  out = {}

  def one(p):
    local.pid, local.generation = p, {}
    try:
      out[p] = distributed.build([devs], p, config)
    except Exception as e:  # noqa: BLE001 (the test inspects it)
      out[p] = e
    except SystemExit:  # (a process that vanishes reports nothing)
      pass
  threads = [threading.Thread(target=one, args=(p,)) for p in range(len(hosts)) if p not in absent]
  for t in threads:
    t.start()
  for t in threads:
    t.join(30)
  _run_processes.store = store
  return out, freed, calls


def test_processes_on_one_host_build_and_connect(monkeypatch):
  out, freed, calls = _run_processes(monkeypatch, ["h", "h", "h"])
  assert out[0] == (100, ((0, -1, -1),)) and out[2] == (102, ((-1, -1, 0),))
  # 264 resident blocks shared by 3 ranks on one GPU, and their grids together
  # below its 132 SMs: 131 // 3; the GPU is shared by processes (no PDL there)
  assert calls == {0: (43, True), 1: (43, True), 2: (43, True)}
  assert freed == {0: [], 1: [], 2: []}


def test_group_spanning_hosts_is_refused_everywhere(monkeypatch):
  out, freed, calls = _run_processes(monkeypatch, ["a", "a", "b"])
  for p in range(3):
    assert isinstance(out[p], distributed.DistributedSetupError)
    assert "spans hosts (a, b)" in str(out[p])
  assert calls == {}  # nothing was allocated


@pytest.mark.parametrize("step", ["build", "connect"])
def test_one_failure_fails_every_process_alike(monkeypatch, step):
  out, freed, _ = _run_processes(monkeypatch, ["h", "h"], fail=(step, 1))
  reasons = {str(out[p]) for p in range(2)}
  assert len(reasons) == 1 and all(isinstance(out[p], distributed.DistributedSetupError)
                                   for p in range(2))
  assert f"{step} failed: process 1: " in reasons.pop()
  # every comm that was created is freed again
  assert freed == {0: [100], 1: [] if step == "build" else [101]}


def test_a_process_that_cannot_read_its_gpu_stops_every_process_at_once(monkeypatch):
  # (not after the setup timeout: the failing process publishes why)
  t0 = time.monotonic()
  out, freed, calls = _run_processes(monkeypatch, ["h", "h", "h"], fail=("facts", 2),
                                     timeout_ms=60_000)
  assert time.monotonic() - t0 < 20
  reasons = {str(out[p]) for p in range(3)}
  assert len(reasons) == 1 and all(isinstance(out[p], distributed.DistributedSetupError)
                                   for p in range(3))
  assert "reading the GPUs failed: process 2, GPU 0: CUDA driver version" in reasons.pop()
  assert calls == {}  # nothing was allocated


@pytest.mark.parametrize("absent", [1, 0])
def test_a_process_that_never_comes_is_a_setup_error_after_the_timeout(monkeypatch, absent):
  out, freed, calls = _run_processes(monkeypatch, ["h", "h"], absent=(absent,), timeout_ms=300)
  present = 1 - absent
  assert isinstance(out[present], distributed.DistributedSetupError), out[present]
  assert "no answer from a process for jaxll/ws/" in str(out[present])
  assert "within 300 ms" in str(out[present]) and "JAXLL_SETUP_TIMEOUT_MS" in str(out[present])
  assert absent not in out and calls == {}


def test_a_process_that_dies_while_connecting_is_a_setup_error_and_frees(monkeypatch):
  out, freed, calls = _run_processes(monkeypatch, ["h", "h"], fail=("vanish", 1), timeout_ms=300)
  assert 1 not in out  # (its thread ended)
  assert isinstance(out[0], distributed.DistributedSetupError), out[0]
  assert "/ipc/1 within 300 ms" in str(out[0])
  assert freed == {0: [100], 1: [101]}
  # the survivor told the others why it stopped
  status = [v for k, v in _run_processes.store.data.items() if k.endswith("/connect/0")]
  assert len(status) == 1 and status[0].startswith("process 0: no answer"), status


def test_a_failed_setup_is_not_repeated_until_the_workspaces_are_freed(monkeypatch):
  from jaxll import workspace
  attempts = []

  def build(groups, me, config):
    attempts.append(me)
    raise distributed.DistributedSetupError("connect failed: process 1: no peer access")
  monkeypatch.setattr(distributed, "build", build)
  groups = [[types.SimpleNamespace(id=0, process_index=0), types.SimpleNamespace(id=1, process_index=1)]]
  for _ in range(3):
    with pytest.raises(distributed.DistributedSetupError,
                       match="connect failed: process 1: no peer access"):
      workspace.get_distributed_workspace(groups)
  assert attempts == [0]
  workspace.free_workspaces()
  with pytest.raises(distributed.DistributedSetupError):
    workspace.get_distributed_workspace(groups)
  assert attempts == [0, 0]
  workspace.free_workspaces()


def _spanning_workspace(monkeypatch, store):
  """This process (0) holds one workspace spanning processes 0 and 1 in the
  registry; jaxll's native calls are recorded, in order."""
  import jax
  from jaxll import workspace
  log = []
  fake = types.SimpleNamespace(
      workspace_close_imports=lambda i: log.append(("close_imports", i)),
      free_workspace=lambda i, keep_exported=False: log.append(("free", i, keep_exported)),
      free_all=lambda: log.append(("free_all",)))
  monkeypatch.setattr(workspace, "ext", fake)
  monkeypatch.setattr(distributed, "_client", lambda: store)
  monkeypatch.setattr(jax, "devices", lambda: [types.SimpleNamespace(id=p, process_index=p)
                                              for p in range(2)])
  ws = workspace.Workspace(id=7, virtual=False, device_ids=((0, 1),), ordinals=((0, -1),),
                           config=workspace.WorkspaceConfig(), round_bytes=0, region_bytes=0,
                           bytes_per_rank=0, max_blocks=0, distributed=True)
  monkeypatch.setitem(workspace._registry, ("distributed", ws.device_ids, ws.config), ws)
  return workspace, log


def test_free_closes_imports_meets_the_peers_then_frees(monkeypatch):
  store = _Store()
  workspace, log = _spanning_workspace(monkeypatch, store)
  arrived = []

  def peer():  # process 1 reaches the barrier after this process closed its imports
    deadline = time.monotonic() + 10
    while ("close_imports", 7) not in log:
      if time.monotonic() > deadline:
        return
      time.sleep(0.01)
    key = [k for k in store.data if k.endswith("/closed/0")]
    arrived.append(key)
    if key:
      store.key_value_set(key[0][:-1] + "1", "ok")
  t = threading.Thread(target=peer, daemon=True)
  t.start()
  workspace.free_workspaces(timeout_s=10)
  t.join(10)
  assert arrived and arrived[0], "process 0 freed before it published its barrier key"
  assert log == [("close_imports", 7), ("free", 7, False), ("free_all",)]
  assert workspace.workspaces() == []


def test_free_keeps_exported_memory_where_a_peer_never_comes(monkeypatch, caplog):
  workspace, log = _spanning_workspace(monkeypatch, _Store())
  other = workspace.Workspace(id=8, virtual=False, device_ids=((1, 0),), ordinals=((-1, 0),),
                              config=workspace.WorkspaceConfig(), round_bytes=0, region_bytes=0,
                              bytes_per_rank=0, max_blocks=0, distributed=True)
  monkeypatch.setitem(workspace._registry, ("distributed", other.device_ids, other.config), other)
  t0 = time.monotonic()
  with caplog.at_level("WARNING", logger="jaxll"):
    workspace.free_workspaces(timeout_s=0.5)
  # (one wait: after the first barrier failed, the second workspace is kept at once)
  assert time.monotonic() - t0 < 0.9
  assert log == [("close_imports", 7), ("close_imports", 8), ("free", 7, True), ("free", 8, True),
                 ("free_all",)]
  assert "process 1 did not reach the 'closed' barrier" in caplog.text
  assert "stays allocated until this process ends" in caplog.text


def test_a_process_without_a_gpu_under_mps_gets_a_hint(tmp_path):
  # A worker that fails the way an MPS client without a work queue does. The
  # daemon is a stand-in (run() only reads its env; nothing is started here).
  script = tmp_path / "no_gpu.py"
  script.write_text("import sys\nprint('INTERNAL: no supported devices found for platform CUDA')\n"
                    "sys.exit(1)\n")
  daemon = launch.MpsDaemon.__new__(launch.MpsDaemon)
  daemon.env = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe")}
  with pytest.raises(launch.LaunchError, match=r"hint: under MPS a process found no GPU") as e:
    launch.run(str(script), 2, timeout=60, mps=daemon,
               env=dict(ENV, CUDA_DEVICE_MAX_CONNECTIONS="32"))
  assert "here 32 x 2 processes" in str(e.value)
  with pytest.raises(launch.LaunchError) as e:  # no MPS: no hint
    launch.run(str(script), 2, timeout=60, mps=False, env=ENV)
  assert "hint" not in str(e.value)
