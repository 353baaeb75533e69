"""jaxll.all_reduce_rmsnorm on 8 CPU devices: the psum-based reference math
bitwise (both sides lower to XLA's all-reduce here), a float64 reference,
gradients, explain, input checks, how requests lower (cross-lowered for CUDA)
and how auto chooses, vmap."""

import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import jaxll

from rmsnorm_cases import cuda_text, inputs, plan, put, reference, shard

ALL_REDUCE = sys.modules["jaxll.all_reduce"]  # (the module; jaxll.all_reduce is the function)


@pytest.fixture(scope="module")
def mesh(cpu_devices):
  return jax.make_mesh((8,), ("tp",), devices=cpu_devices)


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.float16])
@pytest.mark.parametrize("check_vma", [True, False])
def test_matches_the_psum_reference_bitwise(mesh, dtype, check_vma):
  args = put(mesh, *inputs(dtype))
  got = shard(mesh, lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp", eps=1e-5),
               check_vma)(*args)
  want = shard(mesh, lambda x, r, w: reference(x, r, w, 1e-5), check_vma)(*args)
  for g, w in zip(got, want):
    assert g.dtype == np.dtype(dtype) and g.shape == (3, 64)
    np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (jnp.bfloat16, 2e-2),
                                       (np.float16, 5e-3)])
def test_close_to_float64_math(mesh, dtype, tol):
  x, residual, weight = inputs(dtype, tokens=5, hidden=256, seed=1)
  normed, new_residual = shard(
      mesh, lambda a, r, w: jaxll.all_reduce_rmsnorm(a, r, w, "tp"), True)(
          *put(mesh, x, residual, weight))
  x64 = np.asarray(x, np.float64).reshape(8, 5, 256).sum(0)
  h = x64 + np.asarray(residual, np.float64)
  want = h / np.sqrt(np.mean(h * h, -1, keepdims=True) + 1e-6) * np.asarray(weight, np.float64)
  np.testing.assert_allclose(np.asarray(new_residual, np.float64), h, rtol=tol, atol=tol)
  np.testing.assert_allclose(np.asarray(normed, np.float64), want, rtol=tol, atol=4 * tol)


@pytest.mark.parametrize("check_vma", [True, False])
def test_gradients_equal_the_psum_reference(mesh, check_vma):
  args = put(mesh, *inputs(np.float32, seed=2))

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
  want = grads(lambda x, r, w: reference(x, r, w, 1e-6))
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("algorithm", ["auto", "fused", "fused_sentinel"])
def test_explain_lists_the_call_and_its_all_reduce_at_the_callers_line(mesh, algorithm):
  # on CPU: the call (what was asked for, the composition, why), then the
  # composition's all-reduce
  args = put(mesh, *inputs(np.float32))

  def block(x, r, w):
    return jaxll.all_reduce_rmsnorm(x, r, w, "tp", algorithm=algorithm)  # the call site

  sites = jaxll.explain(shard(mesh, block, True), *args)
  assert [s.op for s in sites] == ["sum", "sum+rmsnorm"], sites
  for s in sites:
    assert s.site.startswith("test_rmsnorm_cpu.py:") and ".block)" in s.site, s
  reduce, call = sites
  assert (reduce.requested, reduce.algorithm) == ("auto", "xla")
  assert (call.requested, call.algorithm, call.workspace) == (algorithm, "composed", 0)
  assert call.reason.startswith("lowering for cpu; jaxll kernels run on CUDA GPUs"), call
  assert "jaxll.all_reduce (its own entry) then XLA's residual add and RMSNorm" in call.reason
  assert (call.shape, call.nbytes, call.group_size) == ("(3, 64)", 3 * 64 * 4, 8)


@pytest.mark.parametrize("bad,match", [
    (dict(weight=np.ones(63, np.float32)), "weight must have shape"),
    (dict(residual=np.ones((3, 64), np.float16)), "residual must have x's shape and dtype"),
    (dict(x=np.ones((8 * 3, 64), np.int32)), "must be float32, bfloat16 or float16"),
])
def test_bad_inputs_are_refused(mesh, bad, match):
  x, residual, weight = inputs(np.float32)
  kw = dict(x=x, residual=residual, weight=weight)
  kw.update(bad)
  args = put(mesh, kw["x"], kw["residual"], kw["weight"])
  with pytest.raises((ValueError, TypeError), match=match):
    shard(mesh, lambda a, r, w: jaxll.all_reduce_rmsnorm(a, r, w, "tp"), True)(*args)


