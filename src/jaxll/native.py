"""The compiled runtime (``jaxll._jaxll``): loads it, checks it matches the
installed jaxlib, registers its XLA FFI targets. Where jaxll was installed
without its kernels, ``ext`` is None and every call lowers to XLA's
collectives."""

from __future__ import annotations

import os

import jax
import jaxlib

from jaxll import settings

REBUILD_HINT = (
    "Rebuild jaxll against the installed jaxlib, from the jaxll source tree:\n"
    "  pip install --no-build-isolation --force-reinstall --no-deps .")


def version_mismatch(built: str, installed: str) -> str | None:
  """A message if an extension built against jaxlib `built` cannot be loaded by
  jaxlib `installed`, else None. The XLA FFI ABI is versioned and a handler
  built against newer headers is refused, so jaxll requires the exact version."""
  if built == installed:
    return None
  return (f"jaxll was built against jaxlib {built}, but jaxlib {installed} is "
          f"installed. The XLA FFI ABI is versioned, so the two must match.\n"
          f"{REBUILD_HINT}\n(Set JAXLL_SKIP_VERSION_CHECK=1 to bypass this check "
          f"at your own risk.)")


_here = os.path.dirname(os.path.abspath(__file__))
_compiled = [f for f in os.listdir(_here) if f.startswith("_jaxll") and
             f.endswith((".so", ".pyd", ".dylib"))]

#: Why the kernels are missing (None when they are present).
NO_KERNELS_REASON: str | None = None

try:
  from jaxll import _jaxll as ext  # noqa: E402
except ImportError as e:  # pragma: no cover - depends on the installation
  if _compiled:
    raise ImportError(
        f"jaxll's compiled runtime (jaxll._jaxll) could not be loaded: {e}.\n"
        "To install it again (needs nvcc for the kernels):\n  pip install jax "
        "scikit-build-core nanobind\n  pip install --no-build-isolation .") from e
  # Installed without nvcc (CMakeLists.txt): the package works, every call
  # lowers to XLA's collectives.
  ext = None
  NO_KERNELS_REASON = ("jaxll was installed without its CUDA kernels (no nvcc at build "
                       "time); reinstall with nvcc on the PATH to use them")


def kernels_available() -> bool:
  """Whether this jaxll was built with its CUDA kernels (they then serve calls
  on CUDA GPUs that can reach each other; elsewhere XLA's collectives do)."""
  return ext is not None


def register_targets(module) -> None:
  """Registers the XLA FFI targets of a native module (its ``handlers()``
  table: name -> (capsule, whether XLA may capture it into command buffers))
  for CUDA."""
  try:
    from jaxlib.xla_client import CustomCallTargetTraits
    cmd_buffer = {"traits": CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE}
  except (ImportError, AttributeError):  # pragma: no cover - older jaxlib
    cmd_buffer = {}
  for name, (capsule, command_buffer) in module.handlers().items():
    jax.ffi.register_ffi_target(name, capsule, platform="CUDA",
                                **(cmd_buffer if command_buffer else {}))


def create_workspace(groups, virtual: bool, scratch_bytes: int, timeout_ms: int, *,
                     max_blocks: int = 0, shared_gpu: bool = False) -> int:
  """Builds a native workspace over groups of CUDA ordinals (-1: a rank in
  another process) with the kernel settings of now (settings.kernel_settings;
  `shared_gpu`: ranks of several processes share a GPU of it); `max_blocks` > 0
  bounds its grids further (the bound every process agreed on, or a tool's).
  Returns its id."""
  k = settings.kernel_settings(shared_gpu)
  return ext.create_workspace([list(g) for g in groups], virtual, int(scratch_bytes),
                              int(timeout_ms), int(max_blocks), k.pdl, k.signatures, k.trap,
                              k.carveout)


if ext is not None:
  _problem = version_mismatch(ext.built_jaxlib_version, jaxlib.__version__)
  if _problem and not settings.skip_version_check():
    raise ImportError(_problem)
  register_targets(ext)
