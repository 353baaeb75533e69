"""Tensor-parallel LLM decoding with jaxll: a Llama-style decoder (RMSNorm,
rotary attention with grouped KV heads, SwiGLU MLP, KV cache), its attention
heads and MLP columns split over a mesh axis inside jax.shard_map, two
all-reduces per layer, greedy decoding one token per jitted step. Random weights
from a seed.

It measures inter-token latency (ITL: wall time per generated token, each step
synchronized as a server streaming tokens would) with the all-reduces done by
jax.lax.psum and by jaxll.all_reduce, and checks that both produce the same
tokens for the same prompt. With --fused, a third run does each all-reduce and
the residual add and RMSNorm after it with jaxll.all_reduce_rmsnorm(...,
algorithm="fused") (one kernel where it can serve; the model's RMSNorm rounds as
that op does, so the runs should give the same tokens: the kernel adds a row's
squares in another order, so in bfloat16 a near-tie may still flip a token, which
the report shows as the first difference).

  python examples/tp_decode.py                       # tiny model, whatever devices exist
  python examples/tp_decode.py --shape 8b --layers 4 --batch 8 --context 8192
  python examples/tp_decode.py --processes 4 ...     # 4 jax.distributed processes
                                                     # (sharing the GPU if there is one)

Devices: all local GPUs, or 8 CPU devices where there is none (every
all-reduce is then XLA's), or with --processes N, N local processes joined by
jax.distributed through jaxll.tools.launch (one GPU each if there are N, else all on
GPU 0 under CUDA MPS). XLA's all-reduce (NCCL) cannot pair processes that
share one GPU, so there the psum run is skipped and said so.
"""

import argparse
import time

import example_utils as eu

SHAPES = {
    # name: (hidden, heads, kv_heads, head_dim, ffn, vocab, default layers)
    "tiny": (256, 8, 8, 32, 512, 512, 2),
    "8b": (4096, 32, 8, 128, 14336, 128256, 4),     # Llama-3-8B layer shapes
    "70b": (8192, 64, 8, 128, 28672, 128256, 2),    # Llama-3-70B layer shapes
}


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--shape", choices=SHAPES, default="tiny")
  p.add_argument("--layers", type=int, default=None, help="default: the shape's")
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--context", type=int, default=256, help="KV cache length")
  p.add_argument("--prompt", type=int, default=16, help="prompt tokens")
  p.add_argument("--tokens", type=int, default=32, help="tokens to generate")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                 help="default: float32 for tiny, bfloat16 otherwise")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--fused", action="store_true",
                 help="also run jaxll with the fused all-reduce + residual + RMSNorm kernel")
  p.add_argument("--profile", action="store_true",
                 help="also trace 8 decode steps per run (JAX's profiler, process 0): device "
                      "time per step in collective kernels and in all kernels")
  p.add_argument("--baseline", action="store_true",
                 help="also time the step with its all-reduces left out (wrong tokens, for "
                      "timing only): the all-reduce share of a step by difference")
  eu.add_common_args(p)
  opts = p.parse_args(argv)
  opts.layers = opts.layers or SHAPES[opts.shape][6]
  opts.dtype = opts.dtype or ("float32" if opts.shape == "tiny" else "bfloat16")
  if opts.prompt < 1 or opts.tokens < 2 or opts.prompt + opts.tokens > opts.context:
    p.error("need prompt >= 1, tokens >= 2 and prompt + tokens <= context")
  return opts


def main(argv=None):
  return eu.main(parse(argv), run, print_report, __file__)


# --- the model ------------------------------------------------------------------------------

