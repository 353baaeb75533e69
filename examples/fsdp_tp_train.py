"""Training with FSDP and tensor parallelism, its collectives written with
jax.lax and routed through jaxll: a small decoder-only language model (RMSNorm,
causal attention, GELU MLP, an MLP head) on a ("fsdp", "tp") mesh, one
jax.shard_map around the whole step: loss, jax.grad and an AdamW (or SGD)
update. The layers run in a jax.lax.scan, their body under jax.checkpoint
(rematerialized in the backward pass). Random tokens from a seed; the same
batch every step, so the loss falls as the model learns it.

Collectives, all written with jax.lax (the step is jax.jit(jaxll.route(step))):
- FSDP: every weight is stored sharded over "fsdp" and all-gathered (tiled)
  where it is used, along dimension 0 (norm scales, the column-parallel
  matrices [hidden, ffn]), 1 (the QKV projection [3, hidden, heads, head_dim])
  or the last (the attention output [heads, head_dim, hidden], the
  row-parallel matrices [ffn, hidden] and [ffn, vocab], the embedding). The
  backward of each gather is a psum_scatter of the gradient along the same
  dimension.
- Tensor parallelism with sequence parallelism between blocks (Megatron's):
  the residual stream [batch, seq, hidden] is split along seq over "tp"; each
  block all-gathers its normed input along seq (dimension 1), runs its heads or
  MLP columns split over "tp", and psum_scatters the row-parallel output back
  along seq. The head runs on the whole sequence and psums its row-parallel
  output over "tp" (logits, for the loss).
- Autodiff adds psums over "tp" for the gradients of weights replicated over it
  (norm scales, embedding); the loss is a pmean over "fsdp".

  python examples/fsdp_tp_train.py                         # whatever devices exist
  python examples/fsdp_tp_train.py --check                 # routed == unrouted, bitwise
  python examples/fsdp_tp_train.py --dtype bfloat16 --hidden 512 --layers 4
  python examples/fsdp_tp_train.py --processes 2 ...       # 2 jax.distributed processes

Mesh: --fsdp F --tp T (F * T devices); by default T = 2 where there are 4
devices or more and their count is even, else T = 1, and F = devices / T. A mesh
axis of one device is left out (its collectives are the identity): on 2
devices the mesh is ("fsdp",) alone.

Runs: --collective jaxll (the routed step), psum (the same step unrouted: JAX's
collectives, XLA's), both (default). --check runs both from the same state and
compares every output of one step (loss, gradients, new parameters, optimizer
state) bit for bit, then the losses of every step; a difference exits with
status 1. On CPU every jaxll call lowers to XLA's collective, so the two must
agree exactly; on GPUs a kernel's sums over more than 2 ranks may round
otherwise than NCCL's. Devices and processes as in tp_decode.py: all local GPUs, or 8
CPU devices where there is none, or --processes N; processes sharing one GPU
cannot run XLA's collectives (NCCL cannot pair them), so there the unrouted run
and --check are unavailable, and said so.
"""

import argparse
import time

import example_utils as eu


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--fsdp", type=int, default=None, help="FSDP ranks (default: devices / tp)")
  p.add_argument("--tp", type=int, default=None,
                 help="tensor-parallel ranks (default: 2 where devices >= 4 and even, else 1)")
  p.add_argument("--layers", type=int, default=2)
  # Sizes left unset: the defaults shown, rounded up to a multiple of the ranks
  # that split them; for hidden and vocab (FSDP) and ffn (TP), of 8 x those ranks,
  # so that every shard's innermost dimension is whole 16-byte units in bfloat16
  # and each gather and scatter can take a kernel.
  p.add_argument("--hidden", type=int, default=None, help="default 64")
  p.add_argument("--heads", type=int, default=None, help="default 4")
  p.add_argument("--head-dim", type=int, default=16)
  p.add_argument("--ffn", type=int, default=None, help="MLP width, also the head's (default 128)")
  p.add_argument("--vocab", type=int, default=None, help="default 128")
  p.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 16)")
  p.add_argument("--batch", type=int, default=None,
                 help="sequences per step (default: 2 per FSDP rank)")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                 help="parameters, activations and gradients (AdamW's moments stay float32)")
  p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
  p.add_argument("--lr", type=float, default=None, help="default: 3e-3 for adamw, 1 for sgd")
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--check", action="store_true",
                 help="compare the routed and unrouted steps bit for bit (exit 1 on a difference)")
  eu.add_common_args(p)
  opts = p.parse_args(argv)
  opts.lr = opts.lr if opts.lr is not None else {"adamw": 3e-3, "sgd": 1.0}[opts.optimizer]
  if opts.steps < 1:
    p.error("need --steps >= 1")
  if opts.check and opts.collective != "both":
    p.error("--check compares both runs: leave --collective at both")
  return opts


