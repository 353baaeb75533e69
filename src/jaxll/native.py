"""The compiled runtime (``jaxll._jaxll``): loads it, checks that the installed
jaxlib's XLA takes its FFI API version, registers its XLA FFI targets. Where jaxll was installed
without its kernels, ``ext`` is None and every call lowers to XLA's
collectives."""

from __future__ import annotations

import os
import re

import jax
import jaxlib

from jaxll import settings

REINSTALL_HINT = (
    "Reinstall jaxll in this environment (pip builds it against the oldest jaxlib it "
    "supports), from the jaxll source tree:\n  pip install --force-reinstall --no-deps .")


def installed_ffi_api() -> tuple[int, int] | None:
  """The XLA FFI API version (major, minor) of the installed jaxlib, read from
  the FFI headers it ships (None where they are missing)."""
  path = os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    return None
  found = dict(re.findall(r"#define\s+XLA_FFI_API_(MAJOR|MINOR)\s+(\d+)", text))
  if set(found) != {"MAJOR", "MINOR"}:
    return None
  return int(found["MAJOR"]), int(found["MINOR"])


def load_problem(built_jaxlib: str, built_api: tuple[int, int], installed_jaxlib: str,
                 installed_api: tuple[int, int] | None) -> str | None:
  """Why a runtime compiled against the XLA FFI headers of jaxlib `built_jaxlib`
  (FFI API `built_api`) cannot load in jaxlib `installed_jaxlib` (FFI API
  `installed_api`, None: unknown), or None if it can. It loads where the major
  versions match and the installed minor version is the same or newer: XLA takes
  handlers compiled against older headers (FFI API 0.3 in jaxlib 0.12, 0.5),
  while a handler compiled against newer ones may rely on what an older XLA
  lacks. A build serves the jaxlib it was compiled against and newer ones."""
  built = f"jaxlib {built_jaxlib} (XLA FFI API {built_api[0]}.{built_api[1]})"
  if installed_api is None:
    # no headers to read: only the very jaxlib it was compiled against is known to work
    if built_jaxlib == installed_jaxlib:
      return None
    installed = f"jaxlib {installed_jaxlib}, whose XLA FFI API version is unknown"
  else:
    installed = f"jaxlib {installed_jaxlib} (XLA FFI API {installed_api[0]}.{installed_api[1]})"
    if installed_api[0] == built_api[0] and installed_api[1] >= built_api[1]:
      return None
  return (f"jaxll's runtime was compiled against {built}, which {installed} cannot load: "
          f"jaxll loads in a jaxlib of the same XLA FFI API major version and the same or a "
          f"newer minor version.\n{REINSTALL_HINT}\n(Set JAXLL_SKIP_VERSION_CHECK=1 to load "
          f"it anyway, at your own risk.)")


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
        f"{REINSTALL_HINT}") from e
  # Built without a CUDA compiler (CMakeLists.txt): the package works, every call
  # lowers to XLA's collectives.
  ext = None
  NO_KERNELS_REASON = (
      "jaxll was installed without its CUDA kernels (its build had no usable CUDA compiler, "
      "or JAXLL_CUDA=none); to get them on Linux, build it again from its source with pip's "
      "default build isolation, which fetches NVIDIA's CUDA compiler wheels: pip install "
      "--force-reinstall --no-deps <jaxll source directory> (README.md, \"No kernels?\")")


def kernels_available() -> bool:
  """Whether this jaxll was built with its CUDA kernels (they then serve calls
  on CUDA GPUs that can reach each other; elsewhere XLA's collectives do)."""
  return ext is not None


def register_targets(module) -> None:
  """Registers the XLA FFI targets of a native module (its ``handlers()``
  table: name -> (capsule, whether XLA may capture it into command buffers,
  record-stage capsule or None)) for CUDA. A target with a record stage is
  registered with it unless JAXLL_RECORD_STAGE=0."""
  try:
    from jaxlib.xla_client import CustomCallTargetTraits
    cmd_buffer = {"traits": CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE}
  except (ImportError, AttributeError):  # pragma: no cover - older jaxlib
    cmd_buffer = {}
  record_stage = settings.record_stage()
  for name, (capsule, command_buffer, record) in module.handlers().items():
    fn = {"execute": capsule, "record": record} if record and record_stage else capsule
    jax.ffi.register_ffi_target(name, fn, platform="CUDA",
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
  _problem = load_problem(ext.built_jaxlib_version, tuple(ext.ffi_api_version),
                          jaxlib.__version__, installed_ffi_api())
  if _problem and not settings.skip_version_check():
    raise ImportError(_problem)
  register_targets(ext)
