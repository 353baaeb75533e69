"""Where a jaxll collective can run, as its lowering sees it: the platform, the
concrete mesh and its reduction groups, and the workspace that serves them
(built here, at lowering time, never while the program runs). Every
collective's lowering rule asks these questions; each decides the rest itself.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from jaxll import (algorithms, call_sites, distributed, internals, native, settings, sites,
                   workspace)
from jaxll.native import ext


class AlgorithmUnavailableError(ValueError):
  """An algorithm forced with ``algorithm=`` cannot serve a call site."""


_warned = []


def warn_no_kernels_once() -> None:
  """Logs once that this install has no kernels (the first lowering for a GPU)."""
  if not _warned:
    _warned.append(True)
    call_sites.logger.warning("jaxll: %s; every call uses XLA's all-reduce",
                              native.NO_KERNELS_REASON)


def platforms(ctx) -> tuple[str, ...]:
  """The platforms the program `ctx` lowers is for."""
  platforms = getattr(ctx, "platforms", None) or ctx.module_context.platforms
  return tuple(platforms)


def reduction_groups(mesh, axes: tuple) -> list[list]:
  """The device groups of `mesh` that reduce together over `axes`, each in rank
  order (row-major over `axes` in the order given)."""
  names = tuple(mesh.axis_names)
  devices = np.asarray(mesh.devices)
  reduced = [names.index(a) for a in axes]
  kept = [i for i in range(len(names)) if i not in reduced]
  size = math.prod(devices.shape[i] for i in reduced)
  arranged = np.transpose(devices, kept + reduced).reshape(-1, size)
  return [list(row) for row in arranged]


def _peers_reachable(groups: list[list]) -> str | None:
  for g in groups:
    for a in g:
      for b in g:
        if a is not b and not ext.can_access_peer(a.local_hardware_id, b.local_hardware_id):
          return (f"GPU {a.local_hardware_id} cannot access GPU "
                  f"{b.local_hardware_id} (no peer access)")
  return None


def disabled_reason(ctx, requested: str, collective: str) -> str:
  """Why JAXLL_DISABLE sends this call to XLA's `collective` ("" where it is
  not set): the switch covers every call, a named kernel too, with a warning
  naming the call site."""
  if not settings.disabled():
    return ""
  reason = "JAXLL_DISABLE is set"
  if requested not in (algorithms.AUTO, algorithms.XLA, algorithms.DETERMINISTIC):
    reason += f" (algorithm={requested!r} ignored)"
    call_sites.logger.warning("jaxll: %s at %s: XLA's %s serves it", reason, sites.site_of(ctx),
                              collective)
  return reason


def peer_atomics_problem(groups: list[list]) -> str | None:
  """Why twoshot_ll128_atomic cannot run between this process's GPUs of a group
  (its adds land in a peer GPU's memory, atomic only where the link carries
  them natively: NVLink, not PCIe), or None. GPUs of other processes are not
  asked (each process sees only its own)."""
  me = jax.process_index()
  for g in groups:
    mine = sorted({d.local_hardware_id for d in g if d.process_index == me})
    for a in mine:
      for b in mine:
        if a != b and not ext.peer_native_atomics(a, b):
          return (f"GPU {a}'s atomics on GPU {b}'s memory are not native over their link "
                  "(PCIe): the vector adds would not be atomic")
  return None


def workspace_for_groups(groups) -> tuple[int, str]:
  """(workspace id, "") of the workspace serving `groups` (lists of jax
  Devices), built on first use, or (0, why none can)."""
  n = len(groups[0])
  if n > ext.max_ranks:
    return 0, f"group of {n} devices exceeds the kernels' limit of {ext.max_ranks}"
  me = jax.process_index()
  if any(d.platform != "gpu" for g in groups for d in g):
    return 0, "mesh devices are not CUDA GPUs"
  if any(d.process_index != me for g in groups for d in g):
    # Peer access and IPC mapping are checked while building, and every
    # process learns every other's outcome, so all decide alike.
    try:
      ws = workspace.get_distributed_workspace(groups)
    except distributed.DistributedSetupError as e:
      return 0, str(e)
  else:
    problem = _peers_reachable(groups)
    if problem:
      return 0, problem
    try:
      ws = workspace.get_workspace([[d.local_hardware_id for d in g] for g in groups],
                                   [[d.id for d in g] for g in groups])
    except RuntimeError as e:  # (CUDA refused: memory, peer access; tried again next lowering)
      gpus = sorted({d.local_hardware_id for g in groups for d in g})
      problem = f"the workspace for GPUs {gpus} could not be built: {e}"
      call_sites.logger.warning("jaxll: %s; XLA serves these calls", problem)
      return 0, problem
  return ws.id, ""


def mesh_groups(ctx, axes: tuple):
  """(the concrete mesh of the program `ctx` lowers or None, its reduction
  groups over `axes` or None). A shard_map over an abstract mesh has one
  under jax.set_mesh (internals.lowering_mesh)."""
  mesh = internals.lowering_mesh(ctx)
  try:
    groups = reduction_groups(mesh, axes) if mesh is not None else None
  except ValueError:  # an axis that is not the mesh's (a vmap axis)
    groups = None
  return mesh, groups


def no_mesh_reason(ctx) -> str:
  """Why the lowering of `ctx` has no concrete mesh."""
  if getattr(ctx.module_context.axis_context, "mesh", None) is not None:
    return ("an abstract mesh, and no jax.set_mesh: the devices are not known when "
            "lowering (use jax.set_mesh, or a concrete mesh)")
  return "no concrete device mesh at lowering time"


def group_size(ctx, axes: tuple) -> int:
  """Devices per reduction group over `axes` (0 if unknown at lowering time),
  without building a workspace."""
  groups = mesh_groups(ctx, axes)[1]
  return len(groups[0]) if groups else 0


def workspace_for(ctx, axes: tuple) -> tuple[int, int, str]:
  """(workspace id, group size, reason) for a collective over the mesh axes
  `axes` in the program `ctx` lowers: the id of the workspace jaxll's own
  calls over those axes use (built on first use), or 0 and the reason no
  kernel can serve them (then lower to XLA's collectives instead)."""
  n, problem = unserved(ctx, axes)
  if problem:
    return 0, n, problem
  ws_id, problem = workspace_for_groups(mesh_groups(ctx, axes)[1])
  return ws_id, n, problem


def unserved(ctx, axes: tuple) -> tuple[int, str]:
  """(group size or 0, why no kernel can serve a collective over `axes` here,
  or ""), without building a workspace: JAXLL_DISABLE, the platform, an
  install without kernels, no concrete mesh."""
  mesh, groups = mesh_groups(ctx, axes)
  n = len(groups[0]) if groups else 0
  if settings.disabled():
    return n, "JAXLL_DISABLE is set"
  platforms_ = platforms(ctx)
  if platforms_ != ("cuda",):
    return n, f"lowering for {'/'.join(platforms_)}; jaxll kernels run on CUDA GPUs"
  if ext is None:
    return n, native.NO_KERNELS_REASON
  if mesh is None or not groups:
    return n, no_mesh_reason(ctx)
  return n, ""