def main(argv=None):
  opts = parse(argv)
  report = eu.main(opts, run, print_report, __file__)
  # (a launched process whose shards differ fails too, so the launcher's run fails)
  if "check" in report and not report["check"]["passed"]:
    raise SystemExit(1)
  return report


# --- the model ------------------------------------------------------------------------------

def mesh_shape(opts, n: int) -> tuple[int, int]:
  """(fsdp, tp) ranks for n devices from the flags."""
  tp = opts.tp or (opts.fsdp and n // opts.fsdp) or (2 if n >= 4 and n % 2 == 0 else 1)
  fsdp = opts.fsdp or max(n // tp, 1)
  if fsdp * tp != n:
    raise SystemExit(f"--fsdp {fsdp} x --tp {tp} must be the {n} devices")
  return fsdp, tp


class Model:
  """The model on a mesh over `devices`: shapes, partition specs, the
  per-device loss and the jitted training step. `self.fsdp` and `self.tp` are
  the mesh axes of the two roles, None for a role of one device."""

  def __init__(self, opts, devices):
    import jax
    import jax.numpy as jnp

    n = len(devices)
    self.fsdp_size, self.tp_size = mesh_shape(opts, n)
    sizes = {"fsdp": self.fsdp_size, "tp": self.tp_size}
    names = tuple(k for k, v in sizes.items() if v > 1) or ("fsdp",)
    self.mesh = jax.make_mesh(tuple(sizes[k] for k in names), names, devices=devices)
    self.fsdp = "fsdp" if "fsdp" in names else None
    self.tp = "tp" if "tp" in names else None
    self.opts = opts
    self.dtype = jnp.dtype(opts.dtype)
    f, t = self.fsdp_size, self.tp_size

    def size(value, default, multiple):
      return value or -(-default // multiple) * multiple

    self.dims = d = {
        "layers": opts.layers, "hidden": size(opts.hidden, 64, 8 * f),
        "heads": size(opts.heads, 4, t), "head_dim": opts.head_dim,
        "ffn": size(opts.ffn, 128, 8 * t), "vocab": size(opts.vocab, 128, 8 * f),
        "seq": size(opts.seq, 16, t), "batch": size(opts.batch, 2 * f, f)}
    L, H, nh, hd, Fw, V, S = (d[k] for k in ("layers", "hidden", "heads", "head_dim", "ffn",
                                             "vocab", "seq"))
    need = {"hidden": (H, f), "vocab": (V, f), "batch": (d["batch"], f), "heads": (nh, t),
            "ffn": (Fw, t), "seq": (S, t)}
    bad = [f"{k} ({v})" for k, (v, r) in need.items() if v % r]
    if bad:
      raise SystemExit(f"fsdp={f}, tp={t}: hidden, vocab and batch must divide by the FSDP "
                       f"ranks, heads, ffn and seq by the TP ranks; not {', '.join(bad)}")
    F, T = self.fsdp, self.tp
    from jax.sharding import PartitionSpec as P
    # name: (global shape, partition spec); layer weights stacked on a leading L
    self.layout = {
        "embed": ((V, H), P(None, F)),
        "norm_f": ((H,), P(F)),
        "head_up": ((H, Fw), P(F, T)),
        "head_down": ((Fw, V), P(T, F)),
        "layers": {
            "norm1": ((L, H), P(None, F)),
            "wqkv": ((L, 3, H, nh, hd), P(None, None, F, T, None)),
            "wo": ((L, nh, hd, H), P(None, T, None, F)),
            "norm2": ((L, H), P(None, F)),
            "w1": ((L, H, Fw), P(None, F, T)),
            "w2": ((L, Fw, H), P(None, T, F)),
        },
    }
    is_leaf = lambda v: isinstance(v, tuple) and isinstance(v[1], P)  # noqa: E731
    self.specs = jax.tree.map(lambda v: v[1], self.layout, is_leaf=is_leaf)
    self.shapes = jax.tree.map(lambda v: v[0], self.layout, is_leaf=is_leaf)
    self.token_spec = P(F, T)      # inputs: batch over fsdp, sequence over tp
    self.target_spec = P(F, None)  # targets: the head sees the whole sequence

  # (collectives over a role of one device are the identity)
  def gather(self, x, axis, dim):
    import jax
    return x if axis is None else jax.lax.all_gather(x, axis, axis=dim, tiled=True)

  def scatter(self, x, axis, dim):
    import jax
    return x if axis is None else jax.lax.psum_scatter(x, axis, scatter_dimension=dim,
                                                       tiled=True)

  def psum(self, x, axis):
    import jax
    return x if axis is None else jax.lax.psum(x, axis)

  def rmsnorm(self, x, g):
    import jax
    import jax.numpy as jnp
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (x32 * g.astype(jnp.float32)).astype(self.dtype)

  def attention(self, h, wqkv, wo):
    """h: [batch, seq, hidden], the whole sequence; wqkv: [3, hidden, heads, dim]
    and wo: [heads, dim, hidden], this rank's heads. Returns this rank's
    partial sum of the output."""
    import jax
    import jax.numpy as jnp
    q, k, v = jnp.einsum("bsh,khnd->kbsnd", h, wqkv)
    s = jnp.einsum("bqnd,bknd->bnqk", q, k, preferred_element_type=jnp.float32)
    s = s * q.shape[-1] ** -0.5
    seq = h.shape[1]
    s = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), s, -jnp.inf)
    o = jnp.einsum("bnqk,bknd->bqnd", jax.nn.softmax(s, axis=-1).astype(self.dtype), v)
    return jnp.einsum("bqnd,ndh->bqh", o, wo)

  def layer(self, x, p):
    """One layer on this rank's slice of the sequence, x: [batch, seq / tp, hidden]."""
    import jax
    F, T = self.fsdp, self.tp
    # attention: gather the normed input along seq, heads split over tp
    h = self.gather(self.rmsnorm(x, self.gather(p["norm1"], F, 0)), T, 1)
    y = self.attention(h, self.gather(p["wqkv"], F, 1), self.gather(p["wo"], F, 2))
    x = x + self.scatter(y, T, 1)        # row-parallel partial sums, back to seq slices
    # MLP: the same pattern, columns split over tp
    h = self.gather(self.rmsnorm(x, self.gather(p["norm2"], F, 0)), T, 1)
    a = jax.nn.gelu(h @ self.gather(p["w1"], F, 0))
    x = x + self.scatter(a @ self.gather(p["w2"], F, 1), T, 1)
    return x, None

  def loss(self, params, inputs, targets):
    """The mean cross-entropy of next-token prediction, on this rank's shards;
    the same value on every device."""
    import jax
    import jax.numpy as jnp
    F, T = self.fsdp, self.tp
    x = self.gather(params["embed"], F, 1)[inputs]             # [batch, seq / tp, hidden]
    x, _ = jax.lax.scan(jax.checkpoint(self.layer), x, params["layers"])
    h = self.gather(self.rmsnorm(x, self.gather(params["norm_f"], F, 0)), T, 1)
    a = jax.nn.gelu(h @ self.gather(params["head_up"], F, 0))
    logits = self.psum(a @ self.gather(params["head_down"], F, 1), T)  # row-parallel
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)
    loss = jnp.mean(nll)
    return loss if F is None else jax.lax.pmean(loss, F)

  def update(self, params, opt_state, grads):
    """AdamW (decoupled weight decay) or SGD, elementwise on each shard."""
    import jax
    import jax.numpy as jnp
    lr = self.opts.lr
    if self.opts.optimizer == "sgd":
      new = jax.tree.map(lambda p, g: (p.astype(jnp.float32) - lr * g.astype(jnp.float32))
                         .astype(p.dtype), params, grads)
      return new, opt_state
    b1, b2, eps, wd = 0.9, 0.95, 1e-8, 0.01
    count = opt_state["count"] + 1
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g.astype(jnp.float32),
                      opt_state["mu"], grads)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g.astype(jnp.float32)),
                      opt_state["nu"], grads)
    c1, c2 = 1 - b1 ** count, 1 - b2 ** count

    def step(p, m, v):
      p32 = p.astype(jnp.float32)
      return (p32 - lr * ((m / c1) / (jnp.sqrt(v / c2) + eps) + wd * p32)).astype(p.dtype)

    return jax.tree.map(step, params, mu, nu), {"count": count, "mu": mu, "nu": nu}

  def opt_specs(self):
    from jax.sharding import PartitionSpec as P
    if self.opts.optimizer == "sgd":
      return {}
    return {"count": P(), "mu": self.specs, "nu": self.specs}

  def make_step(self, routed: bool, check: bool = False):
    """The jitted training step (params, opt_state, inputs, targets) ->
    (params, opt_state, loss[, grads]): the shard_map'd step, through
    jaxll.route when `routed`. check: the gradients are returned too, and the
    parameters and optimizer state are not donated (both runs start from them)."""
    import jax
    from jax.sharding import PartitionSpec as P

    import jaxll

    def step(params, opt_state, inputs, targets):
      loss, grads = jax.value_and_grad(self.loss)(params, inputs, targets)
      params, opt_state = self.update(params, opt_state, grads)
      return (params, opt_state, loss, grads) if check else (params, opt_state, loss)

    out_specs = (self.specs, self.opt_specs(), P()) + ((self.specs,) if check else ())
    body = jax.shard_map(step, mesh=self.mesh,
                         in_specs=(self.specs, self.opt_specs(), self.token_spec,
                                   self.target_spec),
                         out_specs=out_specs)
    return jax.jit(jaxll.route(body) if routed else body,
                   donate_argnums=() if check else (0, 1))

  # --- the state, built per device from host arrays (no cross-process transfer) ---

  def place(self, a, spec):
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    a = np.asarray(a)
    sharding = NamedSharding(self.mesh, spec)
    idx = sharding.addressable_devices_indices_map(a.shape)
    return jax.make_array_from_single_device_arrays(
        a.shape, sharding, [jax.device_put(a[idx[d]], d) for d in idx])

  def init_state(self):
    """(params, opt_state) from the seed."""
    import jax
    import numpy as np
    rng = np.random.default_rng(self.opts.seed)
    np_dtype = np.dtype(self.dtype)

    def init(path, shape):
      name = path[-1].key
      if name.startswith("norm"):
        return np.ones(shape, np_dtype)
      # inputs summed into each output: hidden for wqkv, heads x dim for wo
      fan_in = (1 if name == "embed" else shape[-3] if name == "wqkv" else
                shape[-3] * shape[-2] if name == "wo" else shape[-2])
      return (rng.standard_normal(shape, np.float32) / np.sqrt(fan_in)).astype(np_dtype)

    host = jax.tree_util.tree_map_with_path(
        init, self.shapes, is_leaf=lambda v: isinstance(v, tuple))
    params = jax.tree.map(self.place, host, self.specs)
    if self.opts.optimizer == "sgd":
      return params, {}

    def zeros():
      return jax.tree.map(lambda a, s: self.place(np.zeros(a.shape, np.float32), s), host,
                          self.specs)

    return params, {"count": self.place(np.int32(0), self.opt_specs()["count"]),
                    "mu": zeros(), "nu": zeros()}

  def init_batch(self):
    """(inputs, targets): next-token pairs of random sequences."""
    import numpy as np
    rng = np.random.default_rng(self.opts.seed + 1)
    d = self.dims
    tokens = rng.integers(0, d["vocab"], (d["batch"], d["seq"] + 1), np.int32)
    return (self.place(tokens[:, :-1], self.token_spec),
            self.place(tokens[:, 1:], self.target_spec))


