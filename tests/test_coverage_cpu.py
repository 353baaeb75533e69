"""The FSDP + tensor-parallel training example and the coverage table on CPU.

examples/fsdp_tp_train.py --check: the step through jaxll.route gives bit for
bit what the same step with JAX's own collectives gives (on CPU every jaxll call
lowers to XLA's collective), on 8 devices and in 2 processes.
benchmarks/coverage.py: every jaxll call site of the routed training step and
of tp_decode's step, with the number of sites derived from the model's layout:
gathers and scatters along dimensions 0, 1 and the last, inside the layer scan
and again in its rematerialized backward.
"""

import ast
import collections
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


def _run(tmp_path, script, *args):
  out = tmp_path / "report.json"
  r = subprocess.run([sys.executable, os.path.join(ROOT, script), *args, "--json", str(out)],
                     capture_output=True, text=True, cwd=str(tmp_path), timeout=600,
                     env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  return json.loads(out.read_text()), r.stdout


def _model(argv, devices):
  """The example's Model (its layout: which weights each role shards)."""
  sys.path.insert(0, EXAMPLES)
  try:
    import fsdp_tp_train
  finally:
    sys.path.remove(EXAMPLES)
  return fsdp_tp_train.Model(fsdp_tp_train.parse(argv), devices)


def expected_sites(model):
  """The jaxll call sites of the routed training step, by op, from the layout
  and the code's structure:
  - every weight sharded over fsdp is all-gathered where it is used: g_layer of
    the layer's weights, g_outer of the others (embedding, final norm, head);
  - with a tp axis, each of a layer's 2 blocks (attention, MLP) gathers its
    normed input along seq and psum_scatters its output (`blocks`); the head
    gathers along seq once and psums its output; autodiff psums over tp the
    gradient of each weight replicated over tp (`replicated_*`);
  - the loss is a pmean over fsdp.
  In the lowered program the scan's body appears twice: the forward scan, and
  the backward scan, which recomputes the layer (jax.checkpoint) and then
  transposes it. The recomputation needs every gather and every block's output
  scatter but the last block's (no derivative needs that value); the transpose
  of a gather is a psum_scatter, of a psum_scatter a gather, of a psum none
  (check_vma)."""
  F, T = model.fsdp, model.tp

  def sharded(spec, axis):
    return axis is not None and axis in tuple(spec)

  layer = list(model.specs["layers"].values())
  outer = [v for k, v in model.specs.items() if k != "layers"]
  g_layer = sum(sharded(s, F) for s in layer)
  g_outer = sum(sharded(s, F) for s in outer)
  blocks = 2 if T else 0
  head = 1 if T else 0
  replicated_layer = sum(not sharded(s, T) for s in layer) if T else 0
  replicated_outer = sum(not sharded(s, T) for s in outer) if T else 0
  gathers = ((g_outer + head) + (g_layer + blocks)      # forward: outside, in the scan
             + (g_layer + blocks) + blocks)              # backward: recomputed, transposes
  scatters = (blocks                                     # forward
              + (g_outer + head)                         # transposes outside the scan
              + max(blocks - 1, 0) + (g_layer + blocks))  # backward: recomputed, transposes
  sums = head + (1 if F else 0) + replicated_outer + replicated_layer
  return {"all_gather": gathers, "psum_scatter": scatters, "sum": sums}


def _dims(sites, op):
  """{dimension} of the op's sites, and whether one is the last of a 3-D or
  higher shape (so not also dimension 0 or 1)."""
  dims, last = set(), False
  for s in sites:
    if s["op"] == op:
      shape = ast.literal_eval(s["shape"])
      dims.add(s["dimension"])
      last |= len(shape) >= 3 and s["dimension"] == len(shape) - 1
  return dims, last


@pytest.mark.parametrize("dtype,optimizer", [("float32", "adamw"), ("bfloat16", "sgd")])
def test_training_step_routed_is_bitwise_the_unrouted_one(tmp_path, dtype, optimizer):
  report, stdout = _run(tmp_path, "examples/fsdp_tp_train.py", "--check", "--steps", "3",
                        "--dtype", dtype, "--optimizer", optimizer)
  assert report["ran_on"] == "8 CPU devices"
  assert report["mesh"] == {"fsdp": 4, "tp": 2, "axes": ["fsdp", "tp"]}
  check = report["check"]
  assert check["passed"] and not check["differing_leaves"] and check["same_losses"], check
  # loss, then parameters and gradients (10 leaves each), and AdamW's count and moments
  assert check["leaves"] == 1 + 2 * 10 + (21 if optimizer == "adamw" else 0)
  losses = report["runs"]["jaxll"]["losses"]
  assert len(losses) == 3 and losses[-1] < losses[0], losses
  assert report["runs"]["jaxll"]["paths"] == ["xla"]
  assert "check: routed and unrouted steps bitwise equal" in stdout
  assert "no speedup to report" in stdout


def test_training_step_in_two_processes(tmp_path):
  """2 processes of one CPU device each: a one-axis mesh, FSDP alone."""
  report, stdout = _run(tmp_path, "examples/fsdp_tp_train.py", "--check", "--steps", "2",
                        "--processes", "2")
  assert report["ran_on"] == "2 CPU devices, 2 processes"
  assert report["mesh"] == {"fsdp": 2, "tp": 1, "axes": ["fsdp"]}
  assert report["check"]["passed"], report["check"]
  assert "bitwise equal" in stdout


def test_check_exits_nonzero_on_a_difference(tmp_path):
  """--check's exit status: a step whose routed run differs (here: a different
  learning rate for it) fails."""
  script = tmp_path / "differ.py"
  script.write_text(
      "import sys\n"
      f"sys.path.insert(0, {EXAMPLES!r})\n"
      "import fsdp_tp_train as ft\n"
      "make_step = ft.Model.make_step\n"
      "def skewed(self, routed, check=False):\n"
      "  if routed:\n"
      "    self.opts.lr *= 2\n"
      "  return make_step(self, routed, check)\n"
      "ft.Model.make_step = skewed\n"
      "ft.main(['--check', '--steps', '2'])\n")
  r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                     cwd=str(tmp_path), timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
  assert "check FAILED" in r.stdout and "['layers']['w1']" in r.stdout, r.stdout


def test_coverage_of_the_training_step(tmp_path, cpu_devices):
  report, stdout = _run(tmp_path, "benchmarks/coverage.py", "--program", "train")
  sites = report["sites"]
  want = expected_sites(_model([], cpu_devices))
  assert report["summary"]["by_op"] == want and sum(want.values()) == len(sites)
  assert report["summary"] == {"sites": len(sites), "on_kernel": 0, "by_op": want,
                               "by_path": {"xla": len(sites)}}
  assert all(s["algorithm"] == "xla" and s["reason"].startswith("lowering for cpu")
             for s in sites)
  for op in ("all_gather", "psum_scatter"):
    dims, last = _dims(sites, op)
    assert {0, 1} <= dims and last, (op, dims)
  # every gather of a layer weight is in the layer's scan twice: the forward and
  # the backward's rematerialization (without jax.checkpoint the backward would
  # keep the gathered weights instead)
  in_layer = [s for s in sites if "(Model.layer)" in s["site"]]
  fsdp_gathers = collections.Counter((s["site"], s["dimension"], s["shape"]) for s in in_layer
                                     if s["op"] == "all_gather" and s["axes"] == "fsdp")
  assert len(fsdp_gathers) == 6 and set(fsdp_gathers.values()) == {2}, fsdp_gathers
  assert {s["dimension"] for s in in_layer if s["op"] == "psum_scatter"} == {0, 1, 2}
  assert {(s["axes"], s["group_size"]) for s in sites} == {("fsdp", 4), ("tp", 2)}
  assert stdout.splitlines()[-1] == (
      f"{len(sites)} call sites (all_gather {want['all_gather']}, psum_scatter "
      f"{want['psum_scatter']}, sum {want['sum']}); 0 on a kernel, {len(sites)} xla")
  assert "fsdp_tp_train.py:" in stdout and "<- :" in stdout  # sites named by line and caller


@pytest.mark.parametrize("mesh", [["--tp", "1"], ["--fsdp", "1", "--tp", "8"]])
def test_coverage_of_one_axis_meshes(tmp_path, cpu_devices, mesh):
  report, _ = _run(tmp_path, "benchmarks/coverage.py", "--program", "train", *mesh)
  assert report["summary"]["by_op"] == expected_sites(_model(mesh, cpu_devices))
  assert len({s["axes"] for s in report["sites"]}) == 1


def test_coverage_in_two_processes_and_require_kernels(tmp_path, cpu_devices):
  """Under the launcher every process lowers the step; process 0's table is
  printed. --require-kernels fails where XLA serves the sites (CPU)."""
  report, stdout = _run(tmp_path, "benchmarks/coverage.py", "--program", "train",
                        "--processes", "2")
  assert report["ran_on"] == "2 CPU devices, 2 processes"
  assert report["summary"]["by_op"] == expected_sites(_model([], cpu_devices[:2]))
  for op in ("all_gather", "psum_scatter"):
    dims, last = _dims(report["sites"], op)
    assert {0, 1} <= dims and last, (op, dims)
  r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "coverage.py"),
                      "--program", "tp_decode", "--require-kernels"], capture_output=True,
                     text=True, cwd=str(tmp_path), timeout=600,
                     env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert r.returncode == 1 and "2 call sites are not on a kernel" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("fused", [False, True])
def test_coverage_of_tp_decode(tmp_path, fused):
  """tp_decode's layer reduces twice (attention and MLP outputs), in its scan:
  2 sites; with --fused each is a fused call, listed with its all-reduce."""
  report, stdout = _run(tmp_path, "benchmarks/coverage.py", "--program", "tp_decode",
                        *(["--fused"] if fused else []))
  sites = report["sites"]
  assert report["summary"]["by_op"] == ({"sum": 2, "sum+rmsnorm": 2} if fused else {"sum": 2})
  assert all(s["axes"] == "tp" and s["group_size"] == 8 and s["dimension"] == -1
             for s in sites)
  assert all(s["site"].startswith("tp_decode.py:") for s in sites), [s["site"] for s in sites]
  assert report["summary"]["on_kernel"] == 0
  assert "tp_decode step with jaxll." in stdout
