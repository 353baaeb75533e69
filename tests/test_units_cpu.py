"""CPU tier: pure logic that needs no GPU (choice table, grouping, grid plan,
error words, configuration, version check)."""

import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxll
from jaxll import algorithms, call_sites, choice, native, placement, sites, workspace
from jaxll.native import ext

# tests of the compiled extension (skipped where jaxll was installed without nvcc)
needs_kernels = pytest.mark.skipif(ext is None, reason="jaxll installed without its CUDA kernels")


F32 = np.dtype(np.float32)
BF16 = np.dtype(jnp.bfloat16)

_TABLE = {
    "source": "test",
    "xla_above_bytes": {"default": 1 << 20, "8": 4096},
    "tables": {
        "2": {"float32": [[64, ["oneshot_ll", "twoshot_ll"]],
                          [1 << 20, ["twoshot_ll128_atomic", "oneshot_sentinel", "oneshot_ll"]]]},
        "4": {"bfloat16": [[1 << 30, ["twoshot_sentinel", "twoshot_ll"]]]},
    },
}


@pytest.fixture()
def test_table(monkeypatch):
  monkeypatch.delenv("JAXLL_AUTO_MAX_BYTES", raising=False)
  choice.set_auto_table(_TABLE)
  yield _TABLE
  choice.set_auto_table(None)


def test_auto_choice_follows_the_table(test_table, monkeypatch):
  assert choice.choose_auto(1, 64, F32, "sum")[0] == "xla"
  assert choice.choose_auto(2, 8, F32, "sum")[0] == "oneshot_ll"
  assert choice.choose_auto(2, 64, F32, "max")[0] == "oneshot_ll"
  # the atomic kernel is never chosen automatically; sentinel has no int32 kernel
  assert choice.choose_auto(2, 65, F32, "sum")[0] == "oneshot_sentinel"
  assert choice.choose_auto(2, 65, np.dtype(np.int32), "sum")[0] == "oneshot_ll"
  # N=3 uses the N=2 table; a dtype without a table borrows one of equal width
  assert choice.choose_auto(3, 8, F32, "sum")[0] == "oneshot_ll"
  assert choice.choose_auto(4, 100, np.dtype(np.float16), "min")[0] == "twoshot_sentinel"
  assert choice.choose_auto(4, 100, np.dtype(np.int32), "sum")[0] == "twoshot_ll"
  # crossover to XLA per group size
  name, reason = choice.choose_auto(8, 4097, F32, "sum")
  assert name == "xla" and "crossover 4096" in reason
  assert choice.choose_auto(2, (1 << 20) + 1, F32, "sum")[0] == "xla"
  name, reason = choice.choose_auto(2, 64, np.dtype(np.float64), "sum")
  assert name == "xla" and "float64" in reason
  monkeypatch.setenv("JAXLL_AUTO_MAX_BYTES", "16")
  assert choice.choose_auto(2, 32, F32, "sum")[0] == "xla"
  monkeypatch.setenv("JAXLL_AUTO_MAX_BYTES", "lots")
  with pytest.raises(ValueError, match="JAXLL_AUTO_MAX_BYTES"):
    choice.choose_auto(2, 32, F32, "sum")


def test_auto_table_from_env_and_validation(tmp_path, monkeypatch):
  path = tmp_path / "t.json"
  path.write_text(json.dumps(_TABLE))
  monkeypatch.setenv("JAXLL_AUTO_TABLE", str(path))
  choice.set_auto_table(None)
  try:
    assert choice.auto_table()["source"] == "test"
    bad = dict(_TABLE, tables={"2": {"float32": [[64, ["nope"]]]}})
    with pytest.raises(ValueError, match="unknown kernel 'nope'"):
      choice.set_auto_table(bad)
    bad = dict(_TABLE, tables={"2": {"float32": [[64, ["oneshot_ll"]], [8, ["oneshot_ll"]]]}})
    with pytest.raises(ValueError, match="grow"):
      choice.set_auto_table(bad)
    path.write_text("{")
    choice.set_auto_table(None)
    with pytest.raises(ValueError, match="t.json"):
      choice.auto_table()
  finally:
    monkeypatch.delenv("JAXLL_AUTO_TABLE")
    choice.set_auto_table(None)


