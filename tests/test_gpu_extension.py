"""GPU tier of the example extension (examples/custom_collective): built
against the installed jaxll, its kernel run on 1, 2, 3, 4 and 8 virtual ranks
and in 2 and 4 processes sharing the GPU, interleaved with jaxll all-reduces."""

import os
import re
import shutil
import subprocess
import sys

import pytest

import jaxll

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "custom_collective")


def test_example_broadcast_kernel_in_processes(tmp_path):
  from conftest import HAS_GPU
  if not HAS_GPU or shutil.which("nvcc") is None or not jaxll.kernels_available():
    pytest.skip("needs a GPU, nvcc and jaxll's kernels")
  site = tmp_path / "site"
  r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
                      "--no-deps", "--target", str(site), EXAMPLE],
                     capture_output=True, text=True, timeout=1800, cwd=tmp_path)
  assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site)] + sys.path))
  r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                      "-rs", os.path.join(EXAMPLE, "tests")],
                     capture_output=True, text=True, timeout=1200, env=env, cwd=tmp_path)
  print(r.stdout[-3000:])
  assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
  assert re.search(r"(?<!\d)7 passed", r.stdout), r.stdout[-2000:]  # (every GPU test ran: none skipped)
