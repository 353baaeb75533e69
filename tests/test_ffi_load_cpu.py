"""CPU tier: the runtime loads in the installed jaxlib. Which jaxlib a build
serves (native.load_problem), and, with the kernels, XLA's own check: every
handler of the runtime and the testing tools registers with the installed
jaxlib's XLA (which refuses an FFI API version it does not take), and XLA runs
two of them through a real call frame on the CPU."""

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest

from jaxll import native
from jaxll.native import ext

needs_kernels = pytest.mark.skipif(ext is None, reason="jaxll installed without its CUDA kernels")


@pytest.mark.parametrize("built_api, installed_api, loads", [
    ((0, 3), (0, 3), True),    # the jaxlib it was compiled against, or one of the same FFI API
    ((0, 3), (0, 5), True),    # a newer jaxlib: XLA takes older minor versions
    ((0, 5), (0, 3), False),   # an older jaxlib than the headers
    ((0, 3), (1, 0), False),   # another major version
])
def test_load_rule(built_api, installed_api, loads):
  problem = native.load_problem("0.10.0", built_api, "0.12.0", installed_api)
  assert (problem is None) == loads
  if not loads:
    assert f"XLA FFI API {built_api[0]}.{built_api[1]}" in problem
    assert f"XLA FFI API {installed_api[0]}.{installed_api[1]}" in problem
    assert "pip install --force-reinstall --no-deps ." in problem
    assert "JAXLL_SKIP_VERSION_CHECK=1" in problem


@pytest.mark.parametrize("installed, installed_api, loads", [
    ("0.12.1", (0, 5), True),     # the jaxlib whose headers it was compiled against
    ("0.13.0", (0, 5), True),     # a newer one of the same FFI API
    ("0.12.0", (0, 5), False),    # an older jaxlib of the same FFI API (another record stage)
    ("0.12.0.1", (0, 5), False),
    ("0.11.2", (0, 4), False),
])
def test_load_rule_asks_for_the_jaxlib_of_the_headers_or_newer(installed, installed_api, loads):
  assert (native.load_problem("0.12.1", (0, 5), installed, installed_api) is None) == loads


def test_jaxlib_release():
  assert native.jaxlib_release("0.12.0.1") == (0, 12, 0, 1)
  assert native.jaxlib_release("0.12.2.dev20261201") == (0, 12, 2)
  assert native.jaxlib_release("0.10.0rc1") == (0, 10, 0)


LAYERS = (("_runtime_ffi_0_5", "0.12.1", (0, 5)), ("_runtime_ffi_0_3", "0.10.0", (0, 3)))


@pytest.mark.parametrize("installed, installed_api, module", [
    ("0.10.0", (0, 3), "_runtime_ffi_0_3"),
    ("0.10.2", (0, 3), "_runtime_ffi_0_3"),
    ("0.11.2", (0, 4), "_runtime_ffi_0_3"),
    ("0.12.0", (0, 5), "_runtime_ffi_0_3"),   # (0.12.0's record stage is not the layer's)
    ("0.12.1", (0, 5), "_runtime_ffi_0_5"),
    ("0.13.0", (0, 6), "_runtime_ffi_0_5"),
])
def test_the_newest_layer_the_installed_jaxlib_takes_is_chosen(installed, installed_api, module):
  assert native.choose_layer(LAYERS, installed, installed_api) == (module, None)


def test_no_layer_for_another_major_version_says_why():
  module, problem = native.choose_layer(LAYERS, "1.0.0", (1, 0))
  assert module is None and "jaxlib 0.10.0 (XLA FFI API 0.3)" in problem


@needs_kernels
def test_the_loaded_layer_is_the_one_chosen_for_the_installed_jaxlib():
  module, _ = native.choose_layer(native.LAYERS, jaxlib.__version__, native.installed_ffi_api())
  assert ext.__name__ == f"jaxll.{module}"
  built = {m: (v, api) for m, v, api in native.LAYERS}[module]
  assert (ext.built_jaxlib_version, tuple(ext.ffi_api_version)) == built


def test_load_rule_without_headers():
  assert native.load_problem("0.10.2", (0, 3), "0.10.2", None) is None
  problem = native.load_problem("0.10.0", (0, 3), "0.10.2", None)
  assert "jaxlib 0.10.2, whose XLA FFI API version is unknown" in problem


def test_installed_ffi_api_is_read():
  major, minor = native.installed_ffi_api()
  assert major == 0 and minor >= 3, (jaxlib.__version__, major, minor)


@needs_kernels
def test_build_serves_the_installed_jaxlib():
  assert native.load_problem(ext.built_jaxlib_version, tuple(ext.ffi_api_version),
                             jaxlib.__version__, native.installed_ffi_api()) is None


@needs_kernels
def test_xla_takes_and_runs_the_handlers():
  from jaxll.tools import testing
  tables = {**ext.handlers(), **testing._tools.handlers()}
  for name, (capsule, _, record) in tables.items():
    # a registration XLA refuses (an FFI API version it does not take) raises
    jax.ffi.register_ffi_target(f"probe_{name}", capsule, platform="cpu")
    if record is not None:  # and so does a bundle with a record stage it does not take
      jax.ffi.register_ffi_target(f"probe_record_{name}", {"execute": capsule, "record": record},
                                  platform="cpu")

  with jax.default_device(jax.devices("cpu")[0]):  # (the probes are CPU targets)
    # jaxll_join reads no context, so it runs on the CPU: operands and result decode
    x = jnp.arange(6, dtype=jnp.float32)
    join = jax.ffi.ffi_call("probe_jaxll_join", jax.ShapeDtypeStruct(x.shape, x.dtype),
                            input_output_aliases={0: 0})
    np.testing.assert_array_equal(jax.jit(join)(x, x + 1), np.arange(6, dtype=np.float32))
    # jaxll_noop asks for the CUDA stream: XLA calls it, and its decoding says why it cannot run
    noop = jax.ffi.ffi_call("probe_jaxll_noop", jax.ShapeDtypeStruct(x.shape, x.dtype))
    with pytest.raises(Exception, match="GPU context is not available"):
      jax.block_until_ready(jax.jit(noop)(x))


def test_runtime_info_says_which_layer_and_path():
  import jaxll
  from jaxll import settings
  info = jaxll.runtime_info()
  assert info.layers == tuple((m, v) for m, v, _ in native.LAYERS)
  if ext is None:
    assert not info.kernels and info.layer is None and not info.record_stage
    assert info.note == native.NO_KERNELS_REASON
    return
  assert info.kernels and info.layer == ext.__name__
  assert info.headers_jaxlib == ext.built_jaxlib_version
  # (JAXLL_RECORD_STAGE as it was when jaxll registered its targets, as it is now)
  assert info.record_stage == (bool(ext.record_stage) and settings.record_stage())
  assert ("kernel node" if info.record_stage else "child graph") in info.note