@needs_kernels
def test_shipped_auto_table_is_valid_and_covers_group_sizes():
  table = choice.load_auto_table(choice.DEFAULT_TABLE_PATH)
  assert table["source"]
  for n in range(2, ext.max_ranks + 1):
    for dt in (F32, BF16, np.dtype(np.float16), np.dtype(np.int32)):
      for nbytes in (8, 4096, 1 << 20, 64 << 20):
        assert choice.ranked_kernels(n, nbytes, dt), (n, dt, nbytes)
        name, _ = choice.choose_auto(n, nbytes, dt, "sum")
        assert name in algorithms.SPECS


@needs_kernels
def test_algorithm_catalogue_matches_the_kernels():
  assert jaxll.ALGORITHMS[0] == "auto"
  assert set(jaxll.ALGORITHMS) == {
      "auto", "xla", "oneshot_ll", "oneshot_sentinel", "twoshot_ll", "twoshot_sentinel",
      "twoshot_ll128_atomic", "oneshot_barrier", "twoshot_barrier"}
  assert algorithms.kernel_limits("oneshot_ll", np.dtype("int8"), "sum")
  assert "op='max'" in algorithms.kernel_limits("twoshot_ll128_atomic", F32, "max")
  assert "int32" in algorithms.kernel_limits("oneshot_sentinel", np.dtype(np.int32), "sum")
  codes = sorted(s.code for s in algorithms.SPECS.values() if s.code)
  assert codes == list(range(1, ext.last_algorithm + 1))
  # what Python promises is exactly what the native kernel table has
  for name, spec in algorithms.SPECS.items():
    if not spec.code:
      continue
    for dt, dcode in algorithms.DTYPE_CODES.items():
      for op, ocode in algorithms.OP_CODES.items():
        promised = dt in spec.dtypes and op in spec.ops
        assert ext.has_kernel(spec.code, dcode, ocode) == promised, (name, dt, op)
  never_auto = {s.name for s in algorithms.SPECS.values() if not s.auto}
  assert never_auto == {"twoshot_ll128_atomic", "oneshot_barrier", "twoshot_barrier"}
  # ... and the gather/scatter kernels: the dtypes jaxll.collective_common offers
  # each algorithm (it keeps them for installs without kernels) are the table's
  from jaxll import collective_common
  for collective in ("all_gather", "psum_scatter"):
    for name in collective_common.KERNEL_ALGORITHMS:
      promised = (collective_common.SENTINEL_DTYPES if name == "oneshot_sentinel"
                  else collective_common.KERNEL_DTYPES)
      for dt, dcode in algorithms.DTYPE_CODES.items():
        assert ext.has_gather_scatter_kernel(algorithms.COLLECTIVE_CODES[collective],
                                             algorithms.SPECS[name].code, dcode) == (
            dt in promised), (collective, name, dt)


