"""Expert-parallel mixture-of-experts decoding with jaxll: a stack of MoE
layers (a top-k router, SwiGLU experts sharded over a mesh axis, an RMSNorm and
a residual), a few tokens per rank, each layer's tokens dispatched to their
experts' ranks and the results combined back by two all-to-alls, as
expert-parallel decoding does. Random weights from a seed.

It times the jitted step (every layer, one decode step of the batch) with the
all-to-alls done by jax.lax.all_to_all and by jaxll.all_to_all, reports the
time per layer, and checks that both runs give the same bits (an all-to-all
moves bits: it adds nothing up).

  python examples/moe_decode.py                        # whatever devices exist
  python examples/moe_decode.py --experts 64 --topk 8 --hidden 2048 --tokens 8
  python examples/moe_decode.py --processes 4 ...      # 4 jax.distributed processes
                                                       # (sharing the GPU if there is one)

Devices: all local GPUs, or 8 CPU devices where there is none (every
all-to-all is then XLA's), or with --processes N, N local processes joined by
jax.distributed through jaxll.tools.launch. XLA's all-to-all (NCCL) cannot pair
processes that share one GPU, so there the XLA run is skipped and said so.

Dispatch with no dropped token: rank r sends rank j a buffer of (experts per
rank, tokens, hidden), slot t of expert e holding token t where the router chose
e for it and zeros elsewhere; the expert runs on every slot it got, and the
combine sends each slot back to the token's rank, which adds its top-k experts'
outputs with the router's weights.
"""

import argparse
import time

import example_utils as eu


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--experts", type=int, default=16, help="experts in all (a multiple of N)")
  p.add_argument("--topk", type=int, default=2)
  p.add_argument("--tokens", type=int, default=4, help="tokens per rank (the decode batch)")
  p.add_argument("--hidden", type=int, default=1024)
  p.add_argument("--ffn", type=int, default=1024, help="each expert's intermediate size")
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--steps", type=int, default=50, help="timed steps (median)")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
  p.add_argument("--seed", type=int, default=0)
  eu.add_common_args(p)
  return p.parse_args(argv)


def main(argv=None):
  return eu.main(parse(argv), run, print_report, __file__)


