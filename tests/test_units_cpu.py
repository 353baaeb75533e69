"""CPU tier: pure logic that needs no GPU (choice table, grouping, grid plan,
error words, configuration, version check)."""

import types

import numpy as np
import pytest

import jaxll
from jaxll import _ext, algorithms, call_sites, lowering, workspace
from jaxll._ext import ext


def test_auto_choice_table(monkeypatch):
  monkeypatch.delenv("JAXLL_AUTO_MAX_BYTES", raising=False)
  limit = algorithms.DEFAULT_AUTO_MAX_BYTES
  f32 = np.dtype(np.float32)
  assert algorithms.choose_auto(1, 64, f32, "sum")[0] == "xla"
  assert algorithms.choose_auto(8, 8, f32, "sum")[0] == "oneshot_ll"
  assert algorithms.choose_auto(8, limit, f32, "max")[0] == "oneshot_ll"
  name, reason = algorithms.choose_auto(8, limit + 1, f32, "sum")
  assert name == "xla" and "crossover" in reason
  name, reason = algorithms.choose_auto(8, 64, np.dtype(np.float64), "sum")
  assert name == "xla" and "float64" in reason
  monkeypatch.setenv("JAXLL_AUTO_MAX_BYTES", "16")
  assert algorithms.choose_auto(8, 32, f32, "sum")[0] == "xla"
  monkeypatch.setenv("JAXLL_AUTO_MAX_BYTES", "lots")
  with pytest.raises(ValueError, match="JAXLL_AUTO_MAX_BYTES"):
    algorithms.choose_auto(8, 32, f32, "sum")


def test_algorithm_catalogue():
  assert jaxll.ALGORITHMS[0] == "auto"
  assert set(jaxll.ALGORITHMS) == {"auto", "xla", "oneshot_ll"}
  assert algorithms.kernel_limits("oneshot_ll", np.dtype("int8"), "sum")
  assert algorithms.kernel_limits("oneshot_ll", np.dtype("bfloat16") if hasattr(np, "bfloat16")
                                  else np.dtype("float16"), "min") is None


def test_reduction_groups_rank_order():
  ids = np.arange(8).reshape(2, 4)
  mesh = types.SimpleNamespace(axis_names=("dp", "tp"), devices=ids)
  assert lowering.reduction_groups(mesh, ("tp",)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert lowering.reduction_groups(mesh, ("dp",)) == [[0, 4], [1, 5], [2, 6], [3, 7]]
  assert lowering.reduction_groups(mesh, ("dp", "tp")) == [list(range(8))]
  assert lowering.reduction_groups(mesh, ("tp", "dp")) == [[0, 4, 1, 5, 2, 6, 3, 7]]


@pytest.mark.parametrize("elem_bytes", [2, 4])
def test_oneshot_grid_plan(elem_bytes):
  spb, max_blocks = 1024, 16
  per_packet = 8 // elem_bytes
  capacity_elems = spb * max_blocks * per_packet
  for count in [1, 2, 3, 7, 100, 511, 512 * per_packet, 512 * per_packet + 1, 10_000,
                capacity_elems - 1]:
    blocks, threads = ext.plan_oneshot_ll(count, elem_bytes, spb, max_blocks)
    packets = -(-count // per_packet)
    assert 1 <= blocks <= max_blocks
    assert threads % 32 == 0 and 32 <= threads <= 512
    assert -(-packets // blocks) <= spb  # every block's range fits its scratch region
  assert ext.plan_oneshot_ll(capacity_elems, elem_bytes, spb, max_blocks)[0] == max_blocks
  assert ext.plan_oneshot_ll(capacity_elems + per_packet, elem_bytes, spb, max_blocks) == (0, 0)
  assert ext.plan_oneshot_ll(0, elem_bytes, spb, max_blocks) == (0, 0)


def test_error_word_roundtrip():
  word = ext.encode_error(1, 3, 7, 12, 0xDEADBEEF)
  assert word >> 63 == 1
  assert ext.decode_error(word) == (1, 3, 7, 12, 0xDEADBEEF)


def test_call_site_encoding_roundtrip():
  site = call_sites.CallSite(site='f.py:3 (g)', axes="dp,tp", group_size=4, shape="(2, 3)",
                          dtype="float32", nbytes=24, op="sum", requested="auto",
                          algorithm="oneshot_ll", reason='a; b="c"', workspace=5)
  back = call_sites.CallSite.decode(site.encode())
  assert back.reason == "a, b:'c'"
  assert back.nbytes == 24 and back.workspace == 5 and back.axes == "dp,tp"
  text = f'foo {{mhlo.frontend_attributes = {{jaxll_call = "{site.encode()}"}}}}'
  assert call_sites.call_sites_in(text) == [back]


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


def test_version_check_message():
  assert _ext.version_mismatch("0.10.2", "0.10.2") is None
  msg = _ext.version_mismatch("0.11.2", "0.10.2")
  assert "built against jaxlib 0.11.2" in msg and "0.10.2 is installed" in msg
  assert "--no-build-isolation" in msg


def test_extension_facts():
  import jaxlib
  assert ext.built_jaxlib_version == jaxlib.__version__
  assert ext.max_ranks >= 8 and ext.max_blocks >= 1
  assert set(ext.handlers()) == {"jaxll_all_reduce", "jaxll_virtual_all_reduce",
                                 "jaxll_device_ordinal", "jaxll_noop"}


def test_no_errors_without_workspaces():
  jaxll.check_errors()  # nothing built on CPU: nothing to report
  assert jaxll.errors() == []
