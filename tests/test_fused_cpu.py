"""jaxll.all_reduce_rmsnorm on 8 CPU devices: the psum-based reference math
bitwise (both sides lower to XLA's all-reduce here), a float64 reference,
gradients, explain and input checks."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll


@pytest.fixture(scope="module")
def mesh(cpu_devices):
  return jax.make_mesh((8,), ("tp",), devices=cpu_devices)


def _reference(x, residual, weight, eps):
  """The documented numerics, written with jax.lax.psum."""
  s = jax.lax.psum(x, "tp")
  new_residual = (s.astype(jnp.float32) + residual.astype(jnp.float32)).astype(x.dtype)
  h = new_residual.astype(jnp.float32)
  inv = jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)
  return (h * inv).astype(x.dtype) * weight.astype(x.dtype), new_residual


def _inputs(dtype, tokens=3, hidden=64, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((8 * tokens, hidden)).astype(dtype)       # per-rank partials
  residual = rng.standard_normal((tokens, hidden)).astype(dtype)     # replicated
  weight = (1 + 0.1 * rng.standard_normal(hidden)).astype(dtype)
  return x, residual, weight


def _shard(mesh, fn, check_vma):
  return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P("tp"), P(), P()),
                               out_specs=(P(), P()), check_vma=check_vma))


def _put(mesh, *arrays):
  specs = (P("tp"), P(), P())
  return [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(arrays, specs)]


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.float16])
@pytest.mark.parametrize("check_vma", [True, False])
def test_matches_the_psum_reference_bitwise(mesh, dtype, check_vma):
  args = _put(mesh, *_inputs(dtype))
  got = _shard(mesh, lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp", eps=1e-5),
               check_vma)(*args)
  want = _shard(mesh, lambda x, r, w: _reference(x, r, w, 1e-5), check_vma)(*args)
  for g, w in zip(got, want):
    assert g.dtype == np.dtype(dtype) and g.shape == (3, 64)
    np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (jnp.bfloat16, 2e-2),
                                       (np.float16, 5e-3)])
def test_close_to_float64_math(mesh, dtype, tol):
  x, residual, weight = _inputs(dtype, tokens=5, hidden=256, seed=1)
  normed, new_residual = _shard(
      mesh, lambda a, r, w: jaxll.all_reduce_rmsnorm(a, r, w, "tp"), True)(
          *_put(mesh, x, residual, weight))
  x64 = np.asarray(x, np.float64).reshape(8, 5, 256).sum(0)
  h = x64 + np.asarray(residual, np.float64)
  want = h / np.sqrt(np.mean(h * h, -1, keepdims=True) + 1e-6) * np.asarray(weight, np.float64)
  np.testing.assert_allclose(np.asarray(new_residual, np.float64), h, rtol=tol, atol=tol)
  np.testing.assert_allclose(np.asarray(normed, np.float64), want, rtol=tol, atol=4 * tol)


@pytest.mark.parametrize("check_vma", [True, False])
def test_gradients_equal_the_psum_reference(mesh, check_vma):
  args = _put(mesh, *_inputs(np.float32, seed=2))

  def loss(fn):
    def f(x, r, w):
      normed, new_residual = fn(x, r, w)
      return jnp.sum(normed * normed) + jnp.sum(jnp.sin(new_residual))
    return f

  def grads(fn):
    def body(x, r, w):
      g = jax.grad(loss(fn), argnums=(0, 1, 2))(x, r, w)
      # the replicated inputs' cotangents are per-rank pieces: sum them
      return g[0], jax.lax.psum(g[1], "tp"), jax.lax.psum(g[2], "tp")
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp"), P(), P()),
                                 out_specs=(P("tp"), P(), P()), check_vma=check_vma))(*args)

  got = grads(lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp"))
  want = grads(lambda x, r, w: _reference(x, r, w, 1e-6))
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("algorithm", ["auto", "fused", "fused_sentinel"])
def test_explain_lists_the_call_and_its_all_reduce_at_the_callers_line(mesh, algorithm):
  # on CPU: the call (what was asked for, the composition, why), then the
  # composition's all-reduce
  args = _put(mesh, *_inputs(np.float32))

  def block(x, r, w):
    return jaxll.all_reduce_rmsnorm(x, r, w, "tp", algorithm=algorithm)  # the call site

  sites = jaxll.explain(_shard(mesh, block, True), *args)
  assert [s.op for s in sites] == ["sum", "sum+rmsnorm"], sites
  for s in sites:
    assert s.site.startswith("test_fused_cpu.py:") and ".block)" in s.site, s
  reduce, call = sites
  assert (reduce.requested, reduce.algorithm) == ("auto", "xla")
  assert (call.requested, call.algorithm, call.workspace) == (algorithm, "composed", 0)
  assert call.reason.startswith("lowering for cpu, jaxll kernels run on CUDA GPUs"), call
  assert "jaxll.all_reduce (its own entry) then XLA's residual add and RMSNorm" in call.reason
  assert (call.shape, call.nbytes, call.group_size) == ("(3, 64)", 3 * 64 * 4, 8)


@pytest.mark.parametrize("bad,match", [
    (dict(weight=np.ones(63, np.float32)), "weight must have shape"),
    (dict(residual=np.ones((3, 64), np.float16)), "residual must have x's shape and dtype"),
    (dict(x=np.ones((8 * 3, 64), np.int32)), "must be float32, bfloat16 or float16"),
])
def test_bad_inputs_are_refused(mesh, bad, match):
  x, residual, weight = _inputs(np.float32)
  kw = dict(x=x, residual=residual, weight=weight)
  kw.update(bad)
  args = _put(mesh, kw["x"], kw["residual"], kw["weight"])
  with pytest.raises((ValueError, TypeError), match=match):
    _shard(mesh, lambda a, r, w: jaxll.all_reduce_rmsnorm(a, r, w, "tp"), True)(*args)


def test_fused_request_falls_back_to_the_composition_on_cpu(mesh):
  # algorithm="fused" where no kernel can serve (CPU): the composition, bitwise,
  # and the same gradients
  args = _put(mesh, *_inputs(jnp.bfloat16, seed=3))
  fused = _shard(mesh, lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp", algorithm="fused"),
                 True)(*args)
  plain = _shard(mesh, lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp"), True)(*args)
  for a, b in zip(fused, plain):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))

  def grads(algorithm):
    def body(x, r, w):
      def loss(x, r, w):
        n, h = jaxll.all_reduce_rmsnorm(x, r, w, "tp", algorithm=algorithm)
        return jnp.sum(n.astype(jnp.float32) ** 2) + jnp.sum(h.astype(jnp.float32))
      g = jax.grad(loss, argnums=(0, 1, 2))(x, r, w)
      return g[0], jax.lax.psum(g[1], "tp"), jax.lax.psum(g[2], "tp")
    f32 = [a.astype(jnp.float32) for a in args]
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp"), P(), P()),
                                 out_specs=(P("tp"), P(), P())))(*f32)
  for a, b in zip(grads("fused"), grads("auto")):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _cuda_text(mesh, monkeypatch, hidden, body=None, sentinel_serves=True):
  """Lowered for CUDA (no GPU needed) with the workspace lookup forced to 7
  (and the kernel's plan: LL16 for protocol auto and ll; sentinel and the
  two-shot exchanges where asked for if `sentinel_serves`, else no plan)."""
  from jaxll import algorithms, lowering
  from jaxll import fused as fused_mod
  codes = algorithms.RMSNORM_PROTOCOL_CODES
  named = {codes["sentinel"]: ("sentinel", False), codes["twoshot_ll"]: ("ll", True),
           codes["twoshot_sentinel"]: ("sentinel", True)}

  def plan(ws, dtype, tokens, hidden, protocol):
    assert ws == 7 and tokens * hidden > 0
    if protocol not in named:
      return {"blocks": 4, "protocol": "ll", "twoshot": False}
    exchange, twoshot = named[protocol]
    return {"blocks": 4 if sentinel_serves else 0, "protocol": exchange, "twoshot": twoshot}

  monkeypatch.setattr(fused_mod, "_kernel_plan", plan)
  monkeypatch.setattr(lowering, "workspace_for", lambda ctx, axes: (7, 8, ""))
  monkeypatch.setattr(lowering, "decide", lambda ctx, aval, axes, op, requested:
                      lowering.Decision("oneshot_ll", "forced by the test", 7, 8))
  x, residual, weight = _inputs(np.float32, hidden=hidden)

  def default(x, r, w):
    a, b = jaxll.all_reduce_rmsnorm(x, r, w, "tp", algorithm="fused", eps=1e-5)
    return a, jaxll.all_reduce(b, "tp")

  f = _shard(mesh, body or default, True)
  return f.trace(*_put(mesh, x, residual, weight)).lower(lowering_platforms=("cuda",)).as_text()


def test_fused_request_lowers_to_the_kernel_in_the_order_chain(mesh, monkeypatch):
  import re
  text = _cuda_text(mesh, monkeypatch, hidden=64)
  calls = re.findall(r"(%\w+):(\d) = stablehlo\.custom_call @(\w+)\(([^)]*)\)", text)
  assert [c[2] for c in calls] == ["jaxll_all_reduce_rmsnorm", "jaxll_all_reduce"], calls
  fused, after = calls
  check = re.search(r"(%\w+) = stablehlo\.custom_call @jaxll_check", text).group(1)
  order_in = fused[3].split(", ")[-1]
  # after the host check: its result, or a join over it
  assert fused[1] == "3" and (order_in == check or re.search(
      rf"{order_in.split('#')[0]} = stablehlo\.custom_call @jaxll_join\({check}\b", text)), text
  assert after[3].split(", ")[-1] == fused[0] + "#2"               # the next call after it
  assert "eps = 9.99999974E-6 : f32" in text and "workspace = 7" in text
  assert "protocol = 0 : i32" in text  # ("fused": the kernel's choice)
  sites = [s for s in jaxll.recent_call_sites() if s.op == "sum+rmsnorm"]
  assert sites and sites[-1].algorithm == "fused_oneshot_ll"
  assert sites[-1].reason.endswith("ll exchange (the kernel's choice)"), sites[-1].reason


@pytest.mark.parametrize("algorithm,code,path", [
    ("fused_ll", 1, "fused_oneshot_ll"), ("fused_sentinel", 2, "fused_oneshot_sentinel"),
    ("fused_twoshot_ll", 3, "fused_twoshot_ll"),
    ("fused_twoshot_sentinel", 4, "fused_twoshot_sentinel")])
def test_named_protocols_reach_the_kernel(mesh, monkeypatch, algorithm, code, path):
  from jaxll import algorithms
  assert algorithms.RMSNORM_PROTOCOL_CODES == {"auto": 0, "ll": 1, "sentinel": 2,
                                               "twoshot_ll": 3, "twoshot_sentinel": 4}

  def body(x, r, w):
    return jaxll.all_reduce_rmsnorm(x, r, w, "tp", algorithm=algorithm)

  text = _cuda_text(mesh, monkeypatch, hidden=64, body=body)
  assert text.count("@jaxll_all_reduce_rmsnorm(") == 1 and f"protocol = {code} : i32" in text
  site = [s for s in jaxll.recent_call_sites() if s.op == "sum+rmsnorm"][-1]
  assert (site.requested, site.algorithm) == (algorithm, path)
  assert site.reason == f"algorithm={algorithm!r} requested"


@pytest.mark.skipif(not jaxll.kernels_available(), reason="the refusal's text is the kernels'")
@pytest.mark.parametrize("algorithm,why", [
    ("fused_sentinel", "sentinel needs rows whose bytes are a multiple of 16 and a call that the "
                       "decode-shape kernel moves in one round, a 16-byte unit a thread"),
    ("fused_twoshot_ll", "twoshot_ll needs a call of one row-wave of the kernel's cut, at most 2 "
                         "units a thread"),
    ("fused_twoshot_sentinel", "twoshot_sentinel needs rows whose bytes are a multiple of 16 and "
                               "a call of one row-wave")])
def test_named_request_it_cannot_serve_is_refused_at_lowering(mesh, monkeypatch, algorithm, why):
  body = lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp", algorithm=algorithm)
  with pytest.raises(ValueError, match="that exchange cannot serve") as e:
    _cuda_text(mesh, monkeypatch, hidden=64, body=body, sentinel_serves=False)
  assert why in str(e.value) and algorithm in str(e.value)


@pytest.mark.parametrize("algorithm", ["fused_ll", "fused_sentinel", "fused_twoshot_ll",
                                       "fused_twoshot_sentinel"])
def test_named_protocols_take_the_composition_on_cpu(mesh, algorithm):
  args = _put(mesh, *_inputs(jnp.bfloat16, seed=6))
  got = _shard(mesh, lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp", algorithm=algorithm),
               True)(*args)
  want = _shard(mesh, lambda x, r, w: _reference(x, r, w, 1e-6), True)(*args)
  for a, b in zip(got, want):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


def test_fused_request_with_an_odd_hidden_size_takes_the_composition(mesh, monkeypatch):
  # float32 x 63: 252 bytes per row, not a multiple of 8; the lowered text
  # (what jaxll.explain reads) says so, and what the composition's all-reduce ran
  from jaxll.call_sites import call_sites_in
  text = _cuda_text(mesh, monkeypatch, hidden=63)
  assert "jaxll_all_reduce_rmsnorm" not in text and text.count("@jaxll_all_reduce(") == 2
  sites = call_sites_in(text)
  assert [(s.op, s.requested, s.algorithm) for s in sites] == [
      ("sum", "auto", "oneshot_ll"), ("sum+rmsnorm", "fused", "composed"),
      ("sum", "auto", "oneshot_ll")], sites
  assert sites[1].reason.startswith("the hidden size's bytes are not a multiple of 8, "), sites[1]


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


@pytest.mark.parametrize("hidden,fused", [(64, True), (12288, False)])
def test_auto_lowers_to_the_kernel_up_to_the_measured_size(mesh, monkeypatch, hidden, fused):
  # per rank: 3 x 64 float32 = 768 B (the kernel); 3 x 12288 = 144 KiB, above
  # FUSED_AUTO_MAX_BYTES (the composition: two all-reduce calls, this one's and the body's)
  from jaxll import fused as fused_mod
  assert 3 * 64 * 4 <= fused_mod.FUSED_AUTO_MAX_BYTES < 3 * 12288 * 4

  def body(x, r, w):
    a, b = jaxll.all_reduce_rmsnorm(x, r, w, "tp")
    return a, jaxll.all_reduce(b, "tp")

  text = _cuda_text(mesh, monkeypatch, hidden=hidden, body=body)
  assert ("jaxll_all_reduce_rmsnorm" in text) == fused
  assert text.count("@jaxll_all_reduce(") == (1 if fused else 2)
  if fused:
    site = [s for s in jaxll.recent_call_sites() if s.op == "sum+rmsnorm"][-1]
    assert (site.requested, site.algorithm) == ("auto", "fused_oneshot_ll")
    assert site.reason.startswith("auto: 768 B per rank, at most FUSED_AUTO_MAX_BYTES = 131072"), (
        site.reason)


@pytest.mark.parametrize("group,fused", [(2, True), (8, False)])
def test_auto_takes_the_sentinel_kernel_up_to_its_own_limit(mesh, monkeypatch, group, fused):
  # 3 x 12288 float32 = 144 KiB per rank: above FUSED_AUTO_MAX_BYTES, within
  # FUSED_SENTINEL_AUTO_MAX_BYTES[2]: the kernel in a group of 2 where its plan
  # is on the sentinel exchange; not on LL16, not in a group of 8
  from jaxll import fused as fused_mod
  from jaxll import lowering
  assert fused_mod.FUSED_AUTO_MAX_BYTES < 3 * 12288 * 4 <= fused_mod.FUSED_SENTINEL_AUTO_MAX_BYTES[2]
  assert 8 not in fused_mod.FUSED_SENTINEL_AUTO_MAX_BYTES
  body = lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp")
  text = _cuda_text(mesh, monkeypatch, hidden=12288, body=body)
  assert "jaxll_all_reduce_rmsnorm" not in text  # (the fake plan: LL16 for auto)
  monkeypatch.setattr(fused_mod, "_kernel_plan", lambda *a: {"blocks": 4, "protocol": "sentinel"})
  monkeypatch.setattr(lowering, "workspace_for", lambda ctx, axes: (7, group, ""))
  f = _shard(mesh, body, True)
  x, residual, weight = _inputs(np.float32, hidden=12288)
  text = f.trace(*_put(mesh, x, residual, weight)).lower(lowering_platforms=("cuda",)).as_text()
  site = [s for s in jaxll.recent_call_sites() if s.op == "sum+rmsnorm"][-1]
  if fused:
    assert text.count("@jaxll_all_reduce_rmsnorm(") == 1 and "protocol = 0 : i32" in text
    assert (site.requested, site.algorithm) == ("auto", "fused_oneshot_sentinel")
    assert "at most FUSED_SENTINEL_AUTO_MAX_BYTES[2]" in site.reason, site.reason
  else:
    assert "jaxll_all_reduce_rmsnorm" not in text
    assert site.algorithm == "composed" and "auto limit 131072 for N=8" in site.reason


@pytest.mark.parametrize("group,hidden,fused", [(8, 12288, True), (8, 32768, False),
                                                (4, 12288, False)])
def test_auto_takes_the_two_shot_kernel_up_to_its_own_limit(mesh, monkeypatch, group, hidden,
                                                            fused):
  # per rank 3 x 12288 float32 = 144 KiB, within FUSED_TWOSHOT_AUTO_MAX_BYTES[8];
  # 3 x 32768 = 384 KiB, above it; a group of 4 has no two-shot limit (the
  # one-shot one of 128 KiB holds): the kernel only where the plan is two-shot
  from jaxll import fused as fused_mod
  from jaxll import lowering
  limit = fused_mod.FUSED_TWOSHOT_AUTO_MAX_BYTES[8]
  assert fused_mod.FUSED_AUTO_MAX_BYTES < 3 * 12288 * 4 <= limit < 3 * 32768 * 4
  assert 4 not in fused_mod.FUSED_TWOSHOT_AUTO_MAX_BYTES
  assert fused_mod.fused_auto_max_bytes(8, True, True) == limit
  assert fused_mod.fused_auto_max_bytes(8, True) == fused_mod.FUSED_AUTO_MAX_BYTES
  monkeypatch.setattr(fused_mod, "_kernel_plan",
                      lambda *a: {"blocks": 4, "protocol": "sentinel", "twoshot": True})
  monkeypatch.setattr(lowering, "workspace_for", lambda ctx, axes: (7, group, ""))
  body = lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp")
  x, residual, weight = _inputs(np.float32, hidden=hidden)
  text = _shard(mesh, body, True).trace(*_put(mesh, x, residual, weight)).lower(
      lowering_platforms=("cuda",)).as_text()
  site = [s for s in jaxll.recent_call_sites() if s.op == "sum+rmsnorm"][-1]
  if fused:
    assert text.count("@jaxll_all_reduce_rmsnorm(") == 1 and "protocol = 0 : i32" in text
    assert (site.requested, site.algorithm) == ("auto", "fused_twoshot_sentinel")
    assert "at most FUSED_TWOSHOT_AUTO_MAX_BYTES[8]" in site.reason, site.reason
    assert site.reason.endswith("two-shot sentinel exchange (the kernel's choice)"), site.reason
  else:
    assert "jaxll_all_reduce_rmsnorm" not in text
    assert site.algorithm == "composed" and "two-shot sentinel exchange" in site.reason


def _vmapped(case, f):
  """shard_map bodies that vmap ``f(x, r, w)`` (x: (tokens, 4, 64) per rank)."""
  if case == "rows":          # x and r batched on axis 1, one weight
    return lambda x, r, w: jax.vmap(f, in_axes=(1, 1, None), out_axes=1)(x, r, w[0])
  if case == "weights":       # a weight per batch element
    return lambda x, r, w: jax.vmap(f, in_axes=(1, 1, 0), out_axes=1)(x, r, w[:4])
  if case == "residual":      # one residual for every batch element
    return lambda x, r, w: jax.vmap(f, in_axes=(1, None, None), out_axes=1)(x, r[:, 0], w[0])
  raise ValueError(case)


@pytest.mark.parametrize("algorithm", ["auto", "fused"])
@pytest.mark.parametrize("case", ["rows", "weights", "residual"])
def test_vmap_matches_the_reference(mesh, algorithm, case):
  rng = np.random.default_rng(4)
  x = rng.standard_normal((8 * 3, 4, 64)).astype(np.float32)
  r = rng.standard_normal((3, 4, 64)).astype(np.float32)
  w = (1 + 0.1 * rng.standard_normal((5, 64))).astype(np.float32)
  args = _put(mesh, x, r, w)

  def run(f):
    g = jax.jit(jax.shard_map(_vmapped(case, f), mesh=mesh, in_specs=(P("tp"), P(), P()),
                              out_specs=(P(), P()), check_vma=False))
    return [np.asarray(o) for o in g(*args)]

  got = run(lambda a, b, c: jaxll.all_reduce_rmsnorm(a, b, c, "tp", algorithm=algorithm))
  want = run(lambda a, b, c: _reference(a, b, c, 1e-6))
  for g, v in zip(got, want):
    assert g.shape == (3, 4, 64)
    np.testing.assert_array_equal(g, v)


@pytest.mark.parametrize("algorithm", ["auto", "fused"])
def test_vmap_over_a_reduced_axis_name(mesh, algorithm):
  # jax.vmap(axis_name="v") with the reduction over ("tp", "v"): the vmapped
  # axis is summed as part of the all-reduce
  rng = np.random.default_rng(5)
  x = rng.standard_normal((8 * 2, 3, 64)).astype(np.float32)
  r = rng.standard_normal((2, 3, 64)).astype(np.float32)
  w = (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)

  def body(x, r, w):
    return jax.vmap(lambda a, b: jaxll.all_reduce_rmsnorm(a, b, w, ("tp", "v"), algorithm=algorithm),
                    axis_name="v")(x, r)

  g = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp"), P(), P()),
                            out_specs=(P(), P()), check_vma=False))
  normed, new_residual = (np.asarray(o, np.float64) for o in g(*_put(mesh, x, r, w)))
  h = x.astype(np.float64).reshape(8, 2, 3, 64).sum((0, 1))[None] + r
  want = h / np.sqrt(np.mean(h * h, -1, keepdims=True) + 1e-6) * w
  np.testing.assert_allclose(new_residual, h, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(normed, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch,fused", [(2, True), (64, False), (256, False)])
def test_auto_under_vmap_counts_the_batched_rows(mesh, monkeypatch, batch, fused):
  # 3 x 256 float32 = 3 KiB per vmapped call: 2 of them (6 KiB) stay on the
  # kernel, 64 (192 KiB) exceed FUSED_AUTO_MAX_BYTES and take the composition
  # at lowering (the fake plan is LL16), 256 (768 KiB) exceed every group's
  # limit and take it in the batching rule
  from jaxll import fused as fused_mod
  from jaxll import lowering
  monkeypatch.setattr(fused_mod, "_kernel_plan", lambda *a: {"blocks": 4, "protocol": "ll"})
  monkeypatch.setattr(lowering, "workspace_for", lambda ctx, axes: (7, 8, ""))
  monkeypatch.setattr(lowering, "decide", lambda ctx, aval, axes, op, requested:
                      lowering.Decision("oneshot_ll", "forced by the test", 7, 8))
  rng = np.random.default_rng(6)
  x = rng.standard_normal((8 * 3, batch, 256)).astype(np.float32)
  r = rng.standard_normal((3, batch, 256)).astype(np.float32)
  w = np.ones(256, np.float32)
  body = lambda x, r, w: jax.vmap(lambda a, b: jaxll.all_reduce_rmsnorm(a, b, w, "tp"),
                                  in_axes=1, out_axes=1)(x, r)
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp"), P(), P()),
                            out_specs=(P(), P()), check_vma=False))
  text = f.trace(*_put(mesh, x, r, w)).lower(lowering_platforms=("cuda",)).as_text()
  assert ("jaxll_all_reduce_rmsnorm" in text) == fused
  assert ("@jaxll_all_reduce(" in text) == (not fused)
  site = jaxll.recent_call_sites()[-1]  # the kernel's, or the composition's all-reduce
  assert site.site.startswith("test_fused_cpu.py:") and "<lambda>" in site.site, site


@pytest.mark.parametrize("group,max_bytes", [(1, None), (8, "0")])
def test_auto_leaves_to_xla_what_all_reduce_auto_would(mesh, monkeypatch, group, max_bytes):
  # a group of one device, or JAXLL_AUTO_MAX_BYTES below the call: the
  # composition (its all-reduce then decides), not the fused kernel
  if max_bytes is not None:
    monkeypatch.setenv("JAXLL_AUTO_MAX_BYTES", max_bytes)
  from jaxll import lowering
  monkeypatch.setattr(lowering, "group_size", lambda ctx, axes: group)
  made = []  # (auto decides before it builds a workspace)
  monkeypatch.setattr(lowering, "workspace_for",
                      lambda ctx, axes: made.append(axes) or (7, group, ""))
  x, residual, weight = _inputs(np.float32, hidden=64)
  f = _shard(mesh, lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp"), True)
  text = f.trace(*_put(mesh, x, residual, weight)).lower(lowering_platforms=("cuda",)).as_text()
  assert "jaxll_all_reduce_rmsnorm" not in text
  site = [s for s in jaxll.recent_call_sites() if s.op == "sum+rmsnorm"][-1]
  assert site.algorithm == "composed" and site.reason.startswith("auto: "), site
  assert site.workspace == 0 and not made, made


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
  Python end to end on CPU: jaxll.testing's GPU calls and timers replaced by
  stand-ins that record how they were called (the all-reduce as a sum over the
  ranks' rows, the fused call as that sum followed by the norm math). Every
  call and timer of a row takes that row's launch mode, each mode subtracts its
  own graph floor, and the rows reach --json."""
  import argparse
  import importlib.util
  import json
  import os
  from jaxll import fused, testing
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
  """jaxll.testing.virtual_fused_rmsnorm refuses bad shapes and mixed dtypes
  before it looks for a GPU."""
  import jaxll.testing as jt
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


