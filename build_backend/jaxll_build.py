"""jaxll's build backend: scikit-build-core's, asking pip also for what the
kernels' build fetches on its own: NVIDIA's CUDA compiler wheels when the
machine has no CUDA toolkit that serves (cuda_wheels.py), so that a JAX user
with CUDA from pip gets the kernels, and pip itself, with which the build
fetches the XLA FFI headers of the jaxlib releases it compiles against
(xla_ffi_headers.py)."""

from scikit_build_core.build import (  # the PEP 517 hooks it keeps as they are
    build_editable, build_sdist, build_wheel, get_requires_for_build_sdist,
    prepare_metadata_for_build_editable, prepare_metadata_for_build_wheel)
from scikit_build_core import build as _backend

import cuda_wheels

__all__ = ["build_editable", "build_sdist", "build_wheel", "get_requires_for_build_editable",
           "get_requires_for_build_sdist", "get_requires_for_build_wheel",
           "prepare_metadata_for_build_editable", "prepare_metadata_for_build_wheel"]


def _kernel_requirements() -> list[str]:
  if cuda_wheels.source() == "none":
    return []
  return ["pip"] + cuda_wheels.build_requirements()


def get_requires_for_build_wheel(config_settings=None):
  return _backend.get_requires_for_build_wheel(config_settings) + _kernel_requirements()


def get_requires_for_build_editable(config_settings=None):
  return _backend.get_requires_for_build_editable(config_settings) + _kernel_requirements()