def test_fused_request_falls_back_to_the_composition_on_cpu(mesh):
  # algorithm="fused" where no kernel can serve (CPU): the composition, bitwise,
  # and the same gradients
  args = put(mesh, *inputs(jnp.bfloat16, seed=3))
  fused = shard(mesh, lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp", algorithm="fused"),
                 True)(*args)
  plain = shard(mesh, lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp"), True)(*args)
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


def test_fused_request_lowers_to_the_kernel_in_the_order_chain(mesh, monkeypatch):
  import re
  text = cuda_text(mesh, monkeypatch, hidden=64)
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
  assert "protocol = 1 : i32" in text  # ("fused": the measured choice, ll here)
  sites = [s for s in jaxll.recent_call_sites() if s.op == "sum+rmsnorm"]
  assert sites and sites[-1].algorithm == "fused_oneshot_ll"
  assert sites[-1].reason.endswith("one-shot ll exchange (measured choice)"), sites[-1].reason


@pytest.mark.parametrize("algorithm,code,path", [
    ("fused_ll", 1, "fused_oneshot_ll"), ("fused_sentinel", 2, "fused_oneshot_sentinel"),
    ("fused_twoshot_ll", 3, "fused_twoshot_ll"),
    ("fused_twoshot_sentinel", 4, "fused_twoshot_sentinel")])
def test_named_protocols_reach_the_kernel(mesh, monkeypatch, algorithm, code, path):
  from jaxll import algorithms
  assert algorithms.RMSNORM_PROTOCOL_CODES == {"ll": 1, "sentinel": 2, "twoshot_ll": 3,
                                               "twoshot_sentinel": 4}

  def body(x, r, w):
    return jaxll.all_reduce_rmsnorm(x, r, w, "tp", algorithm=algorithm)

  text = cuda_text(mesh, monkeypatch, hidden=64, body=body)
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
    cuda_text(mesh, monkeypatch, hidden=64, body=body, sentinel_serves=False)
  assert why in str(e.value) and algorithm in str(e.value)


@pytest.mark.parametrize("algorithm", ["fused_ll", "fused_sentinel", "fused_twoshot_ll",
                                       "fused_twoshot_sentinel"])
def test_named_protocols_take_the_composition_on_cpu(mesh, algorithm):
  args = put(mesh, *inputs(jnp.bfloat16, seed=6))
  got = shard(mesh, lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp", algorithm=algorithm),
               True)(*args)
  want = shard(mesh, lambda x, r, w: reference(x, r, w, 1e-6), True)(*args)
  for a, b in zip(got, want):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


def test_fused_request_with_an_odd_hidden_size_takes_the_composition(mesh, monkeypatch):
  # float32 x 63: 252 bytes per row, not a multiple of 8; the lowered text
  # (what jaxll.explain reads) says so, and what the composition's all-reduce ran
  from jaxll.call_sites import call_sites_in
  text = cuda_text(mesh, monkeypatch, hidden=63)
  assert "jaxll_all_reduce_rmsnorm" not in text and text.count("@jaxll_all_reduce(") == 2
  sites = call_sites_in(text)
  assert [(s.op, s.requested, s.algorithm) for s in sites] == [
      ("sum", "auto", "oneshot_ll"), ("sum+rmsnorm", "fused", "composed"),
      ("sum", "auto", "oneshot_ll")], sites
  assert sites[1].reason.startswith("the hidden size's bytes are not a multiple of 8; "), sites[1]


@pytest.mark.parametrize("hidden,fused", [(64, True), (12288, False)])
def test_auto_lowers_to_the_kernel_up_to_the_measured_size(mesh, monkeypatch, hidden, fused):
  # per rank: 3 x 64 float32 = 768 B (the kernel); 3 x 12288 = 144 KiB, above
  # the fused limit (the composition: two all-reduce calls, this one's and the body's)
  from jaxll import choice
  limit = choice.tuning("all_reduce_rmsnorm")["fused_max_bytes"]
  assert 3 * 64 * 4 <= limit < 3 * 12288 * 4

  def body(x, r, w):
    a, b = jaxll.all_reduce_rmsnorm(x, r, w, "tp")
    return a, jaxll.all_reduce(b, "tp")

  # (the fake plan: LL16 only, whose limit is the fused one)
  text = cuda_text(mesh, monkeypatch, hidden=hidden, body=body, sentinel_serves=False)
  assert ("jaxll_all_reduce_rmsnorm" in text) == fused
  assert text.count("@jaxll_all_reduce(") == (1 if fused else 2)
  # every kernel call carries the attribute XLA's record stage reads
  assert text.count("uses_pdl = true") == 2, text[-3000:]
  if fused:
    site = [s for s in jaxll.recent_call_sites() if s.op == "sum+rmsnorm"][-1]
    assert (site.requested, site.algorithm) == ("auto", "fused_oneshot_ll")
    assert site.reason.startswith(f"all_reduce_rmsnorm table: 768 bytes per rank, at most {limit} (measured faster "
                                  "than the composition for N=8"), site.reason


@pytest.mark.parametrize("group,fused", [(2, True), (8, False)])
def test_auto_takes_the_sentinel_kernel_up_to_its_own_limit(mesh, monkeypatch, group, fused):
  # 3 x 12288 float32 = 144 KiB per rank: above the fused limit, within the
  # sentinel exchange's for groups of 2: the kernel in a group of 2 where its
  # plan is on the sentinel exchange; not on LL16, not in a group of 8
  from jaxll import choice, placement
  from jaxll import rmsnorm as fused_mod
  t = choice.tuning("all_reduce_rmsnorm")
  assert t["fused_max_bytes"] < 3 * 12288 * 4 <= t["fused_sentinel_max_bytes"]["2"]
  assert "8" not in t["fused_sentinel_max_bytes"]
  body = lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp")
  text = cuda_text(mesh, monkeypatch, hidden=12288, body=body, sentinel_serves=False)
  assert "jaxll_all_reduce_rmsnorm" not in text  # (the fake plan: LL16 only)
  monkeypatch.setattr(fused_mod, "_kernel_plan", lambda *a: plan(protocol="sentinel"))
  monkeypatch.setattr(placement, "workspace_for", lambda ctx, axes: (7, group, ""))
  f = shard(mesh, body, True)
  x, residual, weight = inputs(np.float32, hidden=12288)
  text = f.trace(*put(mesh, x, residual, weight)).lower(lowering_platforms=("cuda",)).as_text()
  site = [s for s in jaxll.recent_call_sites() if s.op == "sum+rmsnorm"][-1]
  if fused:
    assert text.count("@jaxll_all_reduce_rmsnorm(") == 1 and "protocol = 2 : i32" in text
    assert (site.requested, site.algorithm) == ("auto", "fused_oneshot_sentinel")
    assert f"at most {t['fused_sentinel_max_bytes']['2']} (measured" in site.reason, site.reason
  else:
    assert "jaxll_all_reduce_rmsnorm" not in text
    assert site.algorithm == "composed" and "auto limit 131072 for N=8" in site.reason


@pytest.mark.parametrize("group,hidden,fused", [(8, 12288, True), (8, 32768, False),
                                                (4, 12288, False)])
def test_auto_takes_the_two_shot_kernel_up_to_its_own_limit(mesh, monkeypatch, group, hidden,
                                                            fused):
  # per rank 3 x 12288 float32 = 144 KiB, within the two-shot limit of groups
  # of 8; 3 x 32768 = 384 KiB, above it; a group of 4 has no two-shot limit
  # (the one-shot one of 128 KiB holds): the kernel only where the plan is two-shot
  from jaxll import choice, placement
  from jaxll import rmsnorm as fused_mod
  t = choice.tuning("all_reduce_rmsnorm")
  limit = t["fused_twoshot_max_bytes"]["8"]
  assert t["fused_max_bytes"] < 3 * 12288 * 4 <= limit < 3 * 32768 * 4
  assert "4" not in t["fused_twoshot_max_bytes"]
  assert choice.fused_auto_max_bytes(8, True, True) == limit
  assert choice.fused_auto_max_bytes(8, True) == t["fused_max_bytes"]
  monkeypatch.setattr(fused_mod, "_kernel_plan",
                      lambda *a: plan(protocol="sentinel", twoshot=True))
  monkeypatch.setattr(placement, "workspace_for", lambda ctx, axes: (7, group, ""))
  body = lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp")
  x, residual, weight = inputs(np.float32, hidden=hidden)
  text = shard(mesh, body, True).trace(*put(mesh, x, residual, weight)).lower(
      lowering_platforms=("cuda",)).as_text()
  site = [s for s in jaxll.recent_call_sites() if s.op == "sum+rmsnorm"][-1]
  if fused:
    assert text.count("@jaxll_all_reduce_rmsnorm(") == 1 and "protocol = 4 : i32" in text
    assert (site.requested, site.algorithm) == ("auto", "fused_twoshot_sentinel")
    assert f"at most {limit} (measured" in site.reason, site.reason
    assert site.reason.endswith("two-shot sentinel exchange (measured choice)"), site.reason
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
  args = put(mesh, x, r, w)

  def run(f):
    g = jax.jit(jax.shard_map(_vmapped(case, f), mesh=mesh, in_specs=(P("tp"), P(), P()),
                              out_specs=(P(), P()), check_vma=False))
    return [np.asarray(o) for o in g(*args)]

  got = run(lambda a, b, c: jaxll.all_reduce_rmsnorm(a, b, c, "tp", algorithm=algorithm))
  want = run(lambda a, b, c: reference(a, b, c, 1e-6))
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
  normed, new_residual = (np.asarray(o, np.float64) for o in g(*put(mesh, x, r, w)))
  h = x.astype(np.float64).reshape(8, 2, 3, 64).sum((0, 1))[None] + r
  want = h / np.sqrt(np.mean(h * h, -1, keepdims=True) + 1e-6) * w
  np.testing.assert_allclose(new_residual, h, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(normed, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch,fused", [(2, True), (64, False), (256, False)])
def test_auto_under_vmap_counts_the_batched_rows(mesh, monkeypatch, batch, fused):
  # 3 x 256 float32 = 3 KiB per vmapped call: 2 of them (6 KiB) stay on the
  # kernel, 64 (192 KiB) exceed the fused limit and take the composition
  # at lowering (the fake plan is LL16), 256 (768 KiB) exceed every group's
  # limit and take it in the batching rule
  from jaxll import rmsnorm as fused_mod
  from jaxll import placement
  monkeypatch.setattr(fused_mod, "_kernel_plan", lambda *a: plan(lean=False, blocks=4)
                      if a[-1] == "ll" else plan(blocks=0))
  monkeypatch.setattr(placement, "workspace_for", lambda ctx, axes: (7, 8, ""))
  monkeypatch.setattr(ALL_REDUCE, "decide", lambda ctx, aval, axes, op, requested:
                      ALL_REDUCE.Decision("oneshot_ll", "forced by the test", 7, 8))
  rng = np.random.default_rng(6)
  x = rng.standard_normal((8 * 3, batch, 256)).astype(np.float32)
  r = rng.standard_normal((3, batch, 256)).astype(np.float32)
  w = np.ones(256, np.float32)
  body = lambda x, r, w: jax.vmap(lambda a, b: jaxll.all_reduce_rmsnorm(a, b, w, "tp"),
                                  in_axes=1, out_axes=1)(x, r)
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp"), P(), P()),
                            out_specs=(P(), P()), check_vma=False))
  text = f.trace(*put(mesh, x, r, w)).lower(lowering_platforms=("cuda",)).as_text()
  assert ("jaxll_all_reduce_rmsnorm" in text) == fused
  assert ("@jaxll_all_reduce(" in text) == (not fused)
  site = jaxll.recent_call_sites()[-1]  # the kernel's, or the composition's all-reduce
  assert site.site.startswith("test_rmsnorm_cpu.py:") and "<lambda>" in site.site, site


@pytest.mark.parametrize("group,max_bytes", [(1, None), (8, "0")])
def test_auto_leaves_to_xla_what_all_reduce_auto_would(mesh, monkeypatch, group, max_bytes):
  # a group of one device, or JAXLL_AUTO_MAX_BYTES below the call: the
  # composition (its all-reduce then decides), not the fused kernel
  if max_bytes is not None:
    monkeypatch.setenv("JAXLL_AUTO_MAX_BYTES", max_bytes)
  from jaxll import placement
  monkeypatch.setattr(placement, "group_size", lambda ctx, axes: group)
  made = []  # (auto decides before it builds a workspace)
  monkeypatch.setattr(placement, "workspace_for",
                      lambda ctx, axes: made.append(axes) or (7, group, ""))
  x, residual, weight = inputs(np.float32, hidden=64)
  f = shard(mesh, lambda x, r, w: jaxll.all_reduce_rmsnorm(x, r, w, "tp"), True)
  text = f.trace(*put(mesh, x, residual, weight)).lower(lowering_platforms=("cuda",)).as_text()
  assert "jaxll_all_reduce_rmsnorm" not in text
  site = [s for s in jaxll.recent_call_sites() if s.op == "sum+rmsnorm"][-1]
  assert site.algorithm == "composed" and site.reason.startswith(
      ("group of one device: XLA elides the all-reduce", "768 bytes per rank > auto crossover 0 bytes")), site
  assert site.workspace == 0 and not made, made