def run(opts):
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxll

  devices = jax.devices()
  n = len(devices)
  if opts.experts % n:
    raise SystemExit(f"--experts {opts.experts} must be a multiple of the {n} ranks")
  local, k, t, d, f = opts.experts // n, opts.topk, opts.tokens, opts.hidden, opts.ffn
  mesh = jax.make_mesh((n,), ("ep",), devices=devices)
  dtype = jnp.dtype(opts.dtype)
  rng = np.random.default_rng(opts.seed)

  def sharded(shape, scale):  # experts' weights: split over "ep" along dimension 1
    sharding = NamedSharding(mesh, P(None, "ep"))
    a = (rng.standard_normal(shape) * scale).astype(np.float32)
    return jax.make_array_from_callback(shape, sharding, lambda i: jnp.asarray(a[i], dtype))

  L = opts.layers
  params = {
      "router": eu.replicated(mesh, (rng.standard_normal((L, d, opts.experts)) / d ** 0.5)
                              .astype(np.float32)),
      "norm": eu.replicated(mesh, np.ones((L, d), np.float32)),
      "w_gate": sharded((L, opts.experts, d, f), d ** -0.5),
      "w_up": sharded((L, opts.experts, d, f), d ** -0.5),
      "w_down": sharded((L, opts.experts, f, d), f ** -0.5),
  }
  x_sharding = NamedSharding(mesh, P("ep"))
  x0 = rng.standard_normal((n * t, d)).astype(np.float32)
  x = jax.make_array_from_callback((n * t, d), x_sharding, lambda i: jnp.asarray(x0[i], dtype))

  def make_step(all_to_all):
    def layer(h, p):
      norm = h.astype(jnp.float32)
      norm = norm * jax.lax.rsqrt(jnp.mean(norm * norm, -1, keepdims=True) + 1e-6) * p["norm"]
      logits = norm @ p["router"]                                    # (t, experts)
      top, chosen = jax.lax.top_k(logits, k)
      gates = jax.nn.softmax(top, -1)                                # (t, k)
      weight = jnp.zeros((t, opts.experts)).at[jnp.arange(t)[:, None], chosen].set(gates)
      picked = (weight > 0).T.reshape(n, local, t, 1)                # (rank, expert, token)
      send = jnp.where(picked, norm.astype(dtype)[None, None], 0)    # (n, local, t, d)
      got = all_to_all(send, "ep", 0, 0, tiled=True)                 # [source rank, ...]
      a = got.reshape(n, local, t, d).transpose(1, 0, 2, 3).reshape(local, n * t, d)
      hid = jax.nn.silu(jnp.einsum("etd,edf->etf", a, p["w_gate"])) * jnp.einsum(
          "etd,edf->etf", a, p["w_up"])
      out = jnp.einsum("etf,efd->etd", hid.astype(dtype), p["w_down"])
      out = out.reshape(local, n, t, d).transpose(1, 0, 2, 3)        # [source rank, ...]
      back = all_to_all(out, "ep", 0, 0, tiled=True)                 # [expert's rank, ...]
      combined = jnp.einsum("jetd,tje->td", back.astype(jnp.float32),
                            weight.reshape(t, n, local))
      return h + combined.astype(h.dtype), None

    def body(h, params):
      h, _ = jax.lax.scan(layer, h, params)  # (each rank holds its experts of every layer)
      return h

    specs = {"router": P(), "norm": P(), "w_gate": P(None, "ep"), "w_up": P(None, "ep"),
             "w_down": P(None, "ep")}
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("ep"), specs),
                                 out_specs=P("ep")))

  runs = {"xla": jax.lax.all_to_all, "jaxll": jaxll.all_to_all}
  wanted = ["xla", "jaxll"] if opts.collective == "both" else (
      ["xla"] if opts.collective == "psum" else ["jaxll"])
  report = {"ran_on": eu.describe(opts, devices), "ranks": n, "experts": opts.experts,
            "topk": k, "tokens_per_rank": t, "hidden": d, "ffn": f, "layers": L,
            "dtype": opts.dtype, "bytes_per_peer": local * t * d * dtype.itemsize,
            "runs": {}, "skipped": {}}
  outputs = {}
  for name in wanted:
    if name == "xla" and eu.psum_unavailable(opts):
      report["skipped"]["xla"] = eu.psum_unavailable(opts).replace("all-reduce", "all-to-all")
      continue
    step = make_step(runs[name])
    compiled = step.lower(x, params).compile()
    eu.line_up(opts)
    y = compiled(x, params)
    jax.block_until_ready(y)
    times = []
    for _ in range(opts.steps):
      t0 = time.perf_counter()
      y = compiled(x, params)
      jax.block_until_ready(y)
      times.append(time.perf_counter() - t0)
    step_s = float(np.median(times))
    sites = jaxll.explain(step, x, params) if name == "jaxll" else []
    report["runs"][name] = {"us_per_step": step_s * 1e6, "us_per_layer": step_s * 1e6 / L,
                            "paths": sorted({s.algorithm for s in sites}) if sites
                            else ["xla (jax.lax.all_to_all)"],
                            "call_sites": len(sites)}
    outputs[name] = np.asarray(y.addressable_data(0)).astype(np.float32)
  if len(outputs) == 2:
    report["same_output"] = bool(np.array_equal(outputs["xla"], outputs["jaxll"]))
  return report


def print_report(r):
  print(f"moe_decode: {r['layers']} layers, {r['experts']} experts top-{r['topk']}, "
        f"{r['tokens_per_rank']} tokens per rank, hidden {r['hidden']}, ffn {r['ffn']}, "
        f"{r['dtype']}; {r['bytes_per_peer']} B per peer per all-to-all; ran on {r['ran_on']}")
  for name, run in r["runs"].items():
    print(f"  {name:6s} {run['us_per_layer']:.1f} us per layer ({run['us_per_step']:.1f} us "
          f"per step); all-to-alls: {', '.join(run['paths'])}")
  for name, why in r["skipped"].items():
    print(f"  {name:6s} skipped: {why}")
  if "same_output" in r:
    print(f"  same output (xla, jaxll): {'yes' if r['same_output'] else 'NO'}")


if __name__ == "__main__":
  main()
