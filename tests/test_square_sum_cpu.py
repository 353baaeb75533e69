"""The fused kernel's exact sum of squares (ffi/kernels/square_sum.cuh) on the
host: tests/native/square_sum_check.cc, built with the system's C++ compiler,
adds random rows in many orders and groupings and must find one set of bits."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CXX = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_any_order_and_grouping_gives_the_same_bits(tmp_path):
  exe = tmp_path / "square_sum_check"
  build = subprocess.run([CXX, "-std=c++17", "-O2", "-I", os.path.join(ROOT, "ffi"),
                          os.path.join(ROOT, "tests", "native", "square_sum_check.cc"),
                          "-o", str(exe)], capture_output=True, text=True)
  assert build.returncode == 0, build.stderr[-3000:]
  run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
  assert run.returncode == 0 and run.stdout.strip() == "mismatches=0", run.stdout + run.stderr
