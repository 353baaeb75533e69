"""Test configuration shared by the CPU and GPU tiers.

- 8 virtual CPU devices (``--xla_force_host_platform_device_count=8``) for the
  CPU tier; tests that need them ask for ``jax.devices("cpu")`` explicitly, so
  they also run on a GPU machine.
- Tests marked ``gpu`` are skipped, with the reason, when JAX sees no CUDA GPU.
- Tests import the *installed* jaxll: the source tree's ``jaxll/`` has no
  compiled extension, so the repository root is taken off ``sys.path``.
"""

import os
import sys

_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
# Virtual ranks run one CUDA stream per rank; give them hardware queues of their own.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _root]

import jax  # noqa: E402
import pytest  # noqa: E402

try:
  import jaxll  # noqa: E402,F401
except ImportError as e:
  raise ImportError(
      f"{e}\nThe tests run against the installed jaxll: "
      "pip install -v . (see README)") from e


def _cuda_devices():
  try:
    return jax.devices("cuda")
  except RuntimeError:
    return []


HAS_GPU = bool(_cuda_devices())


def pytest_collection_modifyitems(config, items):
  if HAS_GPU:
    return
  skip = pytest.mark.skip(reason="needs an NVIDIA GPU visible to JAX's CUDA backend")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)


@pytest.fixture(scope="session")
def cpu_devices():
  devs = jax.devices("cpu")
  if len(devs) < 8:
    pytest.skip("needs 8 CPU devices (XLA_FLAGS was set before jax initialised?)")
  return devs[:8]


@pytest.fixture(scope="module")
def mesh1(cpu_devices):
  """The 8 CPU devices as one axis, "tp"."""
  return jax.make_mesh((8,), ("tp",), devices=cpu_devices)


@pytest.fixture(scope="module")
def mesh2(cpu_devices):
  """The 8 CPU devices as ("dp", "tp") = (2, 4)."""
  return jax.make_mesh((2, 4), ("dp", "tp"), devices=cpu_devices)


@pytest.fixture(scope="module")
def mps():
  """One CUDA MPS daemon for every multi-process run of a test module, where MPS
  exists (False elsewhere)."""
  from jaxll.tools import launch
  if not launch.mps_available():
    yield False
    return
  daemon = launch.MpsDaemon()
  yield daemon
  daemon.stop()
