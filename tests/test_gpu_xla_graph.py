"""GPU tier: what XLA's CUDA graph holds around a jaxll call in a jitted chain
(benchmarks/xla_graph.py, its CUPTI probe built with nvcc). Where the runtime
has XLA FFI's record stage (built against jaxlib 0.12's headers or newer) the
all-reduce is a kernel node, joined to XLA's kernels by programmatic edges with
--xla_gpu_enable_pdl=true; with JAXLL_RECORD_STAGE=0, or a build without the
stage, it is a kernel inside a child graph, joined by plain edges."""

import os
import re
import shutil
import subprocess
import sys

import pytest

import jaxll
from jaxll import native

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "xla_graph.py")
JAXLL_KERNEL = "KERNEL _ZN5jaxll"  # (jaxll's kernels, by their mangled names' start)


def chain_graph(tmp_path, record: bool) -> str:
  """The top level of the graph XLA instantiates for the all-reduce chain."""
  out = tmp_path / f"graphs_{int(record)}.txt"
  env = dict(os.environ, XLA_FLAGS="--xla_gpu_enable_pdl=true",
             JAXLL_RECORD_STAGE="1" if record else "0")
  r = subprocess.run([sys.executable, SCRIPT, "--out", str(out), "--steps", "3"],
                     capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
  assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
  text = out.read_text()
  assert "# chain all_reduce" in text, text
  section = text.split("# chain all_reduce", 1)[1]
  return "\n".join(line for line in section.splitlines()
                   if line.startswith("  ") and not line.startswith("    "))


@pytest.mark.parametrize("record", [True, False])
def test_where_xla_puts_the_all_reduce(tmp_path, record):
  from conftest import HAS_GPU
  if not HAS_GPU or shutil.which("nvcc") is None or not jaxll.kernels_available():
    pytest.skip("needs a GPU, nvcc and jaxll's kernels")
  if record and not native.ext.record_stage:
    pytest.skip("this runtime was built without XLA FFI's record stage (jaxlib 0.12 headers)")
  top = chain_graph(tmp_path, record)
  # (each distinct edge once, with its count: 3 steps make 5 edges, call -> multiply -> call ...)
  edges = {line: int(re.match(r"  edge x(\d+):", line).group(1))
           for line in top.splitlines() if line.startswith("  edge")}
  assert sum(edges.values()) == 5, top
  if record:
    # three kernel nodes of jaxll's beside XLA's multiplies, no child graph, and every
    # edge (each joins a jaxll kernel and a multiply) programmatic
    assert re.search(r"node x3: " + JAXLL_KERNEL, top) and "GRAPH" not in top, top
    assert all(JAXLL_KERNEL in e and "[programmatic" in e for e in edges), top
  else:
    # each call a child graph; plain edges only
    assert re.search(r"node x3: GRAPH", top) and JAXLL_KERNEL not in top, top
    assert all("[default]" in e for e in edges), top
