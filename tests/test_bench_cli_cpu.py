"""CPU tier: the benchmark's argument handling and output format (no GPU)."""

import argparse
import json
import subprocess
import sys

import pytest

from jaxll.tools.bench import cli, modes, report, timing, units


@pytest.mark.parametrize("text, value", [("8", 8), ("4K", 4096), ("64KiB", 65536),
                                         ("1M", 1 << 20), ("256MB", 256 << 20), ("3000", 3000)])
def test_parse_size(text, value):
  assert units.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "K", "4Q", "-8", "0", "1.5K", "0x10", "1_000"])
def test_parse_size_rejects(text):
  with pytest.raises(argparse.ArgumentTypeError):  # (what argparse reports as a usage error)
    units.parse_size(text)


def test_format_size():
  assert units.format_size(8) == "8 B"
  assert units.format_size(4096) == "4 KiB"
  assert units.format_size(3000) == "3000 B"
  assert units.format_size(256 << 20) == "256 MiB"


def test_defaults_and_quick():
  args = cli.parse_args([])
  assert args.sizes[0] == 8 and args.sizes[-1] == 256 << 20
  assert {12, 3000, 100_000} <= set(args.sizes)
  assert args.algorithms[0] == "auto" and "oneshot_ll" in args.algorithms
  assert args.mode == ["virtual", "local"] and args.ranks == [8]
  quick = cli.parse_args(["--quick"])
  assert quick.sizes == units.QUICK_SIZES and quick.reps <= 5 and quick.chain <= 50
  assert quick.runs <= 5 and args.chain == 200 and args.runs == 20 and args.procs == [2]
  mine = cli.parse_args(["--quick", "--sizes", "1K", "8", "--ranks", "2", "4",
                           "--algorithms", "oneshot_ll", "--mode", "virtual"])
  assert mine.sizes == [8, 1024] and mine.ranks == [2, 4] and mine.algorithms == ["oneshot_ll"]


@pytest.mark.parametrize("argv, message", [
    (["--ranks", "0"], "--ranks must be in 1.."),
    (["--ranks", "99"], "--ranks must be in 1.."),
    (["--reps", "0"], "--reps must be at least 1"),
    (["--dtypes", "float64"], "invalid choice"),
    (["--algorithms", "ring"], "invalid choice"),
    (["--mode", "cloud"], "invalid choice"),
    (["--procs", "1"], "--procs must be in 2.."),
    (["--runs", "0"], "--runs must be at least 1"),
    (["--sizes", "4Q"], "not a size"),
])
def test_bad_arguments_exit_with_message(argv, message, capsys):
  with pytest.raises(SystemExit) as e:
    cli.parse_args(argv)
  assert e.value.code == 2
  assert message in capsys.readouterr().err


def _records():
  return [
      {"mode": "virtual", "ranks": 8, "dtype": "float32", "bytes": 4096, "algorithm": "oneshot_ll",
       "status": "ok", "kernel_us": 2.5, "floor_us": 1.1, "above_floor_us": 1.4},
      {"mode": "virtual", "ranks": 8, "dtype": "float32", "bytes": 4096, "algorithm": "auto",
       "auto_choice": "oneshot_ll", "status": "ok", "kernel_us": 2.6, "floor_us": 1.1,
       "above_floor_us": 1.5},
      {"mode": "virtual", "ranks": 8, "dtype": "float32", "bytes": 1 << 20, "algorithm": "xla",
       "status": "n/a", "reason": "XLA's all-reduce cannot run on virtual ranks"},
      {"mode": "local", "ranks": 2, "dtype": "float32", "bytes": 4096, "algorithm": "oneshot_ll",
       "status": "ok", "jit_us": 3.0, "psum_jit_us": 12.0, "speedup_vs_psum": 4.0},
      {"mode": "processes", "ranks": 8, "dtype": "float32", "bytes": 4096,
       "algorithm": "oneshot_ll", "status": "ok", "jit_us": 9.0, "floor_us": 7.0,
       "above_floor_us": 2.0, "path": "oneshot_ll"},
  ]


_SOL = {"device": "NVIDIA H200", "l2_rtt_us": 0.136, "pingpong_one_way_us": 0.231,
        "sol_us": 0.367, "ffi_call_floor_us": 1.0, "ffi_call_floor_method": "steady state: x",
        "graph_node_floor_us": {"8": 1.1}, "pairs": {}}


