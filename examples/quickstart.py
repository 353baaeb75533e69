"""jaxll quickstart: an all-reduce inside jax.shard_map on whatever devices exist.

- Several CUDA GPUs: a mesh over all of them; jaxll's kernel serves small messages.
- One CUDA GPU: a one-device mesh (the call goes through jaxll's custom call when
  forced), plus N = 8 virtual ranks on that GPU through the same kernels.
- No GPU: 8 virtual CPU devices; every call lowers to XLA's all-reduce.

Two all-reduces (a float32 sum, then a bfloat16 max of it) are checked against
jax.lax.psum / pmax (and the virtual ranks' sum against numpy): a mismatch exits
with an error. It prints which path each call site took and says what it ran on.

  python examples/quickstart.py
"""

import os

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")  # one queue per virtual rank
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxll  # noqa: E402


def main():
  try:
    gpus = jax.devices("cuda")
  except RuntimeError:
    gpus = []
  devices = gpus if gpus else jax.devices("cpu")[:8]
  kind = f"{len(gpus)} x {gpus[0].device_kind}" if gpus else f"{len(devices)} virtual CPU devices"
  print(f"jaxll {jaxll.__version__} on {kind} (jax {jax.__version__})")

  mesh = jax.make_mesh((len(devices),), ("tp",), devices=devices)
  algorithm = "oneshot_ll" if len(gpus) == 1 else "auto"  # auto leaves 1 device to XLA

  def step(x):
    a = jaxll.all_reduce(x, "tp", algorithm=algorithm)           # 4 KB per device
    b = jaxll.all_reduce(a.astype(jnp.bfloat16), "tp", op="max")  # 2 KB per device
    return a, b

  def reference(x):
    a = jax.lax.psum(x, "tp")
    return a, jax.lax.pmax(a.astype(jnp.bfloat16), "tp")

  spec = dict(mesh=mesh, in_specs=P("tp"), out_specs=(P(), P()))
  f = jax.jit(jax.shard_map(step, **spec))
  g = jax.jit(jax.shard_map(reference, **spec))
  x = np.random.default_rng(0).standard_normal((len(devices) * 1024,)).astype(np.float32)
  x = jax.device_put(x, NamedSharding(mesh, P("tp")))
  (a, b), (ra, rb) = f(x), g(x)
  err = float(jnp.max(jnp.abs(a - ra)))
  b_equal = bool(jnp.array_equal(b, rb))
  print(f"all_reduce sum vs psum: max abs difference {err:.3g}; "
        f"max vs pmax equal: {b_equal}")
  # (the sum may differ from psum's in the last bits: jaxll adds in rank order)
  if not np.allclose(np.asarray(a), np.asarray(ra), rtol=1e-5, atol=1e-5) or not b_equal:
    raise SystemExit("quickstart: jaxll's all-reduce disagrees with psum / pmax")
  print("paths taken:")
  for site in jaxll.explain(f, x):
    print(f"  {site.site:28s} {site.op:3s} {site.shape:10s} {site.dtype:9s} -> "
          f"{site.algorithm} ({site.reason})")

  if gpus:
    from jaxll.tools import testing as jt
    n = 8
    rows = np.random.default_rng(1).standard_normal((n, 1024)).astype(np.float32)
    out = np.asarray(jt.virtual_all_reduce(rows))
    ok = np.allclose(out, rows.astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)
    same = bool((out.view(np.uint32) == out[:1].view(np.uint32)).all())
    t = sorted(jt.kernel_time_us(n, 4096, iters=200, reps=15))[7]
    print(f"{n} virtual ranks on {gpus[0].device_kind}: 4 KB f32 all-reduce correct: {ok}, "
          f"bitwise equal across ranks: {same}, kernel time {t:.2f} us/call (median)")
    if not (ok and same):
      raise SystemExit("quickstart: the virtual ranks' all-reduce is wrong")
  jaxll.check_errors()


if __name__ == "__main__":
  main()