# --- Types under check_vma, transformations, input errors ----------------------------

_SPECS = {"replicated": P(), "dp": P("dp"), "tp": P("tp")}


def _grid_inputs(seed=7, tokens=3, hidden=16):
  """x: every (dp, tp) device's partial sums; residual and weight with a
  leading axis of 2 (dp) or 4 (tp) where they are sharded, one copy replicated."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((2, 4, tokens, hidden)).astype(np.float32)
  residual = {k: rng.standard_normal(((2,) if k == "dp" else (4,) if k == "tp" else ())
                                     + (tokens, hidden)).astype(np.float32) for k in _SPECS}
  weight = {k: (1 + 0.1 * rng.standard_normal(((2,) if k == "dp" else (4,) if k == "tp" else ())
                                              + (hidden,))).astype(np.float32) for k in _SPECS}
  return x, residual, weight


def _grid(mesh2, fn, r_kind, w_kind, out_specs, check_vma=True):
  """fn(x, r, w) on the (dp, tp) mesh, per device x (tokens, hidden), r and w
  as their kind gives them (one slice where sharded)."""
  def body(x, r, w):
    r = r if r_kind == "replicated" else r[0]
    w = w if w_kind == "replicated" else w[0]
    return fn(x[0, 0], r, w)
  specs = (P("dp", "tp"), _SPECS[r_kind], _SPECS[w_kind])
  f = jax.jit(jax.shard_map(body, mesh=mesh2, in_specs=specs, out_specs=out_specs,
                            check_vma=check_vma))
  return lambda *args: f(*(jax.device_put(a, NamedSharding(mesh2, s)) for a, s in zip(args, specs)))


def _fused_or_reference(fused):
  if fused:
    return lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp")
  return lambda x, r, w: _reference(x, r, w, 1e-6)


@pytest.mark.parametrize("r_kind,w_kind", [("replicated", "replicated"), ("dp", "replicated"),
                                           ("tp", "replicated"), ("replicated", "tp"),
                                           ("dp", "dp")])
def test_result_types_are_the_compositions(mesh2, r_kind, w_kind):
  # the results vary over what x varies over besides the reduced axis (here
  # dp), and over what residual and weight vary over: a shard_map whose
  # out_specs claim more replication is refused, as it is for the psum
  # reference (no silent pick of one device's rows); with out_specs that fit,
  # the values and types equal the reference's
  x, residual, weight = _grid_inputs()
  args = (x, residual[r_kind], weight[w_kind])
  from jaxll import fused as fused_mod
  varying = {}

  def typed(name, fn):
    def run(x, r, w):
      out = fn(x, r, w)
      varying[name] = [fused_mod._varying(o) for o in out]
      return out
    return run

  for name, fused in (("reference", False), ("fused", True)):
    with pytest.raises(Exception, match="out_specs") as e:
      _grid(mesh2, _fused_or_reference(fused), r_kind, w_kind, (P(), P()))(*args)
    assert "replicat" in str(e.value), e.value
  spread = P("dp", "tp")
  lift = lambda fn: (lambda x, r, w: tuple(o[None, None] for o in fn(x, r, w)))
  got = _grid(mesh2, lift(typed("fused", _fused_or_reference(True))), r_kind, w_kind,
              (spread, spread))(*args)
  want = _grid(mesh2, lift(typed("reference", _fused_or_reference(False))), r_kind, w_kind,
               (spread, spread))(*args)
  assert varying["fused"] == varying["reference"], varying
  axes_of = lambda *kinds: frozenset({"dp"} | {k for k in kinds if k != "replicated"})
  assert varying["fused"] == [axes_of(r_kind, w_kind), axes_of(r_kind)], varying
  for g, v in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(v))
  # float64: the sum over tp of each dp row's partials, plus the residual
  h = x.astype(np.float64).sum(1)[:, None] + np.broadcast_to(
      {"replicated": residual["replicated"][None, None], "dp": residual["dp"][:, None],
       "tp": residual["tp"][None]}[r_kind], (2, 4, 3, 16))
  np.testing.assert_allclose(np.asarray(got[1], np.float64).reshape(2, 4, 3, 16), h,
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("check_vma", [True, False])
def test_gradients_on_a_dp_tp_mesh_with_a_sharded_residual(mesh2, check_vma):
  x, residual, weight = _grid_inputs(seed=8)
  args = (x, residual["dp"], weight["replicated"])

  def grads(fused):
    f = _fused_or_reference(fused)

    def body(x, r, w):
      def loss(x, r, w):
        normed, new_residual = f(x, r, w)
        return jnp.sum(normed * normed) + jnp.sum(jnp.sin(new_residual))
      gx, gr, gw = jax.grad(loss, argnums=(0, 1, 2))(x[0, 0], r[0], w)
      _, tangent = jax.jvp(lambda v: f(v, r[0], w)[0], (x[0, 0],), (jnp.ones_like(x[0, 0]),))
      return (gx[None, None], jax.lax.psum(gr, "tp")[None], jax.lax.psum(gw, ("dp", "tp")),
              tangent[None, None])
    specs = (P("dp", "tp"), P("dp"), P())
    return jax.jit(jax.shard_map(body, mesh=mesh2, in_specs=specs,
                                 out_specs=(P("dp", "tp"), P("dp"), P(), P("dp", "tp")),
                                 check_vma=check_vma))(
        *(jax.device_put(a, NamedSharding(mesh2, s)) for a, s in zip(args, specs)))

  for g, w in zip(grads(True), grads(False)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("check_vma", [True, False])
def test_jacfwd_and_an_unbatched_call_under_vmap(mesh, check_vma):
  # jacfwd (vmap of jvp) batches the tangents only: the call itself runs once,
  # unbatched, and its rows are not multiplied by the batch
  x, residual, weight = _inputs(np.float32, tokens=2, hidden=8, seed=9)
  args = _put(mesh, x, residual, weight)

  def jac(fn):
    def body(x, r, w):
      jr = jax.jacfwd(lambda rr: fn(x, rr, w)[0])(r)
      jw = jax.jacfwd(lambda ww: fn(x, r, ww)[0])(w)
      scaled = jax.vmap(lambda t: fn(x, r, w)[0] * t)(jnp.arange(5.0, dtype=jnp.float32))
      return jr, jw, scaled
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp"), P(), P()),
                                 out_specs=(P(), P(), P()), check_vma=check_vma))(*args)

  got = jac(lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp"))
  sites = [s for s in jaxll.recent_call_sites()
           if s.op == "sum+rmsnorm" and "test_jacfwd_and_an_unbatched" in s.site]
  assert sites and all(s.shape == "(2, 8)" for s in sites), [s.shape for s in sites]
  want = jac(lambda x, r, w: _reference(x, r, w, 1e-6))
  assert got[0].shape == (2, 8, 2, 8) and got[2].shape == (5, 2, 8)
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kw,error,match", [
    (dict(algorithm="fussed"), ValueError,
     r"jaxll.all_reduce_rmsnorm: algorithm must be one of \['auto', 'fused', 'fused_ll'"),
    (dict(algorithm="fused_oneshot_ll"), ValueError, "all_reduce_rmsnorm: algorithm must be"),
    (dict(algorithm=None), ValueError, "all_reduce_rmsnorm: algorithm must be"),
    (dict(eps="1e-6"), TypeError, "eps must be a real number known when tracing"),
    (dict(eps=1j), TypeError, "eps must be a real number known when tracing"),
    (dict(eps=np.array([1e-6, 1e-6])), TypeError, "eps must be a real number"),
    (dict(eps=None), TypeError, "eps must be a real number"),
    (dict(eps=-1e-6), ValueError, "eps must be >= 0"),
    (dict(eps=float("nan")), ValueError, "eps must be >= 0"),
    (dict(weight=np.ones(64, np.complex64)), TypeError, "weight must be real"),
    (dict(weight=np.ones(64, np.bool_)), TypeError, "weight must be real"),
    (dict(axis="dp"), NameError, "jaxll.all_reduce_rmsnorm: unknown axis name 'dp'"),
    (dict(axis=("tp", "tp")), ValueError, "jaxll.all_reduce_rmsnorm: axis names repeat"),
    (dict(axis=0), TypeError, "jaxll.all_reduce_rmsnorm reduces over named mesh axes"),
])
def test_bad_arguments_are_refused_by_name(mesh, kw, error, match):
  x, residual, weight = _inputs(np.float32)
  weight = kw.pop("weight", weight)
  axis = kw.pop("axis", "tp")
  f = _shard(mesh, lambda a, r, w: jaxll.all_reduce_rmsnorm(a, r, w, axis, **kw), True)
  with pytest.raises(error, match=match):
    f(*_put(mesh, x, residual, weight))


def test_eps_as_a_concrete_scalar_and_a_traced_one(mesh):
  args = _put(mesh, *_inputs(np.float32, seed=10))
  want = _shard(mesh, lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp", eps=1e-5),
                True)(*args)
  for eps in (np.float32(1e-5), jnp.float32(1e-5), np.array(1e-5), 1e-5):
    got = _shard(mesh, lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp", eps=eps),
                 True)(*args)
    for g, v in zip(got, want):
      np.testing.assert_array_equal(np.asarray(g), np.asarray(v))
  traced = _shard(mesh, lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp", eps=w[0]), True)
  with pytest.raises(TypeError, match="eps must be a real number known when tracing"):
    traced(*args)


@pytest.mark.parametrize("name", ["all_gather", "psum_scatter"])
def test_gather_scatter_axis_errors_name_the_function(mesh, name):
  f = jax.jit(jax.shard_map(lambda x: getattr(jaxll, name)(x, "dp"), mesh=mesh,
                            in_specs=P("tp"), out_specs=P("tp")))
  with pytest.raises(NameError, match=f"jaxll.{name}: unknown axis name 'dp'"):
    f(jax.device_put(jnp.ones((8, 8), jnp.float32), NamedSharding(mesh, P("tp"))))


def _declared_attributes(path):
  """{handler symbol: {attribute: MLIR type}} from the XLA_FFI_DEFINE_HANDLER_SYMBOL
  bindings of a C++ file (its binding macros expanded)."""
  import os
  import re
  text = open(path).read()
  macros = {m.group(1): m.group(2) for m in re.finditer(
      r"#define (\w+)\s*\\\n((?:.*\\\n)*.*)", text)}
  types = {"int64_t": "i64", "int32_t": "i32", "float": "f32",
           "ffi::Span<const int64_t>": "i64[]"}
  out = {}
  for m in re.finditer(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\((\w+),\s*\w+,(.*?)\);", text, re.S):
    body = m.group(2)
    for name, expansion in macros.items():
      body = body.replace(name, expansion)
    out[m.group(1)] = {a: types[t] for t, a in re.findall(r'\.Attr<([^>]+>?)>\("(\w+)"\)', body)}
  assert out and os.path.basename(path)
  return out


def _lowered_attributes(text):
  """{custom call target: {attribute: MLIR type}} of every jaxll custom call in
  lowered text (each target's calls must agree)."""
  import re
  out = {}
  for m in re.finditer(r"stablehlo\.custom_call @(jaxll_\w+)\([^\n]*?mhlo\.backend_config = "
                       r"\{([^}]*)\}", text):
    attrs = {}
    for name, value in re.findall(r"(\w+) = ([^,]+(?:\[[^\]]*\])?)", m.group(2)):
      kind = value.strip().split(":")[-1].strip()
      attrs[name] = "i64[]" if re.fullmatch(r"tensor<\d+xi64>|array<i64.*", kind) else kind
    assert out.setdefault(m.group(1), attrs) == attrs, (m.group(1), attrs)
  return out


def test_lowered_attributes_are_the_ones_the_handlers_declare(mesh, monkeypatch):
  # every custom call jaxll emits carries exactly the attributes, names and
  # types, that its FFI handler binds (ffi/runtime/ffi_handlers.cc, and
  # ffi/testing/virtual_handlers.cc for jaxll.testing's calls): a
  # mismatch would only show on a GPU, as an FFI decoding error at run time
  import os
  import types as pytypes
  import jaxll.testing as jt
  from jaxll import lowering
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  declared = _declared_attributes(os.path.join(root, "ffi", "runtime", "ffi_handlers.cc"))
  declared.update(_declared_attributes(os.path.join(root, "ffi", "testing", "virtual_handlers.cc")))
  lowered = _lowered_attributes(_cuda_text(mesh, monkeypatch, hidden=64))  # fused + all_reduce
  monkeypatch.setattr(lowering, "group_size", lambda ctx, axes: 8)
  for fn in (lambda v: jaxll.all_gather(v, "tp", tiled=True, algorithm="oneshot_ll"),
             lambda v: jaxll.psum_scatter(v, "tp", tiled=True, algorithm="oneshot_ll")):
    f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))
    x = jax.device_put(np.zeros((8 * 64,), np.float32), NamedSharding(mesh, P("tp")))
    lowered.update(_lowered_attributes(f.trace(x).lower(lowering_platforms=("cuda",)).as_text()))
  monkeypatch.setattr(jt, "virtual_workspace", lambda n, device=None, config=None:
                      pytypes.SimpleNamespace(id=7))
  x = jax.ShapeDtypeStruct((2, 3, 64), np.float32)
  w = jax.ShapeDtypeStruct((64,), np.float32)
  for graph in (False, True):
    f = lambda x: jt.virtual_all_reduce(x, command_buffer=graph)
    g = lambda x, r, w: jt.virtual_fused_rmsnorm(x, r, w, command_buffer=graph)
    lowered.update(_lowered_attributes(
        jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()))
    lowered.update(_lowered_attributes(
        jax.jit(g).trace(x, x, w).lower(lowering_platforms=("cuda",)).as_text()))
  want = {"jaxll_all_reduce", "jaxll_all_reduce_rmsnorm", "jaxll_gather_scatter", "jaxll_check",
          "jaxll_virtual_all_reduce", "jaxll_virtual_all_reduce_graph",
          "jaxll_virtual_all_reduce_rmsnorm", "jaxll_virtual_all_reduce_rmsnorm_graph"}
  assert want <= set(lowered), sorted(lowered)
  for target, attrs in lowered.items():
    assert attrs == declared[target + "_handler"], (target, attrs, declared[target + "_handler"])
  assert declared["jaxll_all_reduce_handler"]["workspace"] == "i64"
