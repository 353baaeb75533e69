"""The compiled runtime: picks the runtime layer the installed jaxlib takes,
loads it, registers its XLA FFI targets.

A build holds one kernel library (``libjaxll_kernels.so``) and one or two
runtime layers over it, ``jaxll._runtime_ffi_<major>_<minor>``, each compiled
against the XLA FFI headers of one jaxlib (``jaxll._layers`` lists them): a
pip install with build isolation has the base layer (jaxlib 0.10.0's headers,
0.11.1's on Python 3.14), which every supported jaxlib takes, and on Python 3.12
and newer the record layer (jaxlib 0.12.1's), which has XLA FFI's record stage.
The newest layer that the installed jaxlib takes is ``ext``. Where jaxll was
installed without its kernels, ``ext`` is None and every call lowers to XLA's
collectives."""

from __future__ import annotations

import dataclasses
import importlib
import os
import re

import jax
import jaxlib

from jaxll import settings

REINSTALL_HINT = (
    "Reinstall jaxll in this environment (with build isolation, pip builds its runtime "
    "layers for every supported jaxlib), from the jaxll source tree:\n"
    "  pip install --force-reinstall --no-deps .")


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


def jaxlib_release(version: str) -> tuple[int, ...]:
  """The leading numbers of a jaxlib version ("0.12.0.1" -> (0, 12, 0, 1),
  "0.12.2.dev20261201" -> (0, 12, 2))."""
  out = []
  for part in version.split("."):
    m = re.match(r"\d+", part)
    if m is None:
      break
    out.append(int(m.group()))
    if m.end() != len(part):
      break
  return tuple(out)


def load_problem(built_jaxlib: str, built_api: tuple[int, int], installed_jaxlib: str,
                 installed_api: tuple[int, int] | None) -> str | None:
  """Why a runtime layer compiled against the XLA FFI headers of jaxlib
  `built_jaxlib` (FFI API `built_api`) cannot load in jaxlib `installed_jaxlib`
  (FFI API `installed_api`, None: unknown), or None if it can. It loads in the
  jaxlib whose headers it was compiled against and in newer ones whose XLA FFI
  API has the same major and the same or a newer minor version: XLA takes
  handlers compiled against older headers (FFI API 0.3 in jaxlib 0.12, 0.5),
  while one compiled against newer headers may rely on what an older XLA lacks,
  even at the same API version (jaxlib 0.12.0's record stage is not 0.12.1's)."""
  built = f"jaxlib {built_jaxlib} (XLA FFI API {built_api[0]}.{built_api[1]})"
  if installed_api is None:
    # no headers to read: only the very jaxlib it was compiled against is known to work
    if built_jaxlib == installed_jaxlib:
      return None
    installed = f"jaxlib {installed_jaxlib}, whose XLA FFI API version is unknown"
  else:
    installed = f"jaxlib {installed_jaxlib} (XLA FFI API {installed_api[0]}.{installed_api[1]})"
    if (installed_api[0] == built_api[0] and installed_api[1] >= built_api[1] and
        jaxlib_release(installed_jaxlib) >= jaxlib_release(built_jaxlib)):
      return None
  return (f"jaxll's runtime was compiled against {built}, which {installed} cannot load: "
          f"jaxll loads in the jaxlib it was compiled against and in newer ones of the same "
          f"XLA FFI API major version and the same or a newer minor version.\n{REINSTALL_HINT}\n"
          f"(Set JAXLL_SKIP_VERSION_CHECK=1 to load it anyway, at your own risk.)")


def choose_layer(layers, installed_jaxlib: str,
                 installed_api: tuple[int, int] | None) -> tuple[str | None, str | None]:
  """(module, None) for the newest of `layers` ((module, built jaxlib, (major,
  minor)), newest first) that `installed_jaxlib` takes, else (None, why the
  oldest cannot load)."""
  problem = None
  for module, built_jaxlib, built_api in layers:
    problem = load_problem(built_jaxlib, tuple(built_api), installed_jaxlib, installed_api)
    if problem is None:
      return module, None
  return None, problem


_here = os.path.dirname(os.path.abspath(__file__))
_compiled = [f for f in os.listdir(_here) if f.startswith(("_runtime_ffi_", "libjaxll_kernels"))
             and f.endswith((".so", ".pyd", ".dylib"))]

