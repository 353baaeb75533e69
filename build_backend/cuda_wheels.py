"""Where jaxll's build gets its CUDA compiler: a system toolkit whose nvcc works,
else NVIDIA's pip wheels of the CUDA 13.0 toolkit.

Used by the build backend (which wheels to ask pip for) and by CMakeLists.txt
(`python cuda_wheels.py choose` prints the choice; `wheels`, the wheels'
toolkit directory, where CMake passes over a system nvcc its test refuses). JAXLL_CUDA picks the
source: `auto` (the default), `system`, `wheels` or `none` (no kernels)."""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

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
OLDEST_NVCC = (12, 4)


def source() -> str:
  value = os.environ.get("JAXLL_CUDA", "auto").strip().lower() or "auto"
  if value not in SOURCES:
    raise SystemExit(f"JAXLL_CUDA={value!r}: expected one of {', '.join(SOURCES)}")
  return value


def system_nvcc() -> str | None:
  """The system toolkit's nvcc where CMake would look: $CUDACXX, the PATH, $CUDA_PATH/bin."""
  if os.environ.get("CUDACXX"):
    return os.environ["CUDACXX"]
  found = shutil.which("nvcc")
  if found is None and os.environ.get("CUDA_PATH"):
    found = shutil.which("nvcc", path=os.path.join(os.environ["CUDA_PATH"], "bin"))
  return found


def nvcc_problem(nvcc: str) -> str | None:
  """Why `nvcc` cannot build jaxll's kernels (None: it can): it must run, be
  12.4 or newer and compile a kernel."""
  try:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=120)
  except (OSError, subprocess.TimeoutExpired) as e:
    return f"it does not run ({e})"
  if out.returncode != 0:
    return f"`nvcc --version` failed: {(out.stderr or out.stdout).strip()[-200:]}"
  m = re.search(r"release (\d+)\.(\d+)", out.stdout)
  if m is None:
    return "`nvcc --version` names no CUDA release"
  if (int(m.group(1)), int(m.group(2))) < OLDEST_NVCC:
    return f"it is CUDA {m.group(1)}.{m.group(2)}; jaxll needs 12.4 or newer"
  with tempfile.TemporaryDirectory() as tmp:
    src = os.path.join(tmp, "probe.cu")
    with open(src, "w") as f:
      f.write("#include <cuda_runtime.h>\n__global__ void probe(int* p) { *p = 1; }\n")
    try:
      out = subprocess.run([nvcc, "-c", src, "-o", os.path.join(tmp, "probe.o")],
                           capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
      return f"it cannot compile a kernel ({e})"
    if out.returncode != 0:
      said = (out.stderr or out.stdout).strip().splitlines()
      return "it cannot compile a kernel: " + " / ".join(said[-2:])
  return None


def wheels_supported() -> bool:
  return sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")


def build_requirements() -> list[str]:
  """The CUDA wheels a build needs besides scikit-build-core's own: where
  JAXLL_CUDA asks for them, or no system nvcc serves."""
  s = source()
  if s == "wheels":
    return list(WHEELS)
  if s == "auto" and wheels_supported():
    nvcc = system_nvcc()
    if nvcc is None:
      return list(WHEELS)
    problem = nvcc_problem(nvcc)
    if problem is not None:
      print(f"jaxll: the nvcc at {nvcc} does not serve ({problem}); asking for NVIDIA's CUDA "
            f"compiler wheels", file=sys.stderr)
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


def choose() -> tuple[str, str, str]:
  """(source, path, note): ("system", nvcc, note), ("wheels", toolkit root,
  note) or ("none", "", why). The note says why a system nvcc was passed over."""
  s = source()
  if s == "none":
    return "none", "", "JAXLL_CUDA=none"
  note = ""
  if s in ("auto", "system"):
    nvcc = system_nvcc()
    problem = nvcc_problem(nvcc) if nvcc else None
    if nvcc and problem is None:
      return "system", nvcc, ""
    if s == "system":
      return "none", "", (f"JAXLL_CUDA=system and the nvcc at {nvcc} does not serve: {problem}"
                          if nvcc else "JAXLL_CUDA=system and no nvcc on the PATH")
    if nvcc:
      note = f"the nvcc at {nvcc} does not serve ({problem})"
  root, missing = wheels_root()
  if root and not missing:
    return "wheels", root, note
  if root:
    # e.g. --no-build-isolation in an environment with jax[cuda13], whose nvcc
    # wheel comes without the headers a build needs
    why = f"NVIDIA's nvcc wheel in {root} lacks what these wheels bring: {' '.join(missing)}"
  elif s == "wheels":
    why = "JAXLL_CUDA=wheels and NVIDIA's nvcc wheels are not installed"
  else:
    why = "no nvcc on the PATH and no NVIDIA nvcc wheels in the build environment"
  return "none", "", f"{note}; {why}" if note else why


if __name__ == "__main__":
  if sys.argv[1:] == ["choose"]:
    # three lines: the source, its path, a note (why a system nvcc was passed over,
    # or why there are no kernels)
    for line in choose():
      print(line)
  elif sys.argv[1:] == ["wheels"]:
    # the wheels' toolkit directory where they have all a build needs, else nothing
    root, missing = wheels_root()
    print(root if root and not missing else "")
  else:
    raise SystemExit("usage: cuda_wheels.py choose|wheels")
