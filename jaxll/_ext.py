"""Loads the native extension, checks it matches the installed jaxlib, registers
its XLA FFI targets."""

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
_source_tree = os.path.isdir(os.path.join(_here, os.pardir, "ffi"))
_compiled = [f for f in os.listdir(_here) if f.startswith("_jaxll") and
             f.endswith((".so", ".pyd", ".dylib"))]

#: Why the kernels are missing (None when they are present).
NO_KERNELS_REASON: str | None = None

try:
  from jaxll import _jaxll as ext  # noqa: E402
except ImportError as e:  # pragma: no cover - depends on the installation
  if _source_tree or _compiled:
    raise ImportError(
        f"jaxll's compiled extension (jaxll._jaxll) could not be loaded: {e}.\n" +
        (f"This jaxll is the source tree at {os.path.dirname(_here)}, which holds no "
         "compiled extension: install it (pip install --no-build-isolation .) and "
         "import it from another directory.\n" if _source_tree else "") +
        "To install (needs nvcc for the kernels):\n  pip install jax scikit-build-core "
        "nanobind\n  pip install --no-build-isolation .") from e
  # Installed without nvcc (CMakeLists.txt): the package works, every call
  # lowers to XLA's all-reduce.
  ext = None
  NO_KERNELS_REASON = ("jaxll was installed without its CUDA kernels (no nvcc at build "
                       "time); reinstall with nvcc on the PATH to use them")


def kernels_available() -> bool:
  """Whether this jaxll was built with its CUDA kernels (they then serve calls
  on CUDA GPUs that can reach each other; elsewhere XLA's all-reduce does)."""
  return ext is not None


if ext is not None:
  _problem = version_mismatch(ext.built_jaxlib_version, jaxlib.__version__)
  if _problem and not settings.env_flag("JAXLL_SKIP_VERSION_CHECK"):
    raise ImportError(_problem)


def _register_targets() -> None:
  try:
    from jaxlib.xla_client import CustomCallTargetTraits
    cmd_buffer = {"traits": CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE}
  except (ImportError, AttributeError):  # pragma: no cover - older jaxlib
    cmd_buffer = {}
  for name, capsule in ext.handlers().items():
    # jaxll_all_reduce keeps every per-call value on the device, so XLA may
    # capture it into command buffers (CUDA graphs), like the no-op used to
    # measure the custom-call floor. The virtual-rank handlers fork onto several
    # streams and stay outside them (their host checks run every time), except
    # their "_graph" twins, which benchmarks let XLA capture.
    extra = cmd_buffer if (name.endswith("_graph") or name in (
        "jaxll_all_reduce", "jaxll_all_reduce_rmsnorm", "jaxll_gather_scatter", "jaxll_noop",
        "jaxll_join")) else {}
    jax.ffi.register_ffi_target(name, capsule, platform="CUDA", **extra)


if ext is not None:
  _register_targets()