def test_reduction_groups_rank_order():
  ids = np.arange(8).reshape(2, 4)
  mesh = types.SimpleNamespace(axis_names=("dp", "tp"), devices=ids)
  assert placement.reduction_groups(mesh, ("tp",)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert placement.reduction_groups(mesh, ("dp",)) == [[0, 4], [1, 5], [2, 6], [3, 7]]
  assert placement.reduction_groups(mesh, ("dp", "tp")) == [list(range(8))]
  assert placement.reduction_groups(mesh, ("tp", "dp")) == [[0, 4, 1, 5, 2, 6, 3, 7]]


def _unit_elems(name, elem_bytes):
  if name == "twoshot_ll128_atomic":
    return 128 // elem_bytes - 1  # a line minus its counter
  return (8 if name.endswith("_ll") else 16) // elem_bytes


@needs_kernels
@pytest.mark.parametrize("name", algorithms.KERNELS)
def test_launch_plan_invariants(name):
  code = algorithms.SPECS[name].code
  oneshot = name.startswith("oneshot")
  unit_bytes = 128 if name == "twoshot_ll128_atomic" else (8 if name.endswith("_ll") else 16)
  for elem_bytes in (2, 4):
    for nranks in (1, 2, 3, 8, 16):
      for region, max_blocks in ((128, 1), (4096, 5), (16384, 64), (2048, 33)):
        per_region = region // unit_bytes
        for count in (1, 2, 3, 31, 64, 127, 1000, 4097, 65_539, 1 << 20, (64 << 20) + 3):
          p = ext.plan_all_reduce(code, count, elem_bytes, nranks, region, max_blocks)
          units = -(-count // _unit_elems(name, elem_bytes))
          assert p["units"] == units
          assert 1 <= p["blocks"] <= max_blocks
          # no block without units (an idle block would break double buffering)
          assert (p["blocks"] - 1) * p["span"] < units <= p["blocks"] * p["span"]
          assert p["round_units"] == per_region * (1 if oneshot else nranks)
          if not oneshot:  # each owner's chunk of a round fits one region
            assert -(-min(p["span"], p["round_units"]) // nranks) <= per_region
          assert p["rounds"] == -(-p["span"] // p["round_units"])
          last = units - (p["blocks"] - 1) * p["span"]  # the kernels read rounds from the plan
          assert p["last_rounds"] == -(-last // p["round_units"]) >= 1
          assert p["threads"] % 32 == 0 and 32 <= p["threads"] <= 512
  assert ext.plan_all_reduce(code, 0, 4, 2, 4096, 8)["blocks"] == 0


@needs_kernels
def test_workspace_geometry_areas_do_not_overlap():
  for n, blocks, region in ((1, 1, 8), (2, 7, 1000), (8, 64, 8192), (16, 33, 16384)):
    g = ext.geometry(n, blocks, region)
    r = g["region_bytes"]
    assert r % 128 == 0 and r >= region
    ll_end = g["ll_offset"] + 2 * blocks * 2 * n * 2 * r
    s_end = g["sentinel_offset"] + 2 * blocks * 2 * n * r
    p_end = g["plain_offset"] + 2 * blocks * n * r
    a_end = g["atomic_offset"] + blocks * 2 * r
    assert 4096 + 4 * 64 * 16 <= g["ll_offset"] <= ll_end <= g["sentinel_offset"]
    assert s_end <= g["plain_offset"] and p_end <= g["atomic_offset"] and a_end <= g["total_bytes"]
    assert all(g[k] % 4096 == 0 for k in ("ll_offset", "sentinel_offset", "plain_offset",
                                           "atomic_offset"))


@needs_kernels
def test_error_word_roundtrip():
  word = ext.encode_error(1, 3, 7, 12, 0xDEADBEEF)
  assert word >> 63 == 1
  assert ext.decode_error(word) == (1, 3, 7, 12, 0xDEADBEEF)


def test_call_site_encoding_roundtrip():
  site = call_sites.CallSite(site='f.py:3 (g)', axes="dp,tp", group_size=4, shape="(2, 3)",
                          dtype="float32", nbytes=24, op="sum", requested="auto",
                          algorithm="oneshot_ll", reason='a; b="c" = 5% \\ d', workspace=5)
  back = call_sites.CallSite.decode(site.encode())
  assert back == site and back.reason == 'a; b="c" = 5% \\ d'
  assert ";" not in site.encode().split("reason=")[1].split(";")[0]
  text = f'foo {{mhlo.frontend_attributes = {{jaxll_call = "{site.encode()}"}}}}'
  assert call_sites.call_sites_in(text) == [site]
  # (readable in the lowered text: the printable characters but the escaped ones stay)
  assert "site=f.py:3 (g);" in site.encode() and "reason=a%3B b%3D%22c%22 %3D 5%25 %5C d;" \
      in site.encode(), site.encode()


def test_call_site_encoding_keeps_every_string():
  # any reason and site survive encode/decode exactly: separators, escapes,
  # quotes, control characters, non-ASCII text (and lone surrogates)
  rng = np.random.default_rng(0)
  alphabet = list(';=%"\\\'\n\t\r\x00\x7f ,:<-()') + ["é", "—", "µs", "\U0001F600", "\ud800"]
  alphabet += [chr(c) for c in range(0x20, 0x7f)]
  for _ in range(300):
    reason = "".join(rng.choice(alphabet, size=int(rng.integers(0, 40))))
    site = "".join(rng.choice(alphabet, size=int(rng.integers(0, 12))))
    cs = call_sites.CallSite(site=site, axes="tp", group_size=8, shape="(4,)", dtype="float32",
                             nbytes=16, op="all_gather", requested="auto", algorithm="xla",
                             reason=reason, workspace=0, dimension=1)
    encoded = cs.encode()
    assert all(0x20 <= ord(c) < 0x7f and c not in '"\\' for c in encoded), encoded
    assert call_sites.CallSite.decode(encoded) == cs, (reason, encoded)
    assert call_sites.call_sites_in(f'x {{jaxll_call = "{encoded}"}} y') == [cs]


def test_config_validation_and_update():
  with pytest.raises(ValueError, match="scratch_bytes"):
    workspace.WorkspaceConfig(scratch_bytes=4)
  with pytest.raises(ValueError, match="timeout_ms"):
    workspace.WorkspaceConfig(timeout_ms=0)
  old = jaxll.get_config()
  try:
    new = jaxll.set_config(timeout_ms=1234)
    assert new.timeout_ms == 1234 and new.scratch_bytes == old.scratch_bytes
    assert jaxll.get_config() == new
  finally:
    jaxll.set_config(scratch_bytes=old.scratch_bytes, timeout_ms=old.timeout_ms)


@needs_kernels
def test_extension_facts():
  assert ext.max_ranks >= 8 and ext.max_blocks >= 1
  # the runtime's handlers, and whether XLA may capture each into a command buffer
  assert {name: cb for name, (_, cb, _) in ext.handlers().items()} == {
      "jaxll_all_reduce": True, "jaxll_all_reduce_rmsnorm": True, "jaxll_gather_scatter": True,
      "jaxll_ppermute": True, "jaxll_all_to_all": True, "jaxll_ragged_all_to_all": True,
      "jaxll_join": True, "jaxll_noop": True, "jaxll_check": False,
      "jaxll_device_ordinal": False}
  # the testing tools' own (a module apart: the runtime does not hold them)
  from jaxll.tools import testing
  assert {name: cb for name, (_, cb, _) in testing._tools.handlers().items()} == {
      "jaxll_virtual_all_reduce": False, "jaxll_virtual_all_reduce_graph": True,
      "jaxll_virtual_all_reduce_rmsnorm": False, "jaxll_virtual_all_reduce_rmsnorm_graph": True}
  # a record stage (XLA FFI API 0.5, jaxlib 0.12 and newer) for the six collective targets
  with_record = {name for name, (_, _, rec) in ext.handlers().items() if rec is not None}
  assert with_record == ({"jaxll_all_reduce", "jaxll_all_reduce_rmsnorm", "jaxll_gather_scatter",
                          "jaxll_ppermute", "jaxll_all_to_all", "jaxll_ragged_all_to_all"}
                         if ext.record_stage else set())
  assert ext.record_stage == (tuple(ext.ffi_api_version) >= (0, 5))
  assert all(rec is None for _, _, rec in testing._tools.handlers().values())


@pytest.mark.parametrize("setting, with_record", [(None, True), ("1", True), ("0", False)])
def test_targets_register_their_record_stage_unless_told_not_to(monkeypatch, setting,
                                                                 with_record):
  # a table as a native module gives it: name -> (capsule, command buffer, record or None)
  class Module:
    @staticmethod
    def handlers():
      return {"a": ("execute_a", True, "record_a"), "b": ("execute_b", False, None)}

  if setting is None:
    monkeypatch.delenv("JAXLL_RECORD_STAGE", raising=False)
  else:
    monkeypatch.setenv("JAXLL_RECORD_STAGE", setting)
  seen = {}
  monkeypatch.setattr(jax.ffi, "register_ffi_target",
                      lambda name, fn, platform, **kw: seen.update({name: (fn, platform, kw)}))
  native.register_targets(Module)
  fn_a, platform, traits = seen["a"]
  assert platform == "CUDA" and traits  # (command-buffer compatible)
  assert fn_a == ({"execute": "execute_a", "record": "record_a"} if with_record else "execute_a")
  assert seen["b"] == ("execute_b", "CUDA", {})


def test_no_errors_without_workspaces():
  jaxll.check_errors()  # nothing built on CPU: nothing to report
  assert jaxll.errors() == []


@pytest.mark.parametrize("env, pattern", [
    ({"JAXLL_AUTO_TABLE": "/nonexistent.json"}, "auto table /nonexistent.json"),
    ({"JAXLL_AUTO_MAX_BYTES": "1M"}, "JAXLL_AUTO_MAX_BYTES must be an integer"),
    ({"JAXLL_DISABLE": "maybe"}, "JAXLL_DISABLE must be one of"),
    ({"JAXLL_LOG_PATHS": "2"}, "JAXLL_LOG_PATHS must be one of"),
    ({"JAXLL_RECORD_STAGE": "maybe"}, "JAXLL_RECORD_STAGE must be one of"),
    ({"JAXLL_PDL": "yes"}, "JAXLL_PDL must be 0 or 1"),
    ({"JAXLL_SIGNATURES": "off"}, "JAXLL_SIGNATURES must be 0 or 1"),
    ({"JAXLL_SMEM_CARVEOUT": "max"}, "JAXLL_SMEM_CARVEOUT must be an integer from -1 to 100"),
    ({"JAXLL_SMEM_CARVEOUT": "101"}, "JAXLL_SMEM_CARVEOUT must be an integer from -1 to 100"),
    ({"JAXLL_SMEM_CARVEOUT": " 5"}, "JAXLL_SMEM_CARVEOUT must be an integer from -1 to 100"),
    ({"JAXLL_ON_ERROR": "abort"}, "JAXLL_ON_ERROR must be 'poison' or 'trap'"),
    ({"JAXLL_SETUP_TIMEOUT_MS": "5m"}, "JAXLL_SETUP_TIMEOUT_MS must be an integer of at least 1"),
    ({"JAXLL_SETUP_TIMEOUT_MS": "0"}, "JAXLL_SETUP_TIMEOUT_MS must be an integer of at least 1"),
    ({"JAXLL_SCRATCH_BYTES": "4"}, "JAXLL_SCRATCH_BYTES must be an integer of at least 8"),
    ({"JAXLL_SCRATCH_BYTES": "1M"}, "JAXLL_SCRATCH_BYTES must be an integer of at least 8"),
    ({"JAXLL_TIMEOUT_MS": "-5"}, "JAXLL_TIMEOUT_MS must be an integer of at least 1"),
])
def test_bad_settings_fail_at_import_on_every_platform(env, pattern):
  import os
  import subprocess
  import sys
  r = subprocess.run([sys.executable, "-c", "import jaxll"], capture_output=True, text=True,
                     env=dict(os.environ, JAX_PLATFORMS="cpu", **env), cwd="/", timeout=300)
  assert r.returncode != 0 and pattern in r.stderr, r.stderr[-2000:]


def test_kernel_profile_names_and_collective_share():
  from jaxll.tools import profile as kp
  rms = "void jaxll::(anonymous namespace)::rmsnorm_kernel<__nv_bfloat16>(jaxll::(anonymous namespace)::RmsNormArgs)"
  nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
  assert kp.short_name(rms) == "jaxll::rmsnorm_kernel"
  assert kp.short_name("input_reduce_fusion_43") == "input_reduce_fusion_43"
  assert kp.is_collective(rms) and kp.is_collective(nccl) and kp.is_collective("void " + nccl)
  assert not kp.is_collective("loop_multiply_fusion_3")
  assert kp.split({rms: (2, 10.0), nccl: (1, 4.0), "gemm": (3, 6.0)}) == (14.0, 20.0)


def test_switches_read_0_false_no_off_as_off(monkeypatch):
  from jaxll import settings
  for off in ("0", "false", "No", "OFF", ""):
    monkeypatch.setenv("JAXLL_DISABLE", off)
    assert not settings.disabled()
  for on in ("1", "true", "Yes", "ON"):
    monkeypatch.setenv("JAXLL_DISABLE", on)
    assert settings.disabled()


def test_on_error_mode_reads_the_setting(monkeypatch):
  monkeypatch.delenv("JAXLL_ON_ERROR", raising=False)
  assert jaxll.on_error_mode() == "poison"
  monkeypatch.setenv("JAXLL_ON_ERROR", "trap")
  assert jaxll.on_error_mode() == "trap"
  monkeypatch.setenv("JAXLL_ON_ERROR", "Trap")
  with pytest.raises(ValueError, match="JAXLL_ON_ERROR"):
    jaxll.on_error_mode()


def test_kernels_available_says_how_jaxll_was_built():
  # against what the installed package holds: the kernel library and the runtime
  # layers beside it (built with nvcc), one of which is loaded, whose handler
  # table has the all-reduce's XLA FFI target
  import os
  here = os.path.dirname(jaxll.__file__)
  compiled = sorted(f for f in os.listdir(here) if f.endswith(".so"))
  assert jaxll.kernels_available() == bool(compiled), compiled
  if compiled:
    assert "libjaxll_kernels.so" in compiled
    layers = [m for m, _, _ in native.LAYERS]
    assert layers and all(any(f.startswith(m + ".") for f in compiled) for m in layers)
    assert ext.__name__ in [f"jaxll.{m}" for m in layers]
    assert native.NO_KERNELS_REASON is None and "jaxll_all_reduce" in ext.handlers()
  else:  # installed without nvcc: every call is XLA's, and explain says so on CPU
    assert "without its CUDA kernels" in native.NO_KERNELS_REASON


@needs_kernels
def test_codes_come_from_the_extension_and_name_every_signature():
  # One table of codes (ffi/kernels/all_reduce.h): Python takes its codes from
  # the extension, and the extension's error messages name them alike.
  codes = ext.codes()
  assert {n: s.code for n, s in algorithms.SPECS.items()} == codes["algorithms"]
  assert algorithms.DTYPE_CODES == codes["dtypes"] and algorithms.OP_CODES == codes["ops"]
  # (the fused kernel's refusals: one text per protocol, the one its errors give)
  assert algorithms.RMSNORM_REFUSALS == codes["rmsnorm_refusals"]
  for proto in ("sentinel", "twoshot_ll", "twoshot_sentinel"):
    assert algorithms.RMSNORM_REFUSALS[proto].startswith(f"{proto} needs ")
  for name, spec in algorithms.SPECS.items():
    for dtype, dcode in codes["dtypes"].items():
      for op, ocode in codes["ops"].items():
        text = ext.describe_signature(ext.call_signature(spec.code, dcode, ocode, 1000))
        assert text == (f"all_reduce of 1000 {dtype} elements, op {op}, algorithm {name}"), text
  # the call signature's collectives and the error word's kinds: the same table
  assert algorithms.COLLECTIVE_CODES == codes["collectives"]
  assert algorithms.ERROR_KIND_CODES == codes["error_kinds"]
  for collective, code in codes["collectives"].items():
    sig = (1 << 63) | code << 56 | codes["dtypes"]["float32"] << 44 | (
        codes["algorithms"]["oneshot_ll"] << 40) | 5
    assert ext.describe_signature(sig).startswith(
        {"all_reduce_rmsnorm": "all_reduce_rmsnorm of 0 x 5 float32"}.get(collective,
                                                                        f"{collective} of ")), sig
  for kind, code in codes["error_kinds"].items():
    assert ext.decode_error(ext.encode_error(code, 3, 1, 2, 9))[0] == code, kind


def test_a_named_call_site_belongs_to_its_thread():
  # sites.call_site(...) names the site of the lowerings inside it on its own
  # thread only; another thread lowering meanwhile keeps its own sites
  import threading
  inside, release, seen = threading.Event(), threading.Event(), {}

  def other():
    with sites.call_site("other.py:1 (layer)"):
      seen["other"] = sites.site_of(None)
      inside.set()
      release.wait(10)

  t = threading.Thread(target=other)
  t.start()
  try:
    assert inside.wait(10)
    seen["main"] = sites.site_of(None)  # (no traceback: no frames of its own)
    with sites.call_site("main.py:2 (block)"):
      seen["main named"] = sites.site_of(None)
  finally:
    release.set()
    t.join(10)
  assert seen == {"other": "other.py:1 (layer)", "main": "unknown",
                  "main named": "main.py:2 (block)"}
