"""GPU tier: the determinism contract (docs/determinism.md). Results must be the
same bits whatever the kernel, the message size and its rounds, the fused
kernel's exchange, cut and token count, and whether ranks are virtual ranks of
one launch or processes; and, for sums, numpy's rank-order float32 sum.
Marked ``gpu``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jaxll
from jaxll.tools import launch
from jaxll.tools import testing as jt
from mp_checks import (DETERMINISM_COUNTS, DETERMINISM_ROWS, DETERMINISM_SCRIPT,
                       DETERMINISM_TOKENS, GPU_ENV, TIMEOUT, determinism_inputs)

pytestmark = pytest.mark.gpu

KERNELS = ("oneshot_ll", "oneshot_sentinel", "twoshot_ll", "twoshot_sentinel")
EXCHANGES = ("auto", "ll", "sentinel", "twoshot_ll", "twoshot_sentinel")


def _bits(a):
  a = np.asarray(a)
  return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _rank_order(x, op):
  """numpy's rank-order reduction of x's rows in float32, rounded once."""
  acc = x[0].astype(np.float32)
  for row in x[1:]:
    v = row.astype(np.float32)
    acc = acc + v if op == "sum" else (np.maximum(acc, v) if op == "max" else np.minimum(acc, v))
  return acc.astype(x.dtype)


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("bfloat16", "sum"),
                                      ("float16", "sum"), ("float32", "max"),
                                      ("bfloat16", "min")])
def test_all_reduce_bits_whatever_the_kernel_size_and_rounds(n, dtype, op):
  # the first 1,024 elements (and every prefix) alone and inside longer
  # messages, on every reproducible kernel, with the default scratch and with
  # 2 KiB rounds: one set of bits, numpy's rank-order reduction
  big = determinism_inputs((n, DETERMINISM_COUNTS[-1]), dtype, seed=n)
  reference = _rank_order(big, op)
  want = _bits(reference)
  if op != "sum":  # (the sign of a zero max/min is the kernels' rule: the first one's)
    first = jt.virtual_all_reduce(jnp.asarray(big), op=op, algorithm=KERNELS[0])
    np.testing.assert_array_equal(np.asarray(first[0], np.float32), reference.astype(np.float32))
    want = _bits(first[0])
  small = jaxll.WorkspaceConfig(scratch_bytes=2048)
  for count in DETERMINISM_COUNTS:
    x = jnp.asarray(big[:, :count])
    for algorithm in KERNELS:
      for config in (None, small):
        if config is small and count > 65536:
          continue  # (hundreds of rounds: slow, and 65,536 already takes 256)
        out = _bits(jt.virtual_all_reduce(x, op=op, algorithm=algorithm, config=config))
        for r in range(n):
          np.testing.assert_array_equal(out[r], want[:count], err_msg=f"{algorithm} {count} "
                                        f"scratch={config and config.scratch_bytes} rank {r}")


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("hidden,dtype", [(16384, "bfloat16"), (8192, "bfloat16"),
                                          (5120, "bfloat16"), (4096, "float16"),
                                          (2048, "float32"), (1028, "bfloat16"),
                                          (1030, "float32")])
def test_fused_rows_whatever_the_token_count_exchange_and_cut(n, hidden, dtype):
  # token t's normed and new_residual rows: the same bits at 1 to 256 tokens,
  # on every exchange that serves the call and with 2 KiB rounds (the general
  # kernel), however the call is cut (segments, clusters, row-waves, two-shot)
  most = 256
  x = determinism_inputs((n, most, hidden), dtype, seed=hidden + n)
  residual = determinism_inputs((most, hidden), dtype, seed=hidden + n + 1)
  weight = (1 + 0.1 * np.random.default_rng(hidden).standard_normal(hidden)).astype(x.dtype)
  ref_normed, ref_new = jt.virtual_all_reduce_rmsnorm(x, residual, weight, eps=1e-5)
  ref_normed, ref_new = _bits(ref_normed[0]), _bits(ref_new[0])
  small = jaxll.WorkspaceConfig(scratch_bytes=2048)
  cuts = set()
  for tokens in (1, 2, 3, 8, 16, 33, 64, 100, 256):
    for exchange in EXCHANGES:
      for config in (None, small) if exchange in ("auto", "ll") else (None,):
        plan = jt.rmsnorm_plan(n, tokens, hidden, dtype=dtype, protocol=exchange, config=config)
        if not plan["blocks"]:
          continue  # (that exchange cannot serve this call)
        cuts.add(tuple(plan[k] for k in ("exchange", "segments", "rows_at_once", "cluster",
                                         "lean", "twoshot", "units", "threads")))
        normed, new = jt.virtual_all_reduce_rmsnorm(x[:, :tokens], residual[:tokens], weight,
                                                    eps=1e-5, protocol=exchange, config=config)
        what = (f"{tokens} tokens, {exchange}, scratch={config and config.scratch_bytes}, "
                f"plan {plan}")
        for r in range(n):
          np.testing.assert_array_equal(_bits(new[r]), ref_new[:tokens], err_msg=what)
          np.testing.assert_array_equal(_bits(normed[r]), ref_normed[:tokens], err_msg=what)
  assert len(cuts) >= 6, cuts  # (the calls above must cut rows in many ways)


def test_one_device_group():
  # a group of one device: the all-reduce is the input on every path (XLA's);
  # the fused call takes the kernel on a workspace of one rank, the same bits
  # as a virtual rank's
  mesh = jax.make_mesh((1,), ("tp",))
  x = determinism_inputs((64, 1024), "bfloat16", seed=1)
  residual = determinism_inputs((64, 1024), "bfloat16", seed=2)
  weight = np.ones(1024, x.dtype)
  x = jax.device_put(x, jax.sharding.NamedSharding(mesh, P("tp")))
  f = jax.jit(jax.shard_map(
      lambda a, r, w: (jaxll.all_reduce(a, "tp", deterministic=True),
                       *jaxll.all_reduce_rmsnorm(a, r, w, "tp", eps=1e-5, deterministic=True)),
      mesh=mesh, in_specs=(P("tp"), P(), P()), out_specs=(P(), P(), P())))
  paths = {s.op: (s.algorithm, s.reason) for s in jaxll.explain(f, x, residual, weight)}
  assert paths["sum+rmsnorm"][0].startswith("fused_"), paths
  assert "group of one" in paths["sum"][1], paths
  total, normed, new = f(x, residual, weight)
  x = np.asarray(x)
  np.testing.assert_array_equal(_bits(total), _bits(x))
  want_normed, want_new = jt.virtual_all_reduce_rmsnorm(x[None], residual, weight, eps=1e-5)
  np.testing.assert_array_equal(_bits(normed), _bits(want_normed[0]))
  np.testing.assert_array_equal(_bits(new), _bits(want_new[0]))


@pytest.mark.parametrize("n", [2, 4])
def test_processes_give_the_bits_of_virtual_ranks(n, mps):
  # tests/mp_scripts/determinism_check.py in n processes on the one GPU, auto's
  # crossover to XLA as shipped: every call a kernel in deterministic mode, and
  # every result the bits the same call gives on n virtual ranks
  import hashlib

  def digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()

  workers = launch.run(DETERMINISM_SCRIPT, n, timeout=TIMEOUT, env=GPU_ENV, mps=mps,
                       devices=["0"] * n)
  for w in workers:
    assert not w.result["errors"], (w.process_id, w.result["errors"])
    assert w.result["digests"] == workers[0].result["digests"], w.process_id
  got, paths = workers[0].result["digests"], workers[0].result["paths"]
  largest = f"all_reduce {DETERMINISM_COUNTS[-1]} auto"
  assert "above auto's crossover" in paths[largest][0][2], paths[largest]
  for count in DETERMINISM_COUNTS:
    full = determinism_inputs((n, count), "float32", seed=count)
    for algorithm in ("auto",) + KERNELS:
      name = f"all_reduce {count} {algorithm}"
      kernel = paths[name][0][1]
      assert got[name] == digest(np.asarray(jt.virtual_all_reduce(
          jnp.asarray(full), algorithm=kernel))[0]), name
  most = max(DETERMINISM_TOKENS)
  for hidden, dtype in DETERMINISM_ROWS:
    x_all = determinism_inputs((n, most, hidden), dtype, seed=hidden)
    residual_all = determinism_inputs((most, hidden), dtype, seed=hidden + 1)
    weight = (1 + 0.1 * np.random.default_rng(hidden).standard_normal(hidden)).astype(
        x_all.dtype)
    for tokens in DETERMINISM_TOKENS:
      normed, new = jt.virtual_all_reduce_rmsnorm(x_all[:, :tokens], residual_all[:tokens],
                                                  weight, eps=1e-5)
      name = f"rmsnorm {hidden} {dtype} {tokens}"
      assert got[name] == [digest(normed[0]), digest(new[0])], (name, paths[name])
  print(f"\nN={n}: {len(got)} results, paths "
        f"{sorted({p[1] for v in paths.values() for p in v})}")
