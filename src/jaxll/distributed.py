"""Workspaces whose groups span processes (``jax.distributed``).

Each process allocates and clears the memory of its own ranks, exports a CUDA
IPC handle for it, and publishes it in JAX's distributed key-value store; every
process then opens the handles of the ranks of its groups that live elsewhere.
No launcher, no MPI: the store that ``jax.distributed.initialize`` set up is
the only channel. The steps, every process in the same order:

1. facts: for each local rank, its host name, GPU UUID, SM count and how many
   blocks of jaxll's kernels the GPU holds at once;
2. agreement: groups that span hosts are refused (XLA serves them); the grid
   bound is the smallest per-GPU bound divided by the number of ranks that share
   that GPU (N processes on one GPU must all be resident together), and for a
   shared GPU also below its SM count divided by that number (see
   agree_max_blocks); where processes share a GPU, programmatic dependent
   launch stays off (unless JAXLL_PDL=1; settings.kernel_settings);
3. build: enable peer access between local ranks, allocate and clear
   (sentinel scratch poisoned); the memory is ready before any peer can learn
   its address;
4. connect: export, publish and open the IPC handles.
After steps 1, 3 and 4 every process publishes whether it succeeded, and all
of them give up together if one failed, so every process makes the same
lowering decision (XLA's all-reduce then serves the call). A process that waits
longer than JAXLL_SETUP_TIMEOUT_MS for another gives up the same way.

Every process must lower the same programs in the same order (as SPMD JAX
programs do): the keys are numbered per workspace key and process.
"""

from __future__ import annotations

import hashlib
import json
import socket

from jaxll import internals, native, settings
from jaxll.native import ext


class DistributedSetupError(RuntimeError):
  """A workspace spanning processes could not be built; the reason is the same
  in every process, except where a process gave up waiting for another (then
  each names what it waited for)."""


_generation: dict[str, int] = {}


def _client():
  return internals.distributed_client()


def _prefix(device_ids, config) -> str:
  digest = hashlib.sha1(repr((device_ids, config)).encode()).hexdigest()[:16]
  gen = _generation.get(digest, 0)
  _generation[digest] = gen + 1
  return f"jaxll/ws/{digest}/{gen}"


