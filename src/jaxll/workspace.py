"""The process-wide registry of symmetric workspaces.

A workspace serves one set of device groups that reduce together (every group of
one mesh axis, or N virtual ranks on one GPU). It is created the first time a
lowering needs it, at trace/lowering time and never inside an XLA execution,
cached under a stable key (the groups' device ids and the configuration), and
reused by every jitted function and step after that. It is freed by
:func:`free_workspaces` or at interpreter exit.

``scratch_bytes`` is what one round of a one-shot kernel moves per rank (a
two-shot round moves N times that); messages of any size run, in as many rounds
as they need. Memory per rank is about ``(14 * N + 2) * scratch_bytes`` for a
group of N devices: for each of two scratch phases and two epoch parities, N
incoming regions of LL16 (twice the payload) and of sentinel scratch, plus
single-buffered regions for the barrier baselines and the LL128-atomic lines.
With the default 512 KiB, a group of 8 GPUs uses about 57 MiB on each GPU.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import threading
from typing import Sequence

from jaxll import native, settings
from jaxll.native import ext

DEFAULT_SCRATCH_BYTES = settings.DEFAULT_SCRATCH_BYTES
DEFAULT_TIMEOUT_MS = settings.DEFAULT_TIMEOUT_MS


class CollectiveError(RuntimeError):
  """A jaxll kernel recorded an error: the outputs of the call that failed,
  and of every later call on its workspace, are poisoned until
  :func:`reset`."""


class CollectiveTimeoutError(CollectiveError):
  """A jaxll kernel gave up waiting for a peer: the ranks are out of step."""


class CollectiveMismatchError(CollectiveError):
  """Ranks of one group made different calls (element count, dtype, op or
  algorithm) at the same point."""


class RaggedSizeError(CollectiveError):
  """A ragged all-to-all's slice lay outside its operand's or output's rows,
  or a rank sent a slice of another size than its receiver expected."""


@dataclasses.dataclass(frozen=True)
class WorkspaceConfig:
  """How workspaces are built.

  Attributes:
    scratch_bytes: bytes per rank one round of a one-shot kernel moves (larger
      messages take several rounds). Memory per rank is about
      ``(14 * N + 2) * scratch_bytes`` for a group of N devices.
    timeout_ms: how long a kernel waits for a peer before it gives up, records
      an error and poisons its output (instead of hanging the GPU).
  """
  scratch_bytes: int = DEFAULT_SCRATCH_BYTES
  timeout_ms: int = DEFAULT_TIMEOUT_MS

  def __post_init__(self):
    if int(self.scratch_bytes) < 8:
      raise ValueError(f"scratch_bytes must be at least 8, got {self.scratch_bytes}")
    if int(self.timeout_ms) < 1:
      raise ValueError(f"timeout_ms must be at least 1, got {self.timeout_ms}")


_config = WorkspaceConfig(scratch_bytes=settings.scratch_bytes(), timeout_ms=settings.timeout_ms())


def get_config() -> WorkspaceConfig:
  """The configuration new workspaces are built with."""
  return _config


def set_config(**changes) -> WorkspaceConfig:
  """Changes the configuration of workspaces built from now on.

  Existing workspaces keep theirs; functions lowered later use workspaces with
  the new configuration. Accepts the fields of :class:`WorkspaceConfig`; the
  environment variables ``JAXLL_SCRATCH_BYTES`` and ``JAXLL_TIMEOUT_MS`` set the
  initial values.
  """
  global _config
  _config = dataclasses.replace(_config, **changes)
  return _config


@dataclasses.dataclass(frozen=True)
class Workspace:
  """A built workspace (read-only description)."""
  id: int
  virtual: bool
  device_ids: tuple[tuple[int, ...], ...]  # jax Device.id of each rank, per group
  ordinals: tuple[tuple[int, ...], ...]    # CUDA ordinal of each rank, per group
  config: WorkspaceConfig
  round_bytes: int      # bytes per rank one one-shot round moves
  region_bytes: int     # scratch per (block, parity, source) region
  bytes_per_rank: int   # device memory each rank holds
  max_blocks: int       # grid bound that keeps every block co-resident
  distributed: bool = False  # some ranks live in other processes (CUDA IPC)


_lock = threading.Lock()
_registry: dict[tuple, Workspace] = {}
# Why a workspace spanning processes could not be built, by its key: every
# process failed alike, so every process answers later calls from here alike
# instead of repeating the setup (and its waits).
_failed: dict[tuple, str] = {}


def get_workspace(ordinals: Sequence[Sequence[int]], device_ids: Sequence[Sequence[int]],
                  *, virtual: bool = False, config: WorkspaceConfig | None = None,
                  max_blocks: int = 0) -> Workspace:
  """Returns the workspace for these groups, building it on first use
  (`max_blocks` > 0: a tool's own bound on its grids, kept with it)."""
  config = config or _config
  ordinals = tuple(tuple(int(o) for o in g) for g in ordinals)
  device_ids = tuple(tuple(int(d) for d in g) for g in device_ids)
  key = (virtual, device_ids, ordinals, config, max_blocks)
  settings.kernel_settings()  # a bad setting fails here, before anything is built
  with _lock:
    ws = _registry.get(key)
    if ws is None:
      ws_id = native.create_workspace(ordinals, virtual, config.scratch_bytes, config.timeout_ms,
                                      max_blocks=max_blocks)
      ws = _describe(ws_id, virtual, device_ids, ordinals, config)
      _registry[key] = ws
    return ws


def _describe(ws_id, virtual, device_ids, ordinals, config, distributed=False) -> Workspace:
  info = ext.workspace_info(ws_id)
  return Workspace(id=ws_id, virtual=virtual, device_ids=device_ids, ordinals=ordinals,
                   config=config, round_bytes=int(info["round_bytes"]),
                   region_bytes=int(info["region_bytes"]),
                   bytes_per_rank=int(info["bytes_per_rank"]),
                   max_blocks=int(info["max_blocks"]), distributed=distributed)


def get_distributed_workspace(groups, *, config: WorkspaceConfig | None = None) -> Workspace:
  """The workspace for groups of jax Devices some of which belong to other
  processes (see jaxll/distributed.py), building it on first use. Every process
  must ask for it at the same point of the same program. Raises
  ``jaxll.distributed.DistributedSetupError`` (the same in every process) when
  it cannot be built, and again without a new attempt when asked for the same
  workspace later (until :func:`free_workspaces`)."""
  import jax
  from jaxll import distributed
  config = config or _config
  me = jax.process_index()
  device_ids = tuple(tuple(int(d.id) for d in g) for g in groups)
  key = ("distributed", device_ids, config)
  settings.kernel_settings()
  with _lock:
    ws = _registry.get(key)
    if ws is None:
      if key in _failed:
        raise distributed.DistributedSetupError(_failed[key])
      try:
        ws_id, ordinals = distributed.build(groups, me, config)
      except distributed.DistributedSetupError as e:
        _failed[key] = str(e)
        raise
      ws = _describe(ws_id, False, device_ids, ordinals, config, distributed=True)
      _registry[key] = ws
    return ws


def workspaces() -> list[Workspace]:
  """The workspaces built so far in this process."""
  with _lock:
    return sorted(_registry.values(), key=lambda w: w.id)


def free_workspaces(*, timeout_s: float | None = None) -> None:
  """Frees every workspace, after waiting for their devices to go idle.

  Compiled functions refer to workspaces by id, so this also clears JAX's
  caches: functions are lowered again (building new workspaces) when next
  called. A compiled executable kept across this call (``jit(f).lower(...)
  .compile()``) fails clearly instead: its host check raises
  FAILED_PRECONDITION ("workspace N was freed"), and a kernel XLA replays from
  a recorded command buffer finds its header marked freed (headers, 4 KiB per
  rank, are never freed), poisons its output and touches no freed memory.
  JAX dispatches asynchronously, so XLA may still be launching a jaxll call on
  another thread when this runs: that launch finishes first, the devices then
  run everything enqueued to its end, and only then is the memory freed; a
  call launched after that fails with FAILED_PRECONDITION. So results of calls
  still in flight may come back as such errors or poisoned: block on them
  (``jax.block_until_ready``) before freeing to keep them. With workspaces that
  span processes, call it in every process at the same point of the program
  (as :func:`reset`): each process first unmaps the other processes' memory,
  then the processes meet at a barrier through ``jax.distributed``'s key-value
  store, and only then free their own (so no process frees memory a peer still
  maps). Where a process does not arrive within `timeout_s` (default
  ``RESET_TIMEOUT_S``), the memory it was handed stays allocated until this
  process ends, with a warning. Their next setups pair up by count. It also
  forgets the setups that failed, so that they are tried again. To recover
  from an error without recompiling, use :func:`reset`.
  """
  import jax
  timeout_s = RESET_TIMEOUT_S if timeout_s is None else timeout_s
  with _lock:
    spanning = [ws for ws in _registry.values() if ws.distributed]
    _registry.clear()
    _failed.clear()
    if ext is not None:
      for ws in spanning:
        ext.workspace_close_imports(ws.id)
      missed = False  # (after one barrier timed out, the rest are kept without waiting)
      for ws in spanning:
        if not missed:
          try:
            _process_barrier(ws, "free", "closed", timeout_s)
          except CollectiveError as e:
            missed = True
            logging.getLogger("jaxll").warning(
                "jaxll.free_workspaces(): %s; the memory other processes were handed stays "
                "allocated until this process ends (this workspace's and the later ones')", e)
        ext.free_workspace(ws.id, keep_exported=missed)
      ext.free_all()
  jax.clear_caches()


def _recorded() -> list[tuple[int, str]]:
  out = []
  for ws in workspaces():
    for *_, word, message in ext.workspace_errors(ws.id):
      out.append((int(ext.decode_error(word)[0]), message))
  return out


def errors() -> list[str]:
  """Messages for every error jaxll kernels recorded (empty if none). Reads
  host memory only: it works even after JAXLL_ON_ERROR=trap aborted the CUDA
  context."""
  return [message for _, message in _recorded()]


def check_errors() -> None:
  """Raises :class:`CollectiveMismatchError`, :class:`RaggedSizeError` or
  :class:`CollectiveTimeoutError` if a jaxll kernel has recorded an error.

  A kernel that gives up (a peer never came, or made a different call) records
  what happened in pinned host memory before it ends and fills its output with
  all-ones bits (NaN for floats). After any host synchronization with a step's
  outputs (``block_until_ready``, ``device_get``), this reports every failure of
  that step. Programs check by themselves too, each time they start (see
  docs/faults.md), which reports a failure one step later.
  """
  found = _recorded()
  if found:
    kind = found[0][0]
    from jaxll.algorithms import ERROR_KIND_CODES  # (the error word's kinds, from the native table)
    cls = {ERROR_KIND_CODES["mismatch"]: CollectiveMismatchError,
           ERROR_KIND_CODES["ragged"]: RaggedSizeError}.get(kind, CollectiveTimeoutError)
    raise cls("\n".join(message for _, message in found))


RESET_TIMEOUT_S = 300.0


def reset(*, timeout_s: float = RESET_TIMEOUT_S) -> None:
  """Makes every workspace of this process usable again after an error.

  Waits for this process's jaxll kernels to finish (a kernel still waiting for
  a peer gives up within the workspace's timeout), then puts every workspace
  back in the state of a new one: epochs, scratch and error records cleared.
  Workspace ids and memory stay, so compiled functions keep working, without
  being compiled again. Collective: every process that shares a workspace
  must call it at the same point of its program (between the same two steps);
  for a workspace spanning processes the calls meet at two barriers through
  ``jax.distributed``'s key-value store (all quiet, then all cleared) and a
  process that does not arrive within `timeout_s` makes it raise
  :class:`CollectiveError`. Not possible after JAXLL_ON_ERROR=trap aborted the
  CUDA context: restart the process then.
  """
  for ws in workspaces():
    if not ws.distributed:
      ext.workspace_reset(ws.id)
      continue
    ext.workspace_quiesce(ws.id)
    _process_barrier(ws, "reset", "quiet", timeout_s)
    ext.workspace_reset(ws.id)
    _process_barrier(ws, "reset", "cleared", timeout_s)


_barrier_generation: dict[tuple[str, str, str], int] = {}


def _process_barrier(ws: Workspace, what: str, step: str, timeout_s: float) -> None:
  """Meets every other process of the spanning workspace `ws` at barrier
  `step` of a collective `what` (reset, free), through jax.distributed's
  key-value store; raises CollectiveError naming a process that did not arrive
  within `timeout_s`. Every process makes the same barriers in the same order
  (the keys are counted per workspace, collective and step)."""
  import hashlib
  import jax
  from jaxll import distributed
  client = distributed._client()
  if client is None:
    raise CollectiveError(f"jaxll.{what}(): jax.distributed is no longer initialized")
  ids = {d for g in ws.device_ids for d in g}
  processes = sorted({d.process_index for d in jax.devices() if d.id in ids})
  me = jax.process_index()
  digest = hashlib.sha1(repr((ws.device_ids, ws.config)).encode()).hexdigest()[:16]
  count = (what, digest, step)
  gen = _barrier_generation.get(count, 0)
  _barrier_generation[count] = gen + 1
  prefix = f"jaxll/{what}/{digest}/{gen}/{step}"
  client.key_value_set(f"{prefix}/{me}", "ok")
  for p in processes:
    try:
      client.blocking_key_value_get(f"{prefix}/{p}", int(timeout_s * 1000))
    except Exception as e:  # the store raises on timeout
      raise CollectiveError(
          f"jaxll.{what}(): process {p} did not reach the '{step}' barrier of workspace "
          f"{ws.id} within {timeout_s:g} s (has it died? a workspace spanning a dead "
          f"process cannot be {'freed' if what == 'free' else what}; restart the job): "
          f"{e}") from None


def on_error_mode() -> str:
  """``"poison"`` (default) or ``"trap"``, from JAXLL_ON_ERROR (read when a
  workspace is built). Raises ValueError for any other value."""
  return settings.on_error()


@atexit.register
def _free_at_exit() -> None:
  with _lock:
    _registry.clear()
    if ext is None:
      return
    try:
      ext.free_all(keep_exported=True)  # (a peer process may still map what it was handed)
    except Exception:  # pragma: no cover - interpreter teardown
      pass
