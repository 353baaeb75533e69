"""The device API as a public library: headers and CMake config installed with
jaxll, compilable on their own, and the example extension
(examples/custom_collective) built against the installed jaxll, then its CPU
tests run (XLA's path, and its CUDA lowering chained with jaxll's calls)."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

import jaxll

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "custom_collective")
NVCC = shutil.which("nvcc")
# what building the example without build isolation takes besides nvcc
BUILD_TOOLS = [m for m in ("scikit_build_core", "nanobind")
               if importlib.util.find_spec(m) is None]
if shutil.which("cmake") is None and importlib.util.find_spec("cmake") is None:
  BUILD_TOOLS.append("cmake")


def test_headers_and_cmake_config_are_installed():
  inc = jaxll.get_include()
  for name in ("jaxll.cuh", "extension.h", "rank_view.h", "rank_view.cuh", "ll_packet.cuh",
               "spin_wait.cuh", "workspace_layout.h", "channel.cuh", "units.cuh", "protocol.h",
               "round.cuh", "ll128_atomic.cuh", "sentinel.cuh", "memory_ops.cuh"):
    assert os.path.isfile(os.path.join(inc, "jaxll", name)), name
  assert os.path.isfile(os.path.join(jaxll.get_cmake_dir(), "jaxllConfig.cmake"))
  # the version file find_package(jaxll 0.1 CONFIG) reads: the wheel's version
  import re
  version = re.search(r'^version = "([^"]+)"', open(os.path.join(ROOT, "pyproject.toml")).read(),
                      re.M).group(1)
  text = open(os.path.join(jaxll.get_cmake_dir(), "jaxllConfigVersion.cmake")).read()
  assert f'set(PACKAGE_VERSION "{version}")' in text, text[:500]


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_device_api_compiles_from_the_installed_headers_alone(tmp_path):
  # the device API includes nothing outside itself (and CUDA's own headers)
  src = tmp_path / "use.cu"
  src.write_text(
      '#include <jaxll/jaxll.cuh>\n#include <jaxll/extension.h>\n'
      "struct Args { jaxll::RankView view; uint64_t signature; };\n"
      "__global__ void k(jaxll::RankView v, Args a, float* y) {\n"
      "  const jaxll::BlockStart bs = jaxll::block_begin(v, 1);\n"
      "  jaxll::send_signature(a, jaxll::signature_lane(v.nranks), v.nranks, bs);\n"
      "  bool ok = jaxll::signature_ok(a, jaxll::signature_lane(v.nranks), v.nranks, bs);\n"
      "  jaxll::ll_round_begin(v, bs.epoch, bs.epoch & 1);\n"
      "  const jaxll::LL128Lines<float> lines(v, blockIdx.x, v.nranks);\n"
      "  char* line = lines.line(v.rank, bs.epoch & 1, 0);\n"
      "  lines.add(line, threadIdx.x & 7, jaxll::LL128Slice<float>::load(y, 0, threadIdx.x & 7, 31));\n"
      "  lines.arrive(line);\n"
      "  if (lines.complete(lines.counter(line))) { uint4 q; lines.take(line, threadIdx.x & 7, &q); }\n"
      "  uint64_t lo, hi;\n"
      "  if (jaxll::sentinel_slot_probe<float>(line, &lo, &hi)) jaxll::sentinel_slot_release(line);\n"
      "  jaxll::st_relaxed_16(line, jaxll::sentinel_canonicalize_16<float>(jaxll::ld_relaxed_16(line)));\n"
      "  if (jaxll::round_boundary(ok) || jaxll::block_failed(ok)) return;\n"
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
@pytest.mark.skipif(bool(BUILD_TOOLS), reason=f"building the example needs "
                    f"{', '.join(BUILD_TOOLS)}: pip install scikit-build-core nanobind cmake ninja")
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


_LOADERS = []  # (ctypes callbacks handed to jaxll must outlive the test)


@pytest.mark.skipif(not jaxll.kernels_available(), reason="jaxll built without its kernels")
def test_extension_api_capsule():
  # the table an extension reads (jaxll/extension.h), called through ctypes as
  # a C extension would: its layout, the version, and the calls' error contract
  import ctypes
  capsule = jaxll.extension.api()
  assert type(capsule).__name__ == "PyCapsule" and "jaxll.extension_api" in repr(capsule)
  get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
  get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
  view_fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p,
                             ctypes.c_char_p, ctypes.c_size_t)
  view_of_fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_int,
                                ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)
  loader_fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                               ctypes.c_size_t)
  register_fn = ctypes.CFUNCTYPE(ctypes.c_int, loader_fn, ctypes.c_char_p, ctypes.c_size_t)

  class Table(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("rank_view_bytes", ctypes.c_uint32),
                ("get_rank_view", view_fn), ("get_rank_view_of", view_of_fn),
                ("register_loader", register_fn)]

  table = Table.from_address(get_pointer(capsule, b"jaxll.extension_api"))
  assert table.version == 7 and table.rank_view_bytes > 0
  error = ctypes.create_string_buffer(512)
  view = ctypes.create_string_buffer(table.rank_view_bytes)
  assert table.get_rank_view(10 ** 6, 0, view, error, 512) == 1  # kExtensionNoWorkspace
  assert b"workspace 1000000 does not exist" in error.value
  assert table.get_rank_view_of(10 ** 6, 0, 0, view, error, 512) == 1
  assert table.register_loader(loader_fn(), error, 512) == 4  # kExtensionBadArgument
  assert b"takes a loader function" in error.value
  # a loader is run at once on the devices of the workspaces built so far (none
  # here without a GPU) and kept for later builds; this one only counts its runs
  calls = []
  _LOADERS.append(loader_fn(lambda ordinal, carveout, err, n: calls.append(ordinal) or 0))
  built = jaxll.native.ext.workspace_ids()
  assert table.register_loader(_LOADERS[-1], error, 512) == 0
  assert bool(calls) == bool(built), (calls, built)


def _sources(folder, *suffixes):
  root = os.path.join(ROOT, "ffi", folder)
  return {name: open(os.path.join(root, name)).read() for name in sorted(os.listdir(root))
          if name.endswith(suffixes)}


def test_layering_rules_hold_in_the_sources():
  """ffi/include/jaxll/README.md's layering, checked on the sources: (1) the
  device API includes only itself and system headers; (2) the kernels order and
  poll scratch only through it (no global-memory ordering PTX or relaxed/acquire
  helpers of their own; the fused kernel's cluster-shared-memory asm is its own);
  (3) the runtime includes no test tool, and the test tools reach the runtime
  only through the extension API and two header-only helpers."""
  import re
  api = _sources(os.path.join("include", "jaxll"), ".h", ".cuh")
  assert api
  for name, text in api.items():
    for inc in re.findall(r'#include\s+"([^"]+)"', text):
      assert inc.startswith("jaxll/") and os.path.basename(inc) in api, (name, inc)
  kernels = _sources("kernels", ".cu", ".cuh", ".h", ".cc")
  assert "all_reduce_twoshot_atomic.cu" in kernels
  own = re.compile(r"\.(sys|gpu)\.global|\bred\.|\b(ld|st)_(relaxed|acquire|release)\w*\s*\("
                   r"[^;{]*\)\s*\{|\bsentinel_(present|canonicalize)\w*\s*\([^;{]*\)\s*\{")
  for name, text in kernels.items():
    found = own.search(text)
    assert not found, (name, found.group(0))
    assert not re.search(r'#include\s+"(runtime|testing)/', text), name
  runtime = _sources("runtime", ".cc", ".h")
  for name, text in runtime.items():
    assert not re.search(r'#include\s+"testing/', text), name
    assert "jaxll_virtual_" not in text, name  # (the testing handlers live in ffi/testing)
  header_only = {"runtime/handler_table.h", "runtime/ffi_support.h"}
  for name in header_only:
    assert os.path.basename(name).replace(".h", ".cc") not in runtime, name
  for name, text in _sources("testing", ".cc", ".cu", ".h").items():
    used = set(re.findall(r'#include\s+"(runtime/[^"]+)"', text))
    assert used <= header_only, (name, used - header_only)