def agree_max_blocks(members: list[dict]) -> int:
  """The grid bound for a workspace whose ranks have these facts (dicts with
  "uuid", "bound" and "sms"): all ranks that share a GPU must be resident at
  once. Where ranks of several processes share a GPU, their grids together
  also stay below its SM count: a rank still running the work before its call
  (a GEMM whose blocks each need a whole SM) must find an SM that no spinning
  block holds, or its peers wait for it until they time out."""
  per_gpu: dict[str, int] = {}
  for m in members:
    per_gpu[m["uuid"]] = per_gpu.get(m["uuid"], 0) + 1

  def bound(m):
    share = per_gpu[m["uuid"]]
    b = int(m["bound"]) // share
    if share > 1 and "sms" in m:
      b = min(b, (int(m["sms"]) - 1) // share)
    return b
  return min(bound(m) for m in members)


def shares_gpu(members: list[dict]) -> bool:
  """Whether ranks with these facts (dicts with "uuid") put several processes'
  ranks on one GPU (members are the ranks of every process, one per device)."""
  uuids = [m["uuid"] for m in members]
  return len(set(uuids)) < len(uuids)


def build(groups, me: int, config) -> tuple[int, tuple[tuple[int, ...], ...]]:
  """Builds the workspace for `groups` (lists of jax Devices, some in other
  processes) in process `me`. Returns (workspace id, ordinals with -1 for remote
  ranks). Raises DistributedSetupError with a reason shared by all processes."""
  client = _client()
  if client is None:
    raise DistributedSetupError("a reduction group spans processes but jax.distributed is "
                                "not initialized")
  device_ids = tuple(tuple(d.id for d in g) for g in groups)
  prefix = _prefix(device_ids, config)
  timeout = settings.setup_timeout_ms()
  ordinals = tuple(tuple(d.local_hardware_id if d.process_index == me else -1 for d in g)
                   for g in groups)
  local = [d for g in groups for d in g if d.process_index == me]

  def get(key: str, raw: bool = False):
    # A process that never publishes `key` (it died, or lowers other programs
    # or in another order) ends the wait after `timeout` ms.
    try:
      if raw:
        return client.blocking_key_value_get_bytes(key, timeout)
      return client.blocking_key_value_get(key, timeout)
    except Exception as e:  # the store's deadline or a lost coordinator
      raise DistributedSetupError(
          f"no answer from a process for {key} within {timeout} ms (every process must "
          f"lower the same programs in the same order; JAXLL_SETUP_TIMEOUT_MS sets the "
          f"wait): {e}") from None

  # 1. facts (a process that cannot read a GPU's publishes why, so that its
  # peers stop at once instead of waiting out the timeout)
  host = socket.gethostname()
  for d in local:
    o = d.local_hardware_id
    try:
      info = {"host": host, "uuid": ext.device_uuid(o),
              "bound": ext.device_block_bound(o, settings.kernel_settings().carveout),
              "sms": ext.device_sm_count(o)}
    except Exception as e:  # reported to every process
      info = {"error": f"process {me}, GPU {o}: {e}"}
    client.key_value_set(f"{prefix}/info/{d.id}", json.dumps(info))
  facts = {d.id: json.loads(get(f"{prefix}/info/{d.id}")) for g in groups for d in g}
  failed = sorted({f["error"] for f in facts.values() if "error" in f})
  if failed:
    raise DistributedSetupError("reading the GPUs failed: " + "; ".join(failed))

  # 2. agreement (every process computes the same from the same facts)
  for g in groups:
    hosts = sorted({facts[d.id]["host"] for d in g})
    if len(hosts) > 1:
      raise DistributedSetupError(f"a reduction group spans hosts ({', '.join(hosts)}); "
                                  "jaxll's kernels serve one host")
  members = [facts[d.id] for g in groups for d in g]
  max_blocks = agree_max_blocks(members)
  if max_blocks < 1:
    raise DistributedSetupError("the GPUs cannot hold one block per rank for every rank "
                                "that shares them")

  # 3. build (local peer access, allocation, clearing), agree that everybody did
  processes = sorted({d.process_index for g in groups for d in g})

  def agree(step: str, status: str) -> None:
    client.key_value_set(f"{prefix}/{step}/{me}", status)
    failures = [s for s in (get(f"{prefix}/{step}/{p}") for p in processes) if s != "ok"]
    if failures:
      raise DistributedSetupError(f"{step} failed: " + "; ".join(failures))

  ws_id = None
  try:
    ws_id = native.create_workspace(ordinals, False, config.scratch_bytes, config.timeout_ms,
                                    max_blocks=max_blocks, shared_gpu=shares_gpu(members))
    status = "ok"
  except Exception as e:  # reported to every process
    status = f"process {me}: {e}"
  try:
    agree("build", status)
    # 4. publish handles, map the peers', agree that everybody could. A process
    # that cannot export publishes empty handles, so nobody waits for it.
    status = "ok"
    try:
      exported = ext.workspace_ipc_handles(ws_id)
    except Exception as e:  # reported to every process
      exported = [b""] * len(local)
      status = f"process {me}: {e}"
    for d, handle in zip(local, exported):
      client.key_value_set_bytes(f"{prefix}/ipc/{d.id}", handle)
    try:
      handles = [[b"" if d.process_index == me else get(f"{prefix}/ipc/{d.id}", raw=True)
                  for d in g] for g in groups]
      if status == "ok":
        ext.workspace_connect(ws_id, handles)
    except DistributedSetupError as e:  # (a peer's handle never came: tell the others, stop)
      client.key_value_set(f"{prefix}/connect/{me}", f"process {me}: {e}")
      raise
    except Exception as e:  # reported to every process
      status = f"process {me}: {e}"
    agree("connect", status)
  except BaseException:
    if ws_id is not None:
      ext.free_workspace(ws_id, keep_exported=True)  # (a peer may have mapped it)
    raise
  return ws_id, ordinals