# --- the runs -------------------------------------------------------------------------------

def local_value(a):
  import numpy as np
  return np.asarray(a.addressable_data(0))


def bit_differences(a_tree, b_tree) -> list[str]:
  """The leaves whose shards on this process differ in any bit."""
  import jax
  import numpy as np
  differ = []
  a_leaves = jax.tree_util.tree_leaves_with_path(a_tree)
  for (path, a), b in zip(a_leaves, jax.tree.leaves(b_tree)):
    for sa, sb in zip(a.addressable_shards, b.addressable_shards):
      x, y = np.asarray(sa.data), np.asarray(sb.data)
      bits = np.dtype(f"u{x.dtype.itemsize}") if x.dtype.itemsize in (1, 2, 4, 8) else None
      same = (x.shape == y.shape and x.dtype == y.dtype and
              (np.array_equal(x.view(bits), y.view(bits)) if bits else np.array_equal(x, y)))
      if not same:
        differ.append(jax.tree_util.keystr(path))
        break
  return differ


def train(model, step, state, batch, steps, opts, first=None):
  """Runs `steps` steps from `state` (or from `first`, the outputs of a step
  already taken); returns the losses and the seconds of each step."""
  params, opt_state = state
  losses, times = [], []
  if first is not None:
    params, opt_state, loss = first[:3]
    losses.append(float(local_value(loss)))
    steps -= 1
  eu.line_up(opts)
  for _ in range(steps):
    t0 = time.perf_counter()
    out = step(params, opt_state, *batch)
    params, opt_state, loss = out[:3]
    loss.block_until_ready()
    times.append(time.perf_counter() - t0)
    losses.append(float(local_value(loss)))
  return losses, times


