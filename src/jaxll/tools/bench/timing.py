"""What the benchmark times and how: a jitted chain of dependent steps in
steady state."""

from __future__ import annotations

import statistics
import time

COLLECTIVES = ("all_reduce", "all_gather", "psum_scatter")


def steady_per_call_us(fn, arg, calls_per_run: int, runs: int, reps: int) -> float:
  """Time per call in steady state, in µs: after two warm-up runs, each of
  `reps` repetitions dispatches `runs` runs back to back (each making
  `calls_per_run` dependent calls) and waits once at the end; the median over
  the repetitions. No host sync or dispatch gap sits inside the timed region
  except the one at its end, spread over ``runs * calls_per_run`` calls.

  Each run takes the previous run's output, as a training loop carries its
  state, so `fn` must return an array like its argument; jit it with
  ``donate_argnums=0`` so the buffers repeat and XLA replays its command
  buffers as they are. (Feeding the same input to every run makes XLA record
  its command buffers again on the host each run: on an H200 with jax 0.11.2
  that doubled an empty custom call's cost per call, see docs/performance.md.)
  `arg` itself is copied first, never consumed."""
  import jax
  arg = jax.block_until_ready(fn(jax.numpy.copy(arg)))
  arg = jax.block_until_ready(fn(arg))
  samples = []
  for _ in range(reps):
    t0 = time.perf_counter()
    for _ in range(runs):
      arg = fn(arg)
    jax.block_until_ready(arg)
    samples.append((time.perf_counter() - t0) * 1e6 / (runs * calls_per_run))
  return statistics.median(samples)


def steady_method(args) -> str:
  return (f"steady state: jitted chain of {args.chain} dependent calls, {args.runs} runs back "
          f"to back per sync, each on the last one's (donated) output, median of {args.reps}")


def chain_step(collective: str, algorithm: str, n: int):
  """One step ``w -> w'`` (same shape, one rank's piece) of the jitted chains of
  local and processes modes, inside shard_map over axis "x" of n devices: the
  all-reduce; the all-gather of w (tiled), of which the step keeps the first
  piece; the reduce-scatter of n copies of w (tiled)."""
  import jax.numpy as jnp

  import jaxll
  if collective == "all_reduce":
    return lambda w: jaxll.all_reduce(w, "x", algorithm=algorithm)
  if collective == "all_gather":
    return lambda w: jaxll.all_gather(w, "x", tiled=True, algorithm=algorithm)[:w.shape[0]]
  if collective == "psum_scatter":
    # n copies of w along its first axis (w may have any rank: the processes
    # mode's w is (1, count)); the tiled reduce-scatter gives back w's shape.
    return lambda w: jaxll.psum_scatter(jnp.concatenate([w] * n, axis=0), "x", tiled=True,
                                        algorithm=algorithm)
  raise ValueError(f"collective must be one of {COLLECTIVES}, got {collective!r}")
