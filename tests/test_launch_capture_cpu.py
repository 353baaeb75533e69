"""The launch capture behind XLA's record stage (ffi/kernels/launch.h) on the
host: tests/native/launch_capture_check.cc with ffi/kernels/launch.cc, built
with nvcc (no GPU needed: nothing is launched)."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="no nvcc")
def test_a_capture_describes_one_launch_and_refuses_the_rest(tmp_path):
  exe = tmp_path / "launch_capture_check"
  build = subprocess.run([NVCC, "-std=c++17", "-I", os.path.join(ROOT, "ffi"),
                          "-I", os.path.join(ROOT, "ffi", "include"),
                          os.path.join(ROOT, "tests", "native", "launch_capture_check.cc"),
                          os.path.join(ROOT, "ffi", "kernels", "launch.cc"),
                          "-o", str(exe)], capture_output=True, text=True, timeout=600)
  assert build.returncode == 0, build.stderr[-3000:]
  run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
  assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