def run(opts):
  import jax
  import numpy as np

  import jaxll

  devices = jax.devices()
  model = Model(opts, devices)
  if opts.check and eu.psum_unavailable(opts):
    raise SystemExit(f"--check needs the unrouted step: {eu.psum_unavailable(opts)}")
  batch = model.init_batch()
  report = {
      "ran_on": eu.describe(opts, devices),
      "mesh": {"fsdp": model.fsdp_size, "tp": model.tp_size,
               "axes": list(model.mesh.axis_names)},
      "model": model.dims,
      "dtype": opts.dtype, "optimizer": opts.optimizer, "steps": opts.steps, "runs": {},
      "skipped": {}}
  wanted = {"both": ["psum", "jaxll"], "psum": ["psum"], "jaxll": ["jaxll"]}[opts.collective]
  firsts = {}
  for name in wanted:
    if name == "psum" and eu.psum_unavailable(opts):
      report["skipped"]["psum"] = eu.psum_unavailable(opts)
      continue
    step = model.make_step(routed=name == "jaxll", check=opts.check)
    state = model.init_state()
    args = (*state, *batch)
    sites = jaxll.explain(step, *args) if name == "jaxll" else []
    compiled = step.lower(*args).compile()
    first = None
    if opts.check:
      eu.line_up(opts)
      first = firsts[name] = compiled(*args)
    losses, times = train(model, compiled, state, batch, opts.steps, opts, first)
    report["runs"][name] = {
        "losses": losses,
        "step_ms_median": float(np.median(times[1:] if len(times) > 1 else times) * 1e3)
        if times else None,
        "call_sites": len(sites),
        "paths": sorted({s.algorithm for s in sites}) if sites else ["xla (jax.lax)"]}
  if opts.check:
    differ = bit_differences(firsts["psum"], firsts["jaxll"])
    same_losses = report["runs"]["psum"]["losses"] == report["runs"]["jaxll"]["losses"]
    report["check"] = {"passed": not differ and same_losses, "differing_leaves": differ,
                       "leaves": len(jax.tree.leaves(firsts["psum"])),
                       "same_losses": same_losses}
  return report


