"""A distributed conjugate-gradient solver with jaxll: the 2-D Poisson problem
-laplace(u) = f on the unit square (zero boundary values, 5-point stencil on an
N x N grid), the grid's rows split over a mesh axis inside jax.shard_map. Each
iteration exchanges one halo row with each neighbour (jax.lax.ppermute) and
makes two dot products, each a scalar all-reduce: the latency-bound collective
jaxll is for. (Processes sharing one GPU cannot use XLA's ppermute, NCCL being
unable to pair them: there the halo rows are gathered by the same all-reduce,
--halo allreduce.) The whole solve (a fixed number of iterations, the residual norm
of each one recorded) is one jitted program.

It reports iterations per second and the time to reach the tolerance with the
dot products done by jax.lax.psum and by jaxll.all_reduce, and compares the two
residual histories.

  python examples/cg_solver.py                 # 256 x 256 grid, whatever devices exist
  python examples/cg_solver.py --grid 4096 --iters 2000 --processes 4

Devices as in tp_decode.py: all local GPUs, or 8 CPU devices where there is
none, or --processes N (jaxll.tools.launch; N processes sharing GPU 0 where there
are fewer GPUs, where the psum run is skipped: XLA's NCCL cannot pair them).
"""

import argparse
import time

import example_utils as eu


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--grid", type=int, default=256, help="N: the grid is N x N")
  p.add_argument("--iters", type=int, default=600, help="iterations per solve")
  p.add_argument("--tol", type=float, default=1e-5, help="relative residual to reach")
  p.add_argument("--repeats", type=int, default=5, help="timed solves (median)")
  p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
  p.add_argument("--halo", choices=("auto", "ppermute", "allreduce"), default="auto",
                 help="halo rows by jax.lax.ppermute, or gathered by the all-reduce being "
                      "measured (auto: ppermute, except for processes sharing one GPU, "
                      "where XLA's NCCL cannot run)")
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

  if opts.dtype == "float64":
    jax.config.update("jax_enable_x64", True)
  devices = jax.devices()
  n, N = len(devices), opts.grid
  if N % n:
    raise SystemExit(f"the grid size {N} must be a multiple of the {n} ranks")
  mesh = jax.make_mesh((n,), ("x",), devices=devices)
  dtype = jnp.dtype(opts.dtype)
  rows = P("x", None)

  # XLA's collectives (ppermute included) cannot pair processes sharing one GPU
  halo = opts.halo if opts.halo != "auto" else ("allreduce" if opts.shared_gpu else "ppermute")

  def make_solve(reduce):
    def dot(a, b):
      return reduce(jnp.sum(a * b))                  # a scalar all-reduce

    def halos(u):
      """The row above this rank's block (the previous rank's last row) and the
      row below it (the next rank's first), zeros at the domain's edges."""
      if halo == "ppermute":
        return (jax.lax.ppermute(u[-1:], "x", [(i, i + 1) for i in range(n - 1)]),
                jax.lax.ppermute(u[:1], "x", [(i + 1, i) for i in range(n - 1)]))
      # every rank's first and last rows, gathered by one all-reduce of a
      # buffer where each rank fills its own slot
      me = jax.lax.axis_index("x")
      edges = reduce(jnp.zeros((n, 2, N), u.dtype).at[me].set(jnp.stack([u[0], u[-1]])))
      above = jnp.where(me > 0, edges[jnp.maximum(me - 1, 0), 1], 0)
      below = jnp.where(me < n - 1, edges[jnp.minimum(me + 1, n - 1), 0], 0)
      return above[None], below[None]

    def apply_a(u):
      above, below = halos(u)
      up = jnp.concatenate([above, u[:-1]], 0)
      down = jnp.concatenate([u[1:], below], 0)
      left = jnp.pad(u[:, :-1], ((0, 0), (1, 0)))
      right = jnp.pad(u[:, 1:], ((0, 0), (0, 1)))
      return 4 * u - up - down - left - right        # h^2 times -laplace(u)

    def solve(b):
      x = jnp.zeros_like(b)
      r, p = b, b
      rr = dot(r, r)
      history = jnp.zeros((opts.iters,), dtype)

      def body(i, state):
        x, r, p, rr, history = state
        ap = apply_a(p)
        alpha = rr / dot(p, ap)
        x, r = x + alpha * p, r - alpha * ap
        rr_new = dot(r, r)
        p = r + (rr_new / rr) * p
        return x, r, p, rr_new, history.at[i].set(jnp.sqrt(rr_new))

      x, r, p, rr, history = jax.lax.fori_loop(0, opts.iters, body, (x, r, p, rr, history))
      return x, history / jnp.sqrt(dot(b, b))

    return jax.jit(jax.shard_map(solve, mesh=mesh, in_specs=rows, out_specs=(rows, P())))

  # right-hand side: h^2 f with f a smooth bump (built per device: no transfer)
  h = 1.0 / (N + 1)
  sharding = NamedSharding(mesh, rows)

  def rhs_block(index):
    i = np.arange(N)[index[0]][:, None] + 1
    j = np.arange(N)[index[1]][None, :] + 1
    f = np.sin(np.pi * i * h) * np.sin(2 * np.pi * j * h) + 0.5
    return (h * h * f).astype(dtype)

  b = jax.make_array_from_callback((N, N), sharding, rhs_block)
  reductions = {"psum": lambda v: jax.lax.psum(v, "x"),
                "jaxll": lambda v: jaxll.all_reduce(v, "x")}
  wanted = ["psum", "jaxll"] if opts.collective == "both" else [opts.collective]
  report = {"ran_on": eu.describe(opts, devices), "grid": N, "iters": opts.iters, "halo": halo,
            "dtype": opts.dtype, "tol": opts.tol, "runs": {}, "skipped": {}}
  histories = {}
  for name in wanted:
    if name == "psum" and eu.psum_unavailable(opts):
      report["skipped"]["psum"] = eu.psum_unavailable(opts)
      continue
    solve = make_solve(reductions[name]).lower(b).compile()
    eu.line_up(opts)                                 # every process compiled
    x, hist = solve(b)                               # warm-up
    jax.block_until_ready(hist)
    times = []
    for _ in range(opts.repeats):
      t0 = time.perf_counter()
      x, hist = solve(b)
      jax.block_until_ready((x, hist))
      times.append(time.perf_counter() - t0)
    hist = np.asarray(hist.addressable_data(0), np.float64)
    reached = np.nonzero(hist <= opts.tol)[0]
    t = float(np.median(times))
    sites = jaxll.explain(make_solve(reductions[name]), b) if name == "jaxll" else []
    report["runs"][name] = {
        "seconds_per_solve": t, "iters_per_s": opts.iters / t,
        "iters_to_tol": int(reached[0]) + 1 if reached.size else None,
        "seconds_to_tol": t * (int(reached[0]) + 1) / opts.iters if reached.size else None,
        "final_residual": float(hist[-1]),
        "paths": sorted({s.algorithm for s in sites}) if sites else ["xla (psum)"]}
    histories[name] = hist
  if len(histories) == 2:
    a, c = histories["psum"], histories["jaxll"]
    report["same_history"] = bool(np.array_equal(a, c))
    report["history_max_rel_diff"] = float(np.max(np.abs(a - c) / np.maximum(np.abs(a), 1e-30)))
  return report