class Decoder:
  """The model on a one-axis ("tp") mesh over `devices`: its sharded weights, a
  fresh KV cache and a jitted decode step for a given all-reduce."""

  def __init__(self, opts, devices):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    self.n = n = len(devices)
    self.mesh = jax.make_mesh((n,), ("tp",), devices=devices)
    hidden, heads, kv_heads, head_dim, ffn, self.vocab, _ = SHAPES[opts.shape]
    if heads % n or kv_heads % n or ffn % n:
      raise SystemExit(f"{n} ranks must divide heads ({heads}), KV heads ({kv_heads}) and "
                       f"the MLP width ({ffn})")
    self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
    self.dtype = jnp.dtype(opts.dtype)
    L, self.B, self.C = opts.layers, opts.batch, opts.context
    self.eps = 1e-5
    self.specs = {
        "embed": P(), "norm1": P(), "norm2": P(), "norm_f": P(),
        "wq": P(None, None, "tp"), "wk": P(None, None, "tp"), "wv": P(None, None, "tp"),
        "wo": P(None, "tp", None),
        "w1": P(None, None, "tp"), "w3": P(None, None, "tp"), "w2": P(None, "tp", None),
    }
    self.shapes = {
        "embed": (self.vocab, hidden), "norm1": (L, hidden), "norm2": (L, hidden),
        "norm_f": (hidden,), "wq": (L, hidden, heads * head_dim),
        "wk": (L, hidden, kv_heads * head_dim), "wv": (L, hidden, kv_heads * head_dim),
        "wo": (L, heads * head_dim, hidden), "w1": (L, hidden, ffn), "w3": (L, hidden, ffn),
        "w2": (L, ffn, hidden),
    }
    self.cache_spec = P(None, None, None, "tp", None)  # [layer, batch, position, kv head, dim]
    cache_shape = (L, self.B, self.C, kv_heads, head_dim)
    shardings = {k: NamedSharding(self.mesh, s) for k, s in self.specs.items()}
    self.params = jax.jit(self._init_params, out_shardings=shardings)(jax.random.key(opts.seed))
    cache_sharding = NamedSharding(self.mesh, self.cache_spec)
    self.new_cache = jax.jit(
        lambda: (jnp.zeros(cache_shape, self.dtype), jnp.zeros(cache_shape, self.dtype)),
        out_shardings=(cache_sharding, cache_sharding))

  def _init_params(self, key):
    import jax
    import jax.numpy as jnp
    out = {}
    for i, name in enumerate(sorted(self.shapes)):
      shape = self.shapes[name]
      if name.startswith("norm"):
        out[name] = jnp.ones(shape, self.dtype)
      else:
        scale = 1.0 if name == "embed" else shape[-2] ** -0.5
        out[name] = (jax.random.normal(jax.random.fold_in(key, i), shape, jnp.float32)
                     * scale).astype(self.dtype)
    return out

  def replicated(self, a):
    return eu.replicated(self.mesh, a)

  def rmsnorm(self, x, w):  # the rounding of jaxll.all_reduce_rmsnorm: normalize, round, scale
    import jax
    import jax.numpy as jnp
    info = jnp.finfo(self.dtype)
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    # (reduce_precision: a round trip through the dtype that XLA keeps)
    h = jax.lax.reduce_precision(x32, exponent_bits=info.nexp, mantissa_bits=info.nmant)
    return (h * w.astype(jnp.float32)).astype(self.dtype)

  def rotary(self, x, pos):  # x: [batch, heads, dim]
    import jax.numpy as jnp
    half = self.head_dim // 2
    freq = 500000.0 ** (-jnp.arange(half, dtype=jnp.float32) / half)
    ang = pos.astype(jnp.float32) * freq
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    a, b = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([a * cos - b * sin, a * sin + b * cos], -1).astype(self.dtype)

  def attention(self, h, wq, wk, wv, kc, vc, pos):
    import jax
    import jax.numpy as jnp
    B, C, d, dtype = self.B, self.C, self.head_dim, self.dtype
    hq, hkv = self.heads // self.n, self.kv_heads // self.n  # this rank's heads
    q = self.rotary((h @ wq).reshape(B, hq, d), pos)
    k = self.rotary((h @ wk).reshape(B, hkv, d), pos)
    v = (h @ wv).reshape(B, hkv, d)
    kc = jax.lax.dynamic_update_slice(kc, k[:, None], (0, pos, 0, 0))
    vc = jax.lax.dynamic_update_slice(vc, v[:, None], (0, pos, 0, 0))
    s = jnp.einsum("bhgd,bchd->bhgc", q.reshape(B, hkv, hq // hkv, d), kc,
                   preferred_element_type=jnp.float32) * d ** -0.5
    s = jnp.where(jnp.arange(C) <= pos, s, -jnp.inf)
    a = jnp.einsum("bhgc,bchd->bhgd", jax.nn.softmax(s, axis=-1).astype(dtype), vc)
    return a.reshape(B, hq * d), kc, vc

  @staticmethod
  def mlp(h, w1, w3, w2):
    import jax
    return (jax.nn.silu(h @ w1) * (h @ w3)) @ w2            # SwiGLU, columns split

  def layers(self, p, x, k_cache, v_cache, pos, reduce):
    """The layers with `reduce` as the all-reduce; returns the final norm's output."""
    import jax

    def layer(x, xs):
      norm1, norm2, wq, wk, wv, wo, w1, w3, w2, kc, vc = xs
      a, kc, vc = self.attention(self.rmsnorm(x, norm1), wq, wk, wv, kc, vc, pos)
      x = x + reduce(a @ wo)                                # all-reduce 1: attention out
      return x + reduce(self.mlp(self.rmsnorm(x, norm2), w1, w3, w2)), (kc, vc)  # 2: MLP out

    xs = (p["norm1"], p["norm2"], p["wq"], p["wk"], p["wv"], p["wo"], p["w1"], p["w3"],
          p["w2"], k_cache, v_cache)
    x, (k_cache, v_cache) = jax.lax.scan(layer, x, xs)
    return self.rmsnorm(x, p["norm_f"]), k_cache, v_cache

  def fused_layers(self, p, x, k_cache, v_cache, pos):
    """The layers with each all-reduce, the residual add and the norm after it
    as one jaxll.all_reduce_rmsnorm: the attention one gives this layer's norm2,
    the MLP one the next layer's norm1 (the final norm after the last layer), so
    the scan carries (x, normed x)."""
    import jax
    import jax.numpy as jnp

    import jaxll

    def add_norm(v, x, w):
      return jaxll.all_reduce_rmsnorm(v, x, w, "tp", eps=self.eps, algorithm="fused")

    def layer(carry, xs):
      x, h = carry
      norm2, next_norm, wq, wk, wv, wo, w1, w3, w2, kc, vc = xs
      a, kc, vc = self.attention(h, wq, wk, wv, kc, vc, pos)
      h, x = add_norm(a @ wo, x, norm2)                     # all-reduce 1 + norm2
      h, x = add_norm(self.mlp(h, w1, w3, w2), x, next_norm)  # all-reduce 2 + next norm
      return (x, h), (kc, vc)

    next_norm = jnp.concatenate([p["norm1"][1:], p["norm_f"][None]])
    xs = (p["norm2"], next_norm, p["wq"], p["wk"], p["wv"], p["wo"], p["w1"], p["w3"],
          p["w2"], k_cache, v_cache)
    first = self.rmsnorm(x, p["norm1"][0])
    (x, h), (k_cache, v_cache) = jax.lax.scan(layer, (x, first), xs)
    return h, k_cache, v_cache

  def make_step(self, reduce, check_vma=True, fused=False):
    """The jitted decode step: next token, caches, position + 1. reduce: the
    all-reduce; fused: the layers on jaxll.all_reduce_rmsnorm instead."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def step(p, k_cache, v_cache, tok, pos):
      x = p["embed"][tok]                                   # [B, hidden], replicated
      if fused:
        h, k_cache, v_cache = self.fused_layers(p, x, k_cache, v_cache, pos)
      else:
        h, k_cache, v_cache = self.layers(p, x, k_cache, v_cache, pos, reduce)
      logits = h @ p["embed"].T                              # tied LM head, replicated
      return jnp.argmax(logits, axis=-1).astype(jnp.int32), k_cache, v_cache, pos + 1

    cache = self.cache_spec
    body = jax.shard_map(step, mesh=self.mesh,
                         in_specs=(self.specs, cache, cache, P(), P()),
                         out_specs=(P(), cache, cache, P()), check_vma=check_vma)
    return jax.jit(body, donate_argnums=(1, 2))


# --- the runs -------------------------------------------------------------------------------

def generate(model, step, prompt_arrays, tokens):
  """Prefills the prompt one token per step, then generates `tokens` tokens,
  each step synchronized; returns the tokens [batch, tokens] and the seconds
  per generated token."""
  import numpy as np
  k_cache, v_cache = model.new_cache()
  pos = model.replicated(np.int32(0))
  for tok in prompt_arrays:
    nxt, k_cache, v_cache, pos = step(model.params, k_cache, v_cache, tok, pos)
  out, itl = [], []
  for _ in range(tokens):
    t0 = time.perf_counter()
    nxt, k_cache, v_cache, pos = step(model.params, k_cache, v_cache, nxt, pos)
    nxt.block_until_ready()
    itl.append(time.perf_counter() - t0)
    out.append(np.asarray(nxt.addressable_data(0)))
  return np.stack(out, 1), itl


def profile_steps(model, step, first_token, opts, steps=8):
  """Device time per decode step: in collective kernels (jaxll's, NCCL's) and
  in all kernels; None where the trace has no GPU kernels (CPU)."""
  import os

  import jax
  import numpy as np

  from jaxll.tools import profile as kernel_profile

  caches = jax.block_until_ready(model.new_cache())  # (their zero fill is not traced)

  def work():
    # Every process runs the steps; process 0 traces them. The line-up is
    # inside, after the profiler started, so that its start-up does not eat
    # into the other processes' wait bound.
    eu.line_up(opts)
    k_cache, v_cache = caches
    tok, pos = first_token, model.replicated(np.int32(0))
    for _ in range(steps):
      tok, k_cache, v_cache, pos = step(model.params, k_cache, v_cache, tok, pos)
    tok.block_until_ready()

  if jax.process_index() != 0:
    work()
    return None
  times = kernel_profile.kernel_times(work, f"/tmp/tp_decode_trace_{os.getpid()}")
  if not times:
    return None
  coll, total = kernel_profile.split(times)
  return {"collective_kernel_us_per_step": coll / steps, "kernel_us_per_step": total / steps}


def measure(model, name, opts, prompt_arrays):
  """One run (psum, jaxll, jaxll_fused or none): its report entry and tokens."""
  import jax
  import numpy as np

  import jaxll
  reductions = {"psum": lambda v: jax.lax.psum(v, "tp"),
                "jaxll": lambda v: jaxll.all_reduce(v, "tp"),
                "none": lambda v: v}  # (each rank's partial sum: timing only)
  # (the baseline leaves partial sums unreduced, which check_vma would reject)
  step = model.make_step(reductions.get(name), check_vma=name != "none",
                         fused=name == "jaxll_fused")
  args = (model.params, *model.new_cache(), prompt_arrays[0], model.replicated(np.int32(0)))
  sites = jaxll.explain(step, *args) if name.startswith("jaxll") else []
  compiled = step.lower(*args).compile()
  eu.line_up(opts)                                         # every process compiled
  tokens, itl = generate(model, compiled, prompt_arrays, opts.tokens)
  steady = np.asarray(itl[1:]) * 1e3  # the first generated token's step is excluded
  entry = {
      "itl_ms_median": float(np.median(steady)), "itl_ms_p90": float(np.percentile(steady, 90)),
      "tokens_per_s": float(model.B / np.median(steady) * 1e3),
      "paths": (sorted({s.algorithm for s in sites}) if sites else
                ["none (baseline)"] if name == "none" else ["xla (psum)"]),
      "call_sites": len({s.site for s in sites})}  # (a composed fused call lists its all-reduce too)
  if opts.profile:
    entry["profile"] = profile_steps(model, compiled, prompt_arrays[0], opts)
  return entry, tokens


def compare_tokens(outputs):
  """Every run's tokens against the first run's."""
  import numpy as np
  ref = outputs[next(iter(outputs))]
  differ = [(ref != out).any(0) for out in outputs.values()]
  same = not any(d.any() for d in differ)
  return {"same_tokens": same,
          "first_different_token": (None if same else
                                    int(min(np.argmax(d) for d in differ if d.any())))}


def run(opts):
  import jax
  import numpy as np

  devices = jax.devices()
  model = Decoder(opts, devices)
  prompt = np.random.default_rng(opts.seed).integers(0, model.vocab, size=(opts.prompt, opts.batch),
                                                     dtype=np.int32)
  prompt_arrays = [model.replicated(t) for t in prompt]
  wanted = ["psum", "jaxll"] if opts.collective == "both" else [opts.collective]
  wanted += ["jaxll_fused"] if opts.fused and opts.collective != "psum" else []
  wanted += ["none"] if opts.baseline else []
  report = {"ran_on": eu.describe(opts, devices), "shape": opts.shape, "layers": opts.layers,
            "batch": opts.batch, "context": opts.context, "dtype": opts.dtype,
            "tokens": opts.tokens, "runs": {}, "skipped": {}}
  outputs = {}
  for name in wanted:
    if name == "psum" and eu.psum_unavailable(opts):
      report["skipped"]["psum"] = eu.psum_unavailable(opts)
      continue
    report["runs"][name], tokens = measure(model, name, opts, prompt_arrays)
    if name != "none":
      outputs[name] = tokens
  if "none" in report["runs"]:
    base = report["runs"]["none"]["itl_ms_median"]
    for name, entry in report["runs"].items():
      if name != "none":
        entry["all_reduce_share"] = max(0.0, 1 - base / entry["itl_ms_median"])
  if len(outputs) >= 2:
    report.update(compare_tokens(outputs))
  report["tokens_sample"] = outputs[next(iter(outputs))][0, :8].tolist() if outputs else []
  return report


def ran_kernels(entry) -> bool:
  """Whether a run's all-reduces ran any jaxll kernel (not XLA's all-reduce alone)."""
  return bool(set(entry["paths"]) - {"xla", "xla (psum)", "composed", "none (baseline)"})


def print_report(r):
  print(f"tp_decode: {r['shape']} shape, {r['layers']} layers, batch {r['batch']}, "
        f"context {r['context']}, {r['dtype']}, {r['tokens']} tokens; ran on {r['ran_on']}")
  for name, run in r["runs"].items():
    print(f"  {name:6s} ITL median {run['itl_ms_median']:.3f} ms, p90 {run['itl_ms_p90']:.3f} ms, "
          f"{run['tokens_per_s']:.1f} tokens/s; all-reduce paths: {', '.join(run['paths'])}"
          + (f" ({run['call_sites']} call sites)" if run["call_sites"] else "")
          + (f"; all-reduce share of a step {run['all_reduce_share']:.0%}"
             if "all_reduce_share" in run else ""))
  for name, run in r["runs"].items():
    if "profile" in run:
      p = run["profile"]
      print(f"  {name:6s} profile: " + ("no GPU kernels traced" if p is None else
            f"collective kernels {p['collective_kernel_us_per_step']:.1f} us of "
            f"{p['kernel_us_per_step']:.1f} us kernel time per step "
            f"({p['collective_kernel_us_per_step'] / max(p['kernel_us_per_step'], 1e-9):.0%})"))
  for name, why in r["skipped"].items():
    print(f"  {name:6s} skipped: {why}")
  runs = [k for k in ("psum", "jaxll", "jaxll_fused") if k in r["runs"]]
  for base, other in (("psum", "jaxll"), ("psum", "jaxll_fused"), ("jaxll", "jaxll_fused")):
    if base in r["runs"] and other in r["runs"]:
      if not ran_kernels(r["runs"][other]):
        print(f"  {other} vs {base}: both on XLA's all-reduce here (no jaxll kernel ran), "
              "so no speedup to report")
        continue
      a, b = r["runs"][base]["itl_ms_median"], r["runs"][other]["itl_ms_median"]
      print(f"  {other} vs {base}: {a - b:+.3f} ms per token ({a / b:.2f}x)")
  if len(runs) >= 2:
    print(f"  same tokens ({', '.join(runs)}): "
          + ("yes" if r["same_tokens"] else f"no (first difference at token {r['first_different_token']})"))


if __name__ == "__main__":
  main()
