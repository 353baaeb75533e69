"""Where jaxll's build gets its CUDA compiler: a system toolkit when one is on
the PATH, else NVIDIA's pip wheels of the CUDA 13.0 toolkit.

Used by the build backend (which wheels to ask pip for) and by CMakeLists.txt
(`python cuda_wheels.py root` prints the wheels' toolkit directory, if
installed, and the wheels a build would still need). JAXLL_CUDA picks the
source: `auto` (the default), `system`, `wheels` or `none` (no kernels)."""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import sys

# The CUDA 13.0 release line: its cubins and PTX load with driver 580 or newer,
# which is also what jax's CUDA 13 wheels need.
WHEELS = [
    "nvidia-cuda-nvcc~=13.0.0",     # nvcc, ptxas, fatbinary, nvlink
    "nvidia-nvvm~=13.0.0",          # cicc and libdevice
    "nvidia-cuda-crt~=13.0.0",      # nvcc's crt headers
    "nvidia-cuda-runtime~=13.0.0",  # cuda_runtime.h and libcudart_static.a
    "nvidia-cuda-cccl~=13.0.0",     # libcu++ headers that cuda_bf16.h includes
]
SOURCES = ("auto", "system", "wheels", "none")


def source() -> str:
  value = os.environ.get("JAXLL_CUDA", "auto").strip().lower() or "auto"
  if value not in SOURCES:
    raise SystemExit(f"JAXLL_CUDA={value!r}: expected one of {', '.join(SOURCES)}")
  return value


def system_nvcc() -> str | None:
  """The system toolkit's nvcc as CMake finds it: $CUDACXX, else on the PATH."""
  return os.environ.get("CUDACXX") or shutil.which("nvcc")


def wheels_supported() -> bool:
  return sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")


def build_requirements() -> list[str]:
  """The CUDA wheels a build needs besides scikit-build-core's own."""
  s = source()
  if s == "wheels" or (s == "auto" and system_nvcc() is None and wheels_supported()):
    return list(WHEELS)
  return []


# What a build takes from the wheels' toolkit directory, and the wheel with each
NEEDED = {
    "bin/nvcc": "nvidia-cuda-nvcc",
    "nvvm/bin/cicc": "nvidia-nvvm",
    "include/crt/host_config.h": "nvidia-cuda-crt",
    "include/cuda_runtime.h": "nvidia-cuda-runtime",
    "lib/libcudart_static.a": "nvidia-cuda-runtime",
    "include/cccl/cuda/std/version": "nvidia-cuda-cccl",
}


def wheels_root() -> tuple[str | None, list[str]]:
  """The toolkit directory of the installed CUDA wheels (None where there is no
  nvcc wheel), and the wheels it lacks for a build."""
  spec = importlib.util.find_spec("nvidia")
  for base in (spec.submodule_search_locations if spec else None) or []:
    root = os.path.join(base, "cu13")
    if os.path.isfile(os.path.join(root, "bin", "nvcc")):
      missing = sorted({wheel for path, wheel in NEEDED.items()
                        if not os.path.exists(os.path.join(root, path))})
      return root, missing
  return None, []


if __name__ == "__main__":
  if sys.argv[1:] == ["root"]:
    # two lines: the directory (empty: none), and the wheels it lacks
    root, missing = wheels_root()
    print(root or "")
    print(" ".join(missing))
  elif sys.argv[1:] == ["source"]:
    print(source())
  else:
    raise SystemExit("usage: cuda_wheels.py root|source")