def test_table_format():
  text = report.format_table(_records(), _SOL, cli.parse_args([]))
  lines = text.splitlines()
  assert "one __threadfence()) 0.136 us" in lines[0] and "SoL 0.367 us" in lines[0]
  assert "FFI custom-call floor 1.00 us/call (steady state: x)" in lines[1]
  assert "CUDA-graph node floor, 8 virtual ranks: 1.10 us/call" in lines[2]
  assert "steady state: jitted chain of 200 dependent calls, 20 runs back to back per sync, each on the last one" in text
  header = next(l for l in lines if l.startswith("mode"))
  for column in ("kernel us", "per call", "above fl", "x SoL", "psum us", "vs psum"):
    assert column in header
  assert "jit us" not in header  # virtual mode has no jitted column any more
  row = next(l for l in lines if l.startswith("local"))
  assert "4 KiB" in row and "3.00" in row and "12.00" in row and "4.00x" in row
  row = next(l for l in lines if l.startswith("virtual") and "oneshot_ll" in l)
  assert "2.50" in row and "1.40" in row and f"{1.4 / 0.367:.1f}" in row
  row = next(l for l in lines if l.startswith("processes"))
  assert "9.00" in row and "2.00" in row
  assert any("auto -> oneshot_ll" in l for l in lines)
  skipped = [l for l in lines if l.startswith("not measured:")]
  assert skipped == ["not measured: virtual N=8 xla at 1 sizes (1 MiB..1 MiB): "
                     "XLA's all-reduce cannot run on virtual ranks"]


def test_summary_ratio():
  summary = report.summarize(_records(), _SOL)
  ratio = summary["kernel_above_floor_over_sol"]["virtual N=8 float32 4 KiB oneshot_ll"]
  assert ratio == pytest.approx(1.4 / 0.367)
  # the multi-process cost above its floor against the same-size virtual kernel's
  ratio = summary["processes_above_floor_over_virtual"]["processes N=8 float32 4 KiB oneshot_ll"]
  assert ratio == pytest.approx(2.0 / 1.4)


def _sweep():
  out = []
  for nbytes, times in ((8, {"oneshot_ll": 3.0, "twoshot_sentinel": 6.0, "oneshot_barrier": 6.0,
                             "twoshot_barrier": 9.0, "twoshot_ll128_atomic": 1.0}),
                        (64, {"oneshot_ll": 3.5, "twoshot_sentinel": 6.5}),
                        (1 << 20, {"oneshot_ll": 90.0, "twoshot_sentinel": 40.0})):
    for algo, us in times.items():
      out.append({"mode": "virtual", "ranks": 8, "dtype": "float32", "bytes": nbytes,
                  "algorithm": algo, "status": "ok", "kernel_us": us})
    out.append({"mode": "virtual", "ranks": 8, "dtype": "float32", "bytes": nbytes,
                "algorithm": "auto", "auto_choice": "oneshot_ll", "status": "ok",
                "kernel_us": times["oneshot_ll"]})
  return out


def test_pivot_and_barrier_ratio():
  text = report.format_pivot(_sweep())
  lines = text.splitlines()
  assert lines[0] == "kernel us per call, virtual, N=8, float32"
  assert "oneshot_ll" in lines[1] and "twoshot_sentinel" in lines[1] and "auto" not in lines[1].split()[1:-2]
  row = next(l for l in lines if l.strip().startswith("8 B"))
  assert "3.00" in row and "6.00" in row and row.endswith("oneshot_ll")
  summary = report.summarize(_sweep(), None)
  assert summary["oneshot_barrier_over_best_barrier_free"]["virtual N=8 float32 8 B"] == 2.0
  assert summary["twoshot_barrier_over_best_barrier_free"]["virtual N=8 float32 8 B"] == 1.5
  assert "virtual N=8 float32 1 MiB" not in summary["oneshot_barrier_over_best_barrier_free"]


def test_tune_auto_builds_a_valid_table(tmp_path):
  import os
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
  try:
    import tune_auto
  finally:
    sys.path.pop(0)
  from jaxll import choice
  table = tune_auto.build_table(_sweep(), {"default": 1 << 20}, "test sweep")
  rows = table["tables"]["8"]["float32"]
  # atomic and barrier kernels are never candidates; equal rankings merge
  assert rows == [[8192, ["oneshot_ll", "twoshot_sentinel"]],
                  [1 << 62, ["twoshot_sentinel", "oneshot_ll"]]]
  choice.set_auto_table(table)
  try:
    assert choice.choose_auto(8, 100, __import__("numpy").dtype("float32"), "sum")[0] == "oneshot_ll"
    assert choice.choose_auto(8, 1 << 20, __import__("numpy").dtype("float32"), "sum")[0] == "twoshot_sentinel"
  finally:
    choice.set_auto_table(None)


