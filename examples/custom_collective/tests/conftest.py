import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

# Run from the root of jaxll's repository (`python -m pytest examples/custom_collective/tests`
# puts the current directory first on sys.path), `import jaxll` would find jaxll's source
# tree, which holds no compiled extension: the installed jaxll is the one to test against.
_repo = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, os.pardir))
if os.path.isdir(os.path.join(_repo, "jaxll")) and os.path.isdir(os.path.join(_repo, "ffi")):
  sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _repo]


def pytest_configure(config):
  config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run with -m gpu)")
