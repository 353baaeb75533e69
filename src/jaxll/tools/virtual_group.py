"""The virtual group every tool of ``jaxll.tools.testing`` runs on: the
testing module's native half, and the workspace of N virtual ranks on one GPU
(see ``jaxll.tools.testing``)."""

from __future__ import annotations

import functools

import jax

from jaxll import extension, native, settings, workspace
from jaxll.native import ext

if ext is not None:
  from jaxll.tools import _jaxll_testing as tools

  tools.init(extension.api())  # (its kernels load with every workspace, as jaxll's do)
  native.register_targets(tools)
else:
  tools = None


def need_kernels() -> None:
  if ext is None:
    raise RuntimeError(f"jaxll.tools.testing: {native.NO_KERNELS_REASON}")


@functools.cache
def _block_bound(ordinal: int, carveout: int) -> int:
  """Most co-resident blocks of the tools' kernels (the library's and their
  group twins) on CUDA device `ordinal`."""
  return tools.block_bound(ordinal, carveout)


def cuda_device(device=None):
  if device is not None:
    if device.platform != "gpu":
      raise ValueError(f"virtual ranks need a CUDA GPU, got {device}")
    return device
  try:
    gpus = jax.devices("cuda")
  except RuntimeError:
    gpus = []
  if not gpus:
    raise RuntimeError("virtual ranks need a CUDA GPU and JAX's CUDA backend; none found")
  return gpus[0]


def virtual_workspace(nranks: int, *, device=None,
                      config: workspace.WorkspaceConfig | None = None) -> workspace.Workspace:
  """The workspace of `nranks` virtual ranks on `device` (first GPU by default)."""
  need_kernels()
  if not 1 <= nranks <= ext.max_ranks:
    raise ValueError(f"nranks must be in 1..{ext.max_ranks}, got {nranks}")
  dev = cuda_device(device)
  ordinal = dev.local_hardware_id
  # every rank's blocks share the GPU: the grid bound is the device's over the ranks
  bound = _block_bound(ordinal, settings.kernel_settings().carveout) // nranks
  ws = workspace.get_workspace([[ordinal] * nranks], [[dev.id] * nranks], virtual=True,
                               config=config, max_blocks=bound)
  tools.attach(ws.id, ordinal, nranks)
  return ws



def check_kernel_algorithm(algorithm: str) -> None:
  """ValueError unless `algorithm` is one of the one-shot kernels (the
  gathers', scatters' and exchanges')."""
  from jaxll.collective_common import KERNEL_ALGORITHMS
  if algorithm not in KERNEL_ALGORITHMS:
    raise ValueError(f"algorithm must be one of {list(KERNEL_ALGORITHMS)}, got {algorithm!r}")


def dimension(dim: int, ndim: int, name: str) -> int:
  """`dim` of `ndim` dimensions, negative counting from the end; ValueError
  out of range."""
  if not -ndim <= dim < ndim:
    raise ValueError(f"{name}: dimension {dim} is out of range for {ndim} dimensions")
  return dim % ndim