def test_tune_auto_ranks_a_launch_per_rank_from_fixed_cost(tmp_path):
  """fixed_cost.py --launch streams one: the table follows the launch per rank
  (as a host with a GPU per rank runs the kernels), whatever one launch says."""
  import os
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
  try:
    import tune_auto
  finally:
    sys.path.pop(0)

  def row(launch, algorithm, us):
    return {"ranks": 8, "bytes": 4096, "algorithm": algorithm, "pdl": "1", "launch": launch,
            "kernel_us": us, "floor_us": 1.0, "above_floor_us": us - 1.0}

  doc = {"label": "", "config": {}, "jit": [],
         "kernel": [row("streams", "oneshot_ll", 2.0), row("streams", "twoshot_sentinel", 3.0),
                    row("one", "oneshot_ll", 3.0), row("one", "twoshot_sentinel", 2.0)]}
  src = tmp_path / "fc.json"
  src.write_text(json.dumps(doc))
  out = tmp_path / "table.json"
  assert tune_auto.main([str(src), "--out", str(out)]) == 0
  rows = json.loads(out.read_text())["tables"]["8"]["float32"]
  assert rows[0][1][0] == "oneshot_ll"


def test_plot_writes_png(tmp_path):
  pytest.importorskip("matplotlib")
  out = tmp_path / "p.png"
  report.plot(_records(), _SOL, str(out))
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv0, prog", [
    ("/venv/bin/jaxll-bench", "jaxll-bench"),
    ("/src/jaxll/tools/bench/__main__.py", "python -m jaxll.tools.bench")])
def test_help_names_the_command_it_was_started_by(monkeypatch, capsys, argv0, prog):
  monkeypatch.setattr(sys, "argv", [argv0])
  with pytest.raises(SystemExit):
    cli.build_parser().parse_args(["--help"])
  assert capsys.readouterr().out.startswith(f"usage: {prog} ")


