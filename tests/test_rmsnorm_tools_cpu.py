"""The fused call's tools on CPU: benchmarks/fused_rmsnorm.py end to end
(dry runs, its virtual-rank rows with the GPU calls stood in for) and the
operand checks of jaxll.tools.testing's virtual fused call."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp


def test_fused_benchmark_dry_run_on_cpu(tmp_path):
  """benchmarks/fused_rmsnorm.py --cpu: the harness (2 processes, both variants,
  the decode-like chain, the profile path) runs end to end; on CPU both
  variants are XLA's and the profile finds no GPU kernels."""
  import json
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = tmp_path / "fused.json"
  r = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "fused_rmsnorm.py"), "--cpu",
                      "--processes", "2", "--chain", "2", "--runs", "1", "--reps", "2", "--profile",
                      "--json", str(out)], capture_output=True, text=True, cwd=str(tmp_path),
                     timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  rows = json.loads(out.read_text())["rows"]
  assert [(row["tokens"], row["hidden"]) for row in rows] == [
      (1, 4096), (8, 4096), (1, 8192), (8, 8192), (32, 8192)]
  for row in rows:
    assert row["ranks"] >= 2  # (each process may hold several CPU devices)
    assert row["composed_paths"] == ["xla"] and row["fused_paths"] == ["composed", "xla"]
    assert row["composed_us"] > 0 and row["fused_us"] > 0
    assert row["composed_kernels"] == {} and row["fused_kernels"] == {}
    # (the chains take turns rep by rep; paired: the median of the reps' ratios)
    assert len(row["composed_reps_us"]) == len(row["fused_reps_us"]) == 2
    ratios = [c / f for c, f in zip(row["composed_reps_us"], row["fused_reps_us"])]
    assert row["fused_paired_speedup"] == pytest.approx(sum(ratios) / 2)
    assert row["fused_speedup"] == pytest.approx(row["composed_us"] / row["fused_us"])
    # (the host's share: until the calls returned, before the sync)
    assert 0 < row["fused_dispatch_us"] <= row["fused_us"] and row["donate"] is False


def test_fused_benchmark_donate_dry_run_on_cpu(tmp_path):
  """--donate: the chains take x and the residual donated, every rep (and the
  warm-up call) given copies, so reps after the first still run."""
  import json
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = tmp_path / "fused.json"
  r = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "fused_rmsnorm.py"), "--cpu",
                      "--processes", "2", "--chain", "2", "--runs", "2", "--reps", "3", "--donate",
                      "--shapes", "2x256", "--json", str(out)], capture_output=True, text=True,
                     cwd=str(tmp_path), timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  (row,) = json.loads(out.read_text())["rows"]
  assert row["donate"] is True and (row["tokens"], row["hidden"]) == (2, 256)
  for name in ("composed", "fused"):
    assert len(row[f"{name}_reps_us"]) == 3
    assert 0 < row[f"{name}_dispatch_us"] <= row[f"{name}_us"]


def test_fused_benchmark_shapes_option():
  """--shapes TOKENSxHIDDEN,... (the issue's sweep: 1..128 tokens at 8192)."""
  import argparse
  import importlib.util
  import os
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                      "fused_rmsnorm.py")
  spec = importlib.util.spec_from_file_location("fused_rmsnorm_bench", path)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  assert bench.parse_shapes("1x8192,16X4096,128x8192") == [(1, 8192), (16, 4096), (128, 8192)]
  for bad in ("3y4", "0x8192", "8x", "x"):
    with pytest.raises(argparse.ArgumentTypeError):
      bench.parse_shapes(bad)
  assert bench.parse_fused("fused_ll,fused_sentinel") == ["fused_ll", "fused_sentinel"]
  assert bench.parse_fused("fused_twoshot_sentinel,fused_twoshot_ll") == [
      "fused_twoshot_sentinel", "fused_twoshot_ll"]
  assert bench.PROTOCOLS["fused_twoshot_sentinel"] == "twoshot_sentinel"
  for bad in ("", "fused_ll128", "fused,ll"):
    with pytest.raises(argparse.ArgumentTypeError):
      bench.parse_fused(bad)
  assert bench.parse_launch("streams,one") == ["streams", "one"]
  assert bench.parse_launch("one") == ["one"]
  for bad in ("", "grid", "one,fork"):
    with pytest.raises(argparse.ArgumentTypeError):
      bench.parse_launch(bad)


def test_fused_benchmark_virtual_mode_needs_a_gpu(tmp_path):
  """--virtual runs jaxll's kernels on virtual ranks: without a GPU it says so
  and exits non-zero (no traceback)."""
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  r = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "fused_rmsnorm.py"),
                      "--virtual", "2", "--shapes", "1x128"], capture_output=True, text=True,
                     cwd=str(tmp_path), timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert r.returncode != 0
  assert "needs a CUDA GPU" in r.stderr and "Traceback" not in r.stderr