def print_report(r):
  m = r["model"]
  mesh = " x ".join(f"{a}={r['mesh'][a]}" for a in r["mesh"]["axes"])
  print(f"fsdp_tp_train: mesh {mesh}; {m['layers']} layers, hidden {m['hidden']}, "
        f"{m['heads']} heads of {m['head_dim']}, ffn {m['ffn']}, vocab {m['vocab']}, "
        f"batch {m['batch']} x seq {m['seq']}, {r['dtype']}, {r['optimizer']}; "
        f"ran on {r['ran_on']}")
  labels = {"psum": "jax.lax (unrouted)", "jaxll": "jaxll.route"}
  for name, run in r["runs"].items():
    losses = " ".join(f"{v:.4f}" for v in run["losses"])
    ms = run["step_ms_median"]
    print(f"  {labels[name]:19s} losses {losses}"
          + (f"; step {ms:.2f} ms (median)" if ms is not None else "")
          + f"; paths: {', '.join(run['paths'])}"
          + (f" ({run['call_sites']} call sites)" if run["call_sites"] else ""))
  for name, why in r["skipped"].items():
    print(f"  {labels[name]:19s} skipped: {why}")
  if "check" in r:
    c = r["check"]
    if c["passed"]:
      print(f"  check: routed and unrouted steps bitwise equal ({c['leaves']} leaves of one "
            f"step: loss, gradients, parameters, optimizer state) and the same losses over "
            f"{r['steps']} steps")
    else:
      print(f"  check FAILED: leaves that differ: {', '.join(c['differing_leaves']) or 'none'}; "
            f"same losses: {c['same_losses']}")
  elif len(r["runs"]) == 2:
    a, b = r["runs"]["psum"]["losses"], r["runs"]["jaxll"]["losses"]
    print(f"  same losses (jax.lax, jaxll.route): {'yes' if a == b else 'no'}")
  if len(r["runs"]) == 2 and r["runs"]["jaxll"]["paths"] == ["xla"]:
    print("  both runs on XLA's collectives here (no jaxll kernel ran): no speedup to report")


if __name__ == "__main__":
  main()