def test_cli_without_gpu_says_so(tmp_path):
  from conftest import HAS_GPU
  if HAS_GPU:
    pytest.skip("a GPU is present")
  out = subprocess.run([sys.executable, "-m", "jaxll.tools.bench", "--quick", "--json",
                        str(tmp_path / "x.json")], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
  assert out.returncode == 1  # (it measured nothing)
  assert "measured nothing: JAX sees no CUDA GPU" in out.stderr
  # the report asked for is written, and says why it holds nothing
  report = json.loads((tmp_path / "x.json").read_text())
  assert report["measured"] is False and "no CUDA GPU" in report["reason"]


def test_json_report(tmp_path):
  args = cli.parse_args(["--quick", "--json", str(tmp_path / "r.json")])
  doc = json.loads(json.dumps(report.report({"gpu": "X"}, args, _SOL, _records())))
  assert set(doc) == {"machine", "config", "sol", "summary", "results"}
  assert "json" not in doc["config"] and doc["config"]["sizes"] == units.QUICK_SIZES
  assert doc["results"][0]["kernel_us"] == 2.5
  assert "kernel_above_floor_over_sol" in doc["summary"]


def test_local_mode_meshes_over_the_first_n_devices(cpu_devices):
  # local mode's logic on CPU devices (every call lowers to XLA there)
  args = cli.parse_args(["--mode", "local", "--gpus", "4", "2", "16", "--sizes", "8", "4K",
                           "--algorithms", "xla", "auto", "--chain", "2", "--reps", "1"])
  assert modes.local_gpu_counts(args, 8) == [2, 4]  # 16 are not there
  assert modes.local_gpu_counts(cli.parse_args([]), 8) == [8]
  assert modes.local_gpu_counts(cli.parse_args([]), 1) == []
  seen = []
  records = modes.bench_local(args, seen.append, cpu_devices)
  assert [(r["ranks"], r["bytes"], r["algorithm"]) for r in records] == [
      (n, b, a) for n in (2, 4) for b in (8, 4096) for a in ("xla", "auto")]
  assert len(seen) == len(records)
  for r in records:
    assert r["status"] == "ok" and r["path"] == "xla" and r["jit_us"] > 0
    assert r["psum_jit_us"] > 0 and r["speedup_vs_psum"] == r["psum_jit_us"] / r["jit_us"]


def test_gpus_argument_is_checked(capsys):
  with pytest.raises(SystemExit):
    cli.parse_args(["--gpus", "1"])
  assert "--gpus must be in 2.." in capsys.readouterr().err


def _local_sweep():
  """Local-mode records: jitted per-call us of kernels and XLA on 8 and 2 GPUs."""
  out = []
  table = {8: {8: {"oneshot_ll": 9.0, "twoshot_sentinel": 12.0, "xla": 8.0},
               4096: {"oneshot_ll": 9.5, "twoshot_sentinel": 12.5, "xla": 30.0},
               1 << 20: {"oneshot_ll": 90.0, "twoshot_sentinel": 40.0, "xla": 45.0},
               16 << 20: {"oneshot_ll": 900.0, "twoshot_sentinel": 300.0, "xla": 250.0},
               256 << 20: {"oneshot_ll": 9000.0, "twoshot_sentinel": 4000.0, "xla": 2000.0}},
           2: {8: {"oneshot_ll": 5.0, "xla": 20.0},
               256 << 20: {"oneshot_ll": 1000.0, "xla": 1100.0}}}
  for n, by_size in table.items():
    for nbytes, times in by_size.items():
      for algo, us in times.items():
        out.append({"mode": "local", "ranks": n, "dtype": "float32", "bytes": nbytes,
                    "algorithm": algo, "status": "ok", "jit_us": us, "path": algo})
  return out


def test_tune_auto_from_local_measures_the_crossover(tmp_path):
  import os
  import numpy as np
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
  try:
    import tune_auto
  finally:
    sys.path.pop(0)
  from jaxll import choice
  above, warnings = tune_auto.measured_crossover(_local_sweep(), margin=0.05)
  # N=8: XLA is fastest from 16 MiB on (and at 8 B, which is warned about)
  assert above == {"8": int((1 << 20) * 4), "2": 1 << 62}
  assert len(warnings) == 1 and warnings[0].startswith("N=8 float32 8 B")
  src = tmp_path / "local.json"
  src.write_text(json.dumps({"machine": {"gpu": "X", "gpu_count": 8}, "results": _local_sweep()}))
  out = tmp_path / "table.json"
  code = tune_auto.main([str(src), "--from-local", "--out", str(out)])
  assert code == 0
  table = json.loads(out.read_text())
  assert table["xla_above_bytes"] == {"default": 1 << 20, "8": 4 << 20, "2": 1 << 62}
  assert "crossover to XLA measured for N in [2, 8]" in table["source"]
  choice.set_auto_table(table)
  try:
    f32 = np.dtype("float32")
    assert choice.choose_auto(8, 4096, f32, "sum")[0] == "oneshot_ll"
    assert choice.choose_auto(8, 1 << 20, f32, "sum")[0] == "twoshot_sentinel"
    assert choice.choose_auto(8, 16 << 20, f32, "sum")[0] == "xla"
    assert choice.choose_auto(2, 256 << 20, f32, "sum")[0] == "oneshot_ll"
  finally:
    choice.set_auto_table(None)



def test_collective_argument_and_its_algorithms(capsys):
  args = cli.parse_args(["--collective", "all_gather"])
  from jaxll import gather_scatter
  assert args.algorithms == list(gather_scatter.ALGORITHMS)
  with pytest.raises(SystemExit):
    cli.parse_args(["--collective", "psum_scatter", "--algorithms", "twoshot_ll"])
  assert "--collective psum_scatter takes --algorithms from" in capsys.readouterr().err


@pytest.mark.parametrize("collective", ["all_gather", "psum_scatter"])
def test_local_mode_times_gather_and_scatter_chains(cpu_devices, collective):
  # local mode's chains of the other collectives on CPU devices (XLA's
  # collectives there); the chain step keeps one rank's piece
  args = cli.parse_args(["--mode", "local", "--gpus", "4", "--sizes", "8", "4K",
                           "--collective", collective, "--algorithms", "xla", "auto",
                           "--chain", "2", "--reps", "1"])
  records = modes.bench_local(args, lambda rec: None, cpu_devices)
  assert [(r["bytes"], r["algorithm"]) for r in records] == [
      (b, a) for b in (8, 4096) for a in ("xla", "auto")]
  for r in records:
    assert r["status"] == "ok" and r["collective"] == collective and r["jit_us"] > 0
    assert r["path"] == "xla" and r["speedup_vs_psum"] > 0
  assert "collective: " + collective in report.format_table(records, None, args)


@pytest.mark.parametrize("shape", [(12,), (4, 3)], ids=["1d", "2d"])
def test_chain_steps_keep_the_piece_and_compute_the_collective(cpu_devices, shape):
  # 1-D pieces as local mode makes them, 2-D (1, count) pieces as the
  # processes mode's worker makes them
  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P
  mesh = jax.make_mesh((4,), ("x",), devices=cpu_devices[:4])
  x = jax.device_put(np.arange(4 * 3, dtype=np.float32).reshape(shape),
                     NamedSharding(mesh, P("x")))
  run = lambda c: np.asarray(jax.jit(jax.shard_map(timing.chain_step(c, "auto", 4), mesh=mesh,
                                                   in_specs=P("x"), out_specs=P("x")))(x))
  first = np.arange(3, dtype=np.float32)  # rank 0's piece
  whole = np.arange(12, dtype=np.float32).reshape(4, 3).sum(0)  # every rank's w, summed
  # all-gather keeps rank 0's piece on every rank; the reduce-scatter of n
  # copies of w gives every rank the sum of the pieces, as the all-reduce does
  for c, want in (("all_gather", first), ("psum_scatter", whole), ("all_reduce", whole)):
    got = run(c)
    assert got.shape == shape, c
    np.testing.assert_array_equal(got.reshape(4, 3), np.tile(want, (4, 1)), err_msg=c)