def print_report(r):
  print(f"cg_solver: {r['grid']} x {r['grid']} Poisson, {r['iters']} iterations, {r['dtype']}, "
        f"halos by {r['halo']}; ran on {r['ran_on']}")
  for name, run in r["runs"].items():
    to_tol = (f"{run['iters_to_tol']} iterations / {run['seconds_to_tol'] * 1e3:.2f} ms to "
              f"{r['tol']:g}" if run["iters_to_tol"] else f"tolerance {r['tol']:g} not reached")
    print(f"  {name:6s} {run['iters_per_s']:.0f} iterations/s; {to_tol}; final residual "
          f"{run['final_residual']:.2e}; dot products: {', '.join(run['paths'])}")
  for name, why in r["skipped"].items():
    print(f"  {name:6s} skipped: {why}")
  if "same_history" in r:
    a, b = r["runs"]["psum"], r["runs"]["jaxll"]
    speed = (f"{a['seconds_per_solve'] / b['seconds_per_solve']:.2f}x iterations/s"
             if set(b["paths"]) - {"xla"} else
             "both on XLA's all-reduce here (no jaxll kernel ran), so no speedup to report")
    print(f"  jaxll vs psum: {speed}; "
          f"residual histories {'identical' if r['same_history'] else 'differ'} "
          f"(max relative difference {r['history_max_rel_diff']:.1e})")


if __name__ == "__main__":
  main()