def test_fused_benchmark_virtual_rows_with_both_launches(monkeypatch, tmp_path):
  """benchmarks/fused_rmsnorm.py --virtual N --launch streams,one --donate, its
  Python end to end on CPU: jaxll.tools.testing's GPU calls and timers replaced by
  stand-ins that record how they were called (the all-reduce as a sum over the
  ranks' rows, the fused call as that sum followed by the norm math). Every
  call and timer of a row takes that row's launch mode, each mode subtracts its
  own graph floor, and the rows reach --json."""
  import argparse
  import importlib.util
  import json
  import os
  from jaxll import rmsnorm as fused
  from jaxll.tools import testing
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                      "fused_rmsnorm.py")
  spec = importlib.util.spec_from_file_location("fused_rmsnorm_bench_virtual", path)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32")
  cpu_devices = jax.devices
  monkeypatch.setattr(jax, "devices", lambda backend=None: cpu_devices("cpu"))
  calls = []
  floors = {False: 1.5, True: 0.5}

  def reduced(x):
    return jnp.broadcast_to(x.astype(jnp.float32).sum(0).astype(x.dtype), x.shape)

  def all_reduce(x, *, algorithm, device, command_buffer, one_launch):
    calls.append(("all_reduce", one_launch, algorithm))
    assert command_buffer
    return reduced(x)

  def fused_rmsnorm(x, r, w, *, eps, device, command_buffer, protocol, one_launch):
    calls.append(("fused", one_launch, protocol))
    return fused.residual_rmsnorm(reduced(x), r, w, eps=eps)

  def fused_time(n, tokens, hidden, *, dtype="bfloat16", iters=200, reps=20, protocol="auto",
                 one_launch=False):
    # (iters=reps=1: protocol_serves' probe of whether the exchange serves)
    calls.append(("probe" if iters == reps == 1 else "fused_time", one_launch, protocol))
    return [7.0, 8.0, 9.0]

  def all_reduce_time(n, nbytes, *, dtype, algorithm, iters, one_launch=False):
    calls.append(("all_reduce_time", one_launch, algorithm))
    return [4.0]

  def floor(n, *, iters, one_launch=False):
    calls.append(("floor", one_launch, n))
    return [floors[one_launch]]

  monkeypatch.setattr(testing, "virtual_all_reduce", all_reduce)
  monkeypatch.setattr(testing, "virtual_fused_rmsnorm", fused_rmsnorm)
  monkeypatch.setattr(testing, "rmsnorm_kernel_time_us", fused_time)
  monkeypatch.setattr(testing, "kernel_time_us", all_reduce_time)
  monkeypatch.setattr(testing, "graph_floor_us", floor)
  out = tmp_path / "v.json"
  opts = argparse.Namespace(virtual=[2], launch=bench.parse_launch("streams,one"),
                            shapes=bench.parse_shapes("2x256"), donate=True, graph_iters=3,
                            no_command_buffer=False, composed="auto",
                            fused=bench.parse_fused("fused,fused_sentinel"), chain=2, runs=2,
                            reps=3, json=str(out))
  rows = bench.virtual_rows(opts)
  assert [r["launch"] for r in rows] == ["streams", "one"]
  for row in rows:
    one = row["launch"] == "one"
    assert row["graph_floor_us"] == floors[one]
    assert row["fused_kernel_us"] == row["fused_sentinel_kernel_us"] == 8.0 - floors[one]
    assert row["all_reduce_kernel_us"] == 4.0 - floors[one]
    for v in ("fused", "fused_sentinel"):
      assert row[f"{v}_new_residual_equal"] and row[f"{v}_normed_max_abs_diff"] == 0.0
      assert len(row[f"{v}_reps_us"]) == 3 and row[f"{v}_speedup"] > 0
    assert row["composed_us"] > 0 and row["xla_norm_us"] > 0
  assert [c for c in calls if c[0] == "floor"] == [("floor", False, 2), ("floor", True, 2)]
  split = calls.index(("floor", True, 2))
  for row_calls, one in ((calls[:split], False), (calls[split:], True)):
    kinds = {c[0] for c in row_calls if c[0] != "probe"}
    assert kinds == {"floor", "all_reduce", "fused", "fused_time", "all_reduce_time"}, kinds
    assert all(c[1] is one for c in row_calls if c[0] != "probe"), row_calls
    assert {c[2] for c in row_calls if c[0] == "fused_time"} == {"auto", "sentinel"}
    assert ("probe", False, "sentinel") in row_calls
  saved = json.loads(out.read_text())
  assert saved["launch"] == ["streams", "one"] and len(saved["rows"]) == 2


def test_virtual_fused_call_checks_its_operands():
  """jaxll.tools.testing.virtual_fused_rmsnorm refuses bad shapes and mixed dtypes
  before it looks for a GPU."""
  from jaxll.tools import testing as jt
  x = np.zeros((2, 3, 8), np.float32)
  with pytest.raises(ValueError, match="residual must have"):
    jt.virtual_fused_rmsnorm(x, x[0], np.zeros(8, np.float32))
  with pytest.raises(ValueError, match="residual must have"):
    jt.virtual_fused_rmsnorm(x, x, np.zeros(4, np.float32))
  with pytest.raises(ValueError, match=r"\(N, \.\.\., hidden\)"):
    jt.virtual_fused_rmsnorm(x[0, 0], x[0, 0], np.zeros(8, np.float32))
  with pytest.raises(TypeError, match="share one of"):
    jt.virtual_fused_rmsnorm(x, x.astype(np.float16), np.zeros(8, np.float32))
  with pytest.raises(TypeError, match="share one of"):
    jt.virtual_fused_rmsnorm(x.astype(np.int32), x.astype(np.int32), np.zeros(8, np.int32))
  for tool, args in ((jt.virtual_fused_rmsnorm, (x, x, np.zeros(8, np.float32))),
                     (jt.virtual_all_reduce_rmsnorm, (x, x[0], np.zeros(8, np.float32))),
                     (jt.rmsnorm_kernel_time_us, (2, 1, 128))):
    with pytest.raises(ValueError, match="protocol must be one of"):
      tool(*args, protocol="ll128")
