"""The workload examples (examples/tp_decode.py, examples/cg_solver.py,
examples/fsdp_tp_train.py) run as a user runs them, on 8 CPU devices and in 2
jax.distributed processes: psum and jaxll give the same tokens, the same
residual history and the same losses (both lower to XLA's collectives on CPU),
and the reports say what ran where; the quickstart runs and passes its own
checks."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(tmp_path, script, *args, env=None):
  out = tmp_path / "report.json"
  r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args,
                      "--json", str(out)], capture_output=True, text=True, cwd=str(tmp_path),
                     timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu", **(env or {})))
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  return json.loads(out.read_text()), r.stdout


@pytest.mark.parametrize("processes", [0, 2])
def test_tp_decode_psum_and_jaxll_agree(tmp_path, processes):
  report, stdout = _run(tmp_path, "tp_decode.py", "--tokens", "8", "--prompt", "4",
                        "--context", "16", "--baseline",
                        *(["--processes", str(processes)] if processes else []))
  ranks = processes or 8
  assert report["ran_on"].startswith(f"{ranks} CPU devices"), report["ran_on"]
  assert set(report["runs"]) == {"psum", "jaxll", "none"} and not report["skipped"]
  assert all(0 <= report["runs"][k]["all_reduce_share"] < 1 for k in ("psum", "jaxll"))
  assert report["same_tokens"] is True
  jaxll_run = report["runs"]["jaxll"]
  assert jaxll_run["paths"] == ["xla"] and jaxll_run["call_sites"] == 2  # 2 per layer (scan)
  assert all(r["itl_ms_median"] > 0 and r["tokens_per_s"] > 0 for r in report["runs"].values())
  assert "same tokens (psum, jaxll): yes" in stdout and "ran on" in stdout
  # both sides ran XLA's all-reduce: the report claims no speedup
  assert "jaxll vs psum: both on XLA's all-reduce here" in stdout
  assert "x)" not in stdout.split("jaxll vs psum")[1].splitlines()[0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tp_decode_fused_variant_gives_the_same_tokens(tmp_path, dtype):
  """--fused: each all-reduce + residual + RMSNorm through jaxll.all_reduce_rmsnorm
  (XLA's path on CPU), the scan carrying the normed residual; same tokens as psum."""
  report, stdout = _run(tmp_path, "tp_decode.py", "--tokens", "8", "--prompt", "4",
                        "--context", "16", "--layers", "3", "--dtype", dtype, "--fused",
                        "--profile")
  assert set(report["runs"]) == {"psum", "jaxll", "jaxll_fused"}
  # --profile traces each run; on CPU the trace has no GPU kernels
  assert all(run["profile"] is None for run in report["runs"].values())
  assert "jaxll_fused profile: no GPU kernels traced" in stdout
  assert report["same_tokens"] is True, report
  fused = report["runs"]["jaxll_fused"]
  assert fused["paths"] == ["composed", "xla"] and fused["call_sites"] == 2  # 2 per layer (scan)
  assert "same tokens (psum, jaxll, jaxll_fused): yes" in stdout


@pytest.mark.parametrize("processes,halo", [(0, "auto"), (0, "allreduce"), (2, "auto")])
def test_cg_solver_psum_and_jaxll_agree(tmp_path, processes, halo):
  report, stdout = _run(tmp_path, "cg_solver.py", "--grid", "64", "--iters", "150", "--tol",
                        "1e-4", "--repeats", "2", "--halo", halo,
                        *(["--processes", str(processes)] if processes else []))
  assert report["ran_on"].startswith(f"{processes or 8} CPU devices"), report["ran_on"]
  assert report["halo"] == ("ppermute" if halo == "auto" else halo)
  assert report["same_history"] is True and report["history_max_rel_diff"] == 0
  for run in report["runs"].values():
    assert run["iters_to_tol"] is not None and run["final_residual"] < 1e-4, run
  assert report["runs"]["jaxll"]["paths"] == ["xla"]
  assert "residual histories identical" in stdout
  assert "jaxll vs psum: both on XLA's all-reduce here" in stdout  # (no speedup claimed)


def test_fsdp_tp_train_routed_and_unrouted_give_the_same_losses(tmp_path):
  """The training step with JAX's collectives and through jaxll.route (XLA's
  collectives both, on CPU); the --check runs are in test_coverage_cpu.py."""
  report, stdout = _run(tmp_path, "fsdp_tp_train.py", "--steps", "3", "--dtype", "bfloat16")
  assert report["ran_on"] == "8 CPU devices" and report["mesh"]["axes"] == ["fsdp", "tp"]
  runs = report["runs"]
  assert set(runs) == {"psum", "jaxll"} and not report["skipped"]
  assert runs["psum"]["losses"] == runs["jaxll"]["losses"]
  assert runs["jaxll"]["paths"] == ["xla"] and runs["jaxll"]["call_sites"] > 0
  assert "same losses (jax.lax, jaxll.route): yes" in stdout
  assert "no speedup to report" in stdout


def test_tp_decode_rejects_a_rank_count_that_does_not_divide_the_heads(tmp_path):
  r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "tp_decode.py"),
                      "--tokens", "2", "--prompt", "1", "--context", "4"],
                     capture_output=True, text=True, cwd=str(tmp_path), timeout=300,
                     env=dict(os.environ, JAX_PLATFORMS="cpu",
                              XLA_FLAGS="--xla_force_host_platform_device_count=3"))
  assert r.returncode != 0 and "must divide heads" in r.stderr + r.stdout


def test_quickstart_runs_and_checks_on_cpu(tmp_path):
  r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "quickstart.py")],
                     capture_output=True, text=True, cwd=str(tmp_path), timeout=600,
                     env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  assert "on 8 virtual CPU devices" in r.stdout and "max vs pmax equal: True" in r.stdout, r.stdout


@pytest.mark.parametrize("processes", [0, 2])
def test_moe_decode_all_to_alls_agree(tmp_path, processes):
  report, stdout = _run(tmp_path, "moe_decode.py", "--dtype", "float32", "--hidden", "64",
                        "--ffn", "64", "--experts", "8", "--layers", "2", "--steps", "3",
                        *(["--processes", str(processes)] if processes else []))
  assert report["ran_on"].startswith(f"{processes or 8} CPU devices"), report["ran_on"]
  assert report["same_output"] is True, report
  assert report["runs"]["jaxll"]["paths"] == ["xla"]  # (CPU: both sides XLA's)
  assert report["runs"]["jaxll"]["call_sites"] == 2  # dispatch and combine (the scan body)
  assert report["bytes_per_peer"] == 8 // (processes or 8) * 4 * 64 * 4
  assert "same output (xla, jaxll): yes" in stdout
