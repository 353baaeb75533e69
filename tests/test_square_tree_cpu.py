"""The fused kernel's one order of a row's squares (ffi/kernels/square_tree.cuh)
on the host: tests/native/square_tree_check.cc, built with the system's C++
compiler, computes random rows on many cuts the way the kernels do and must
find the tree's bits on every one, while a float sum in the cut's order must
differ for some rows (so the check can fail)."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CXX = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_every_cut_gives_the_tree_bits(tmp_path):
  exe = tmp_path / "square_tree_check"
  build = subprocess.run([CXX, "-std=c++17", "-O2", "-ffp-contract=off", "-I",
                          os.path.join(ROOT, "ffi"),
                          os.path.join(ROOT, "tests", "native", "square_tree_check.cc"),
                          "-o", str(exe)], capture_output=True, text=True)
  assert build.returncode == 0, build.stderr[-3000:]
  run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
  out = run.stdout.strip().splitlines()
  assert run.returncode == 0 and out and out[-1].startswith("mismatches=0 "), run.stdout + run.stderr
