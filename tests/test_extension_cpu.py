"""The device API as a public library: headers and CMake config installed with
jaxll, compilable on their own, and the example extension
(examples/custom_collective) built against the installed jaxll, then its CPU
tests run (XLA's path, and its CUDA lowering chained with jaxll's calls)."""

import os
import shutil
import subprocess
import sys

import pytest

import jaxll

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "custom_collective")
NVCC = shutil.which("nvcc")


def test_headers_and_cmake_config_are_installed():
  inc = jaxll.get_include()
  for name in ("jaxll.cuh", "extension.h", "rank_view.h", "rank_view.cuh", "ll_packet.cuh",
               "spin_wait.cuh", "workspace_layout.h", "channel.cuh", "units.cuh", "protocol.h"):
    assert os.path.isfile(os.path.join(inc, "jaxll", name)), name
  assert os.path.isfile(os.path.join(jaxll.get_cmake_dir(), "jaxllConfig.cmake"))


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_device_api_compiles_from_the_installed_headers_alone(tmp_path):
  # the device API includes nothing outside itself (and CUDA's own headers)
  src = tmp_path / "use.cu"
  src.write_text(
      '#include <jaxll/jaxll.cuh>\n#include <jaxll/extension.h>\n'
      "__global__ void k(jaxll::RankView v) {\n"
      "  const jaxll::BlockStart bs = jaxll::block_begin(v, 1);\n"
      "  const jaxll::WaitContext ctx = jaxll::wait_context(v, bs.epoch);\n"
      "  uint64_t x;\n"
      "  jaxll::ll16_wait(jaxll::ll_region(v, v.rank, 0, blockIdx.x, 0, 0), 1u, ctx, 0u, &x);\n"
      "  jaxll::Channel<jaxll::Proto::kSentinel, float> ch(v, 0, blockIdx.x, 0, bs.epoch);\n"
      "  jaxll::Unit<16> u{}, r;\n"
      "  jaxll::send_to_peers<0>(ch, v.nranks, threadIdx.x, u);\n"
      "  jaxll::reduce_slot<0, jaxll::Proto::kSentinel, float, jaxll::SumOp, 16>(\n"
      "      ch, v.nranks, threadIdx.x, u, &r);\n"
      "}\n")
  r = subprocess.run([NVCC, "-std=c++17", "-arch=sm_90", "-c", str(src), "-o",
                      str(tmp_path / "use.o"), "-I", jaxll.get_include()],
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.skipif(NVCC is None or not jaxll.kernels_available(),
                    reason="needs nvcc and jaxll built with its kernels")
def test_example_extension_builds_against_the_installed_jaxll(tmp_path):
  site = tmp_path / "site"
  env = dict(os.environ, CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90-real")
  r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
                      "--no-deps", "--target", str(site), EXAMPLE],
                     capture_output=True, text=True, timeout=1800, env=env, cwd=tmp_path)
  assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site)] + sys.path))
  r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      os.path.join(EXAMPLE, "tests")],
                     capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
  assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
  assert " passed" in r.stdout


@pytest.mark.skipif(not jaxll.kernels_available(), reason="jaxll built without its kernels")
def test_extension_api_capsule():
  capsule = jaxll.extension.api()
  assert type(capsule).__name__ == "PyCapsule" and "jaxll.extension_api" in repr(capsule)