try:
  from jaxll._layers import LAYERS as _built_layers
except ImportError:  # built without a CUDA compiler (CMakeLists.txt)
  _built_layers = ()


def _layer_api(module: str) -> tuple[int, int]:
  major, minor = module.rsplit("_", 2)[-2:]
  return int(major), int(minor)


#: The runtime layers of this build, newest first: (module, the jaxlib whose XLA
#: FFI headers it was compiled against, that FFI API version).
LAYERS = tuple((module, jaxlib_version, _layer_api(module))
               for module, jaxlib_version in _built_layers)

#: Why the kernels are missing (None when they are present).
NO_KERNELS_REASON: str | None = None

ext = None
if LAYERS:
  _module, _problem = choose_layer(LAYERS, jaxlib.__version__, installed_ffi_api())
  if _module is None:
    if not settings.skip_version_check():
      raise ImportError(_problem)
    _module = LAYERS[-1][0]
  try:
    ext = importlib.import_module(f"jaxll.{_module}")
  except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"jaxll's compiled runtime (jaxll.{_module}) could not be loaded: {e}.\n"
        f"{REINSTALL_HINT}") from e
elif _compiled:  # pragma: no cover - depends on the installation
  raise ImportError(f"jaxll's compiled runtime is incomplete (no jaxll._layers beside "
                    f"{', '.join(sorted(_compiled))}).\n{REINSTALL_HINT}")
else:
  # Built without a CUDA compiler (CMakeLists.txt): the package works, every call
  # lowers to XLA's collectives.
  NO_KERNELS_REASON = (
      "jaxll was installed without its CUDA kernels (its build had no usable CUDA compiler, "
      "or JAXLL_CUDA=none); to get them on Linux, build it again from its source with pip's "
      "default build isolation, which fetches NVIDIA's CUDA compiler wheels: pip install "
      "--force-reinstall --no-deps <jaxll source directory> (README.md, \"No kernels?\")")


def kernels_available() -> bool:
  """Whether this jaxll was built with its CUDA kernels (they then serve calls
  on CUDA GPUs that can reach each other; elsewhere XLA's collectives do)."""
  return ext is not None


@dataclasses.dataclass(frozen=True)
class RuntimeInfo:
  """What this install runs with (:func:`jaxll.runtime_info`)."""
  kernels: bool             #: whether jaxll was built with its CUDA kernels
  layer: str | None         #: the runtime layer loaded (a module of jaxll)
  headers_jaxlib: str | None  #: the jaxlib whose XLA FFI headers that layer was compiled against
  record_stage: bool        #: whether each collective call is a kernel node of XLA's command buffers
  layers: tuple             #: every runtime layer of the build: (module, its headers' jaxlib)
  note: str                 #: why there are no kernels, or no record stage, or which jax has it


def runtime_info() -> RuntimeInfo:
  """Which runtime layer this install loaded for the installed jaxlib, and
  whether jaxll's calls take XLA FFI's record stage (``python -c "import jaxll;
  print(jaxll.runtime_info())"``). The record stage needs a layer compiled
  against jaxlib 0.12.1's headers or newer (a pip install with build isolation
  on Python 3.12 and newer has one) and jaxlib 0.12.1 or newer installed."""
  layers = tuple((m, v) for m, v, _ in LAYERS)
  if ext is None:
    return RuntimeInfo(False, None, None, False, layers, NO_KERNELS_REASON or "")
  record = _record_in_use
  if record:
    note = "each collective call is a kernel node of XLA's command buffers"
  elif ext.record_stage:
    note = "JAXLL_RECORD_STAGE=0: XLA captures each call into a child graph"
  elif any(api >= (0, 5) for _, _, api in LAYERS):
    note = (f"jaxlib {jaxlib.__version__} is older than the record layer's headers "
            f"(jaxlib {LAYERS[0][1]}): XLA captures each call into a child graph")
  else:
    note = ("this build has no layer with the record stage (it needs Python 3.12 or newer "
            "and jaxlib 0.12.1's headers): XLA captures each call into a child graph")
  return RuntimeInfo(True, ext.__name__, ext.built_jaxlib_version, record, layers, note)


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


_record_in_use = False  # (JAXLL_RECORD_STAGE is read once, when the targets register)
if ext is not None:
  register_targets(ext)
  _record_in_use = bool(ext.record_stage) and settings.record_stage()
