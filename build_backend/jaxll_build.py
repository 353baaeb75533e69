"""jaxll's build backend: scikit-build-core's, asking pip also for NVIDIA's CUDA
wheels when the machine has no CUDA toolkit (cuda_wheels.py), so that a JAX
user with CUDA from pip gets the kernels."""

from scikit_build_core.build import (  # the PEP 517 hooks it keeps as they are
    build_editable, build_sdist, build_wheel, get_requires_for_build_sdist,
    prepare_metadata_for_build_editable, prepare_metadata_for_build_wheel)
from scikit_build_core import build as _backend

import cuda_wheels

__all__ = ["build_editable", "build_sdist", "build_wheel", "get_requires_for_build_editable",
           "get_requires_for_build_sdist", "get_requires_for_build_wheel",
           "prepare_metadata_for_build_editable", "prepare_metadata_for_build_wheel"]


def get_requires_for_build_wheel(config_settings=None):
  return _backend.get_requires_for_build_wheel(config_settings) + cuda_wheels.build_requirements()


def get_requires_for_build_editable(config_settings=None):
  return (_backend.get_requires_for_build_editable(config_settings) +
          cuda_wheels.build_requirements())
