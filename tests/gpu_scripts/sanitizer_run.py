"""A small virtual-rank run for compute-sanitizer (memcheck, racecheck, synccheck,
initcheck; tests/gpu_scripts/sanitizers.sh runs all four).
The fused all-reduce + residual + RMSNorm kernels run too (three shapes per N, one-shot
and two-shot, LL16 and sentinel; long rows whose blocks hold more than 32 groups of
squares; then the decode shape, rows of 8192 bf16, whose
one-row-wave kernel adds a clustered row's squares by st.async: the run fails
unless that path ran), the group twins of the kernels (every rank's blocks in one
launch: each all-reduce kernel, the fused decode-shape and two-shot cuts), and
the all-gather and reduce-scatter kernels (the LL16, sentinel and barrier kernels, two sizes
per N), the ppermute and all-to-all kernels (the same, between all-reduces), and the
ragged all-to-all (rows that are not whole units, one round and several).

  compute-sanitizer --tool racecheck python3 tests/gpu_scripts/sanitizer_run.py [CALLS] [RANKS]

Drives every kernel through the testing module's native drivers only (JAX's
GPU backend is never started, so the sanitizer sees jaxll's kernels alone): N virtual
ranks on CUDA device 0 for each N in RANKS (comma-separated, default 2,3; sum
kernels are compiled separately for 1, 2, 4 and 8 ranks and for any other
count), f32 and bf16, mixed sizes including unaligned ones, on a workspace with
4 KiB of scratch per round so most calls take several rounds; then the error
paths: ranks that disagree on a call, a rank that never arrives, calls on a
workspace in error, and a reset. Exits non-zero on any mismatch, unexpected
error or missing one.
"""
import sys

import numpy as np

from jaxll import algorithms, native, settings
from jaxll.native import ext
from jaxll.tools import testing

tools = testing._tools  # (the testing module, initialised by the import)


def make(n: int, scratch_bytes: int, timeout_ms: int) -> int:
  """A virtual workspace of n ranks on CUDA device 0, attached to the tools."""
  bound = tools.block_bound(0, settings.kernel_settings().carveout) // n
  ws = native.create_workspace([[0] * n], True, scratch_bytes, timeout_ms, max_blocks=bound)
  tools.attach(ws, 0, n)
  return ws


calls = int(sys.argv[1]) if len(sys.argv) > 1 else 12
ranks = [int(r) for r in sys.argv[2].split(",")] if len(sys.argv) > 2 else [2, 3]
LL = algorithms.RMSNORM_PROTOCOL_CODES["ll"]
SENTINEL = algorithms.RMSNORM_PROTOCOL_CODES["sentinel"]
TWOSHOT_LL = algorithms.RMSNORM_PROTOCOL_CODES["twoshot_ll"]
TWOSHOT_SENTINEL = algorithms.RMSNORM_PROTOCOL_CODES["twoshot_sentinel"]
bad = 0
for n in ranks:
  comm = make(n, 4096, 20000)
  counts = [int(c) for c in np.random.default_rng(n).integers(1, 6000, size=calls)]
  for name in algorithms.KERNELS:
    for dtype in ("float32", "bfloat16"):
      res = tools.virtual_stress(comm, [algorithms.SPECS[name].code],
                               algorithms.DTYPE_CODES[dtype], algorithms.OP_CODES["sum"],
                               counts, n, 5)
      print(n, name, dtype, res["mismatches"], res["error"] or "no error", flush=True)
      bad += res["mismatches"] + (1 if res["error"] else 0)
  # the fused all-reduce + residual + RMSNorm, rows of one and of several
  # rounds on LL16 (this 4 KiB workspace), then on the sentinel exchange (a
  # workspace of 1 MiB, whose regions hold each of these rows' segments: every
  # shape must be served), three calls with other inputs each, then the
  # two-shot kernel on both exchanges (on the 1 MiB workspace: every shape)
  big = make(n, 1 << 20, 3000)
  for dtype, hidden in (("float32", 12), ("bfloat16", 4096), ("float16", 1000)):
    item = 4 if dtype == "float32" else 2
    tokens = 3
    x = np.random.default_rng(hidden).integers(0, 255, size=n * tokens * hidden * item,
                                               dtype=np.uint8)
    x[1::2] = 0x3C  # small finite values in every dtype
    for c, protocol, k in ((comm, LL, 0), (big, SENTINEL, 0), (big, SENTINEL, 1), (big, SENTINEL, 2),
                           (big, TWOSHOT_SENTINEL, 0), (big, TWOSHOT_SENTINEL, 1),
                           (big, TWOSHOT_LL, 0), (big, TWOSHOT_LL, 1)):
      xk = x.copy()
      xk[::2] = (xk[::2].astype(np.int64) + 17 * k) % 256  # (other low bytes)
      try:
        *_, err = tools.virtual_rmsnorm(c, algorithms.DTYPE_CODES[dtype], xk.tobytes(),
                                      xk[:tokens * hidden * item].tobytes(),
                                      xk[:hidden * item].tobytes(), tokens, hidden, 1e-6,
                                      protocol=protocol)
        print(n, "rmsnorm", dtype, hidden, protocol, err or "no error", flush=True)
        bad += int(bool(err))
      except (RuntimeError, ValueError) as e:
        print(n, "rmsnorm", dtype, hidden, protocol, e, flush=True)
        bad += 1
  # long rows a whole row a block in rounds (16384 bf16 on the 4 KiB
  # workspace): more than 32 groups of squares a block, whose tree takes
  # levels of pairs in shared memory before a warp's butterfly
  tokens, hidden = 40, 16384
  x = np.random.default_rng(5).integers(0, 255, size=n * tokens * hidden * 2, dtype=np.uint8)
  x[1::2] = 0x3C
  p = ext.rmsnorm_plan(comm, algorithms.DTYPE_CODES["bfloat16"], tokens, hidden, LL)
  try:
    *_, err = tools.virtual_rmsnorm(comm, algorithms.DTYPE_CODES["bfloat16"], x.tobytes(),
                                  x[:tokens * hidden * 2].tobytes(), x[:hidden * 2].tobytes(),
                                  tokens, hidden, 1e-6, protocol=LL)
  except (RuntimeError, ValueError) as e:
    err = str(e)
  print(n, "rmsnorm long rows", f"segments={p['segments']}", err or "no error", flush=True)
  bad += int(bool(err)) + int(p["segments"] * 32 * 32 >= hidden // 4)  # (must be > 32 groups)
  # the decode shape (rows of 8192 bf16, 1 and 2 tokens), both one-shot
  # exchanges: the one-row-wave kernel whose clustered blocks add a row's
  # squares by st.async into each other's shared memory (counted by an
  # mbarrier); that path must have run here, or the run fails
  clustered = 0
  for tokens in (1, 2):
    x = np.random.default_rng(tokens).integers(0, 255, size=n * tokens * 8192 * 2, dtype=np.uint8)
    x[1::2] = 0x3C
    for protocol in (LL, SENTINEL):
      try:
        p = ext.rmsnorm_plan(big, algorithms.DTYPE_CODES["bfloat16"], tokens, 8192, protocol)
        *_, err = tools.virtual_rmsnorm(big, algorithms.DTYPE_CODES["bfloat16"], x.tobytes(),
                                      x[:tokens * 8192 * 2].tobytes(), x[:8192 * 2].tobytes(),
                                      tokens, 8192, 1e-6, protocol=protocol)
      except (RuntimeError, ValueError) as e:  # (every exchange serves these shapes here)
        print(n, "rmsnorm decode", tokens, protocol, e, flush=True)
        bad += 1
        continue
      clustered += int(p["lean"] and p["cluster"] > 1)
      print(n, "rmsnorm decode", tokens, protocol, f"lean={p['lean']} cluster={p['cluster']}",
            err or "no error", flush=True)
      bad += int(bool(err))
  if n > 1 and not clustered:
    print(n, "rmsnorm decode: no call took the clustered one-row-wave kernel", flush=True)
    bad += 1
  # the group twins (every rank's blocks in one launch, jaxll.tools.testing's
  # one_launch): each all-reduce kernel on 4 KiB of scratch (several rounds),
  # the fused kernel's decode shape on both exchanges and its two-shot cut, two
  # calls in a graph each (the graph timers; a recorded error raises)
  for name, code, count in [(k, algorithms.SPECS[k].code, 3001) for k in algorithms.KERNELS] + [
      ("rmsnorm", SENTINEL, 1), ("rmsnorm", LL, 2), ("rmsnorm", TWOSHOT_SENTINEL, 4)]:
    try:
      if name == "rmsnorm":
        tools.virtual_rmsnorm_bench(big, algorithms.DTYPE_CODES["bfloat16"], count, 8192, 2, 1, code,
                                  one_launch=True)
      else:
        tools.virtual_bench(comm, code, algorithms.DTYPE_CODES["float32"],
                          algorithms.OP_CODES["sum"], count, 2, 1, one_launch=True)
      print(n, "one launch", name, code, count, "no error", flush=True)
    except (RuntimeError, ValueError) as e:
      print(n, "one launch", name, code, count, e, flush=True)
      bad += 1
  ext.free_workspace(big)
  # all-gather (2) and reduce-scatter (3), the three protocols, several rounds
  # of pieces (4 KiB of scratch): each output checked against numpy here (small
  # integers, in float32 for the sentinel protocol, which has no int32 kernel)
  for coll in (2, 3):
    for alg in ("oneshot_ll", "oneshot_sentinel", "oneshot_barrier"):
      dt = np.float32 if alg == "oneshot_sentinel" else np.int32
      for count in (5, 3001):
        xg = np.random.default_rng(count).integers(-100, 100, size=(n, n if coll == 3 else 1, count))
        xg = xg.astype(dt)
        y, err = tools.virtual_gather_scatter(comm, coll, algorithms.SPECS[alg].code,
                                            algorithms.DTYPE_CODES[np.dtype(dt).name],
                                            xg.tobytes(), count)
        y = np.frombuffer(y, dt)
        want = (np.tile(xg.reshape(-1), n) if coll == 2 else
                np.concatenate([xg[:, r].sum(0) for r in range(n)]))
        ok = not err and np.array_equal(y, want)
        print(n, "gather" if coll == 2 else "scatter", alg, count, "ok" if ok else f"FAILED {err}",
              flush=True)
        bad += int(not ok)
  # ppermute (a ring shift, several rounds, between all-reduces: one-way calls
  # among all-pairs ones) and all-to-all, the three protocols
  for alg in ("oneshot_ll", "oneshot_sentinel", "oneshot_barrier"):
    dt = np.float32 if alg == "oneshot_sentinel" else np.int32
    code, dcode = algorithms.SPECS[alg].code, algorithms.DTYPE_CODES[np.dtype(dt).name]
    for count in (5, 3001):
      xp = np.random.default_rng(count + 1).integers(-100, 100, size=(n, n * count)).astype(dt)
      dests = [(r + 1) % n for r in range(n)]
      y, err = tools.virtual_ppermute(comm, code, dcode, xp.tobytes(), n * count, dests)
      ok = not err and np.array_equal(np.frombuffer(y, dt).reshape(n, -1), np.roll(xp, 1, 0))
      y, err = tools.virtual_all_to_all(comm, code, dcode, xp.tobytes(), count)
      want = np.stack([np.concatenate([xp[j].reshape(n, count)[r] for j in range(n)])
                       for r in range(n)])
      ok = ok and not err and np.array_equal(np.frombuffer(y, dt).reshape(n, -1), want)
      res = tools.virtual_stress(comm, [algorithms.SPECS["oneshot_ll"].code],
                                 algorithms.DTYPE_CODES["float32"], algorithms.OP_CODES["sum"],
                                 [count], n, 1)
      ok = ok and not res["mismatches"] and not res["error"]
      print(n, "ppermute, all_to_all", alg, count, "ok" if ok else f"FAILED {err}", flush=True)
      bad += int(not ok)
  # ragged all-to-all: rows of 3 int32 (not whole units), every rank r sends
  # r + 1 + k x 40 rows to rank k (several rounds past 4 KiB), packed in source
  # order on the receiver; between all-reduces
  for rows_to in (1, 40):
    send = np.array([[r + 1 + k * rows_to for k in range(n)] for r in range(n)], np.int32)
    in_rows, out_rows = int(send.sum(1).max()), int(send.sum(0).max()) + 1
    xr = np.random.default_rng(rows_to).integers(-100, 100, size=(n, in_rows, 3)).astype(np.int32)
    yr = np.zeros((n, out_rows, 3), np.int32)
    sizes = np.zeros((n, 4, n), np.int32)
    for r in range(n):
      sizes[r, 0] = np.concatenate([[0], np.cumsum(send[r])[:-1]])
      sizes[r, 1], sizes[r, 3] = send[r], send[:, r]
      sizes[:, 2, r] = 1 + np.concatenate([[0], np.cumsum(send[:, r])[:-1]])
    want = yr.copy()
    for r in range(n):
      for d in range(n):
        want[d, sizes[r, 2, d]:sizes[r, 2, d] + send[r, d]] = xr[r, sizes[r, 0, d]:][:send[r, d]]
    y, err = tools.virtual_ragged_all_to_all(
        comm, algorithms.SPECS["oneshot_ll"].code, algorithms.DTYPE_CODES["int32"], xr.tobytes(),
        yr.tobytes(), in_rows, out_rows, 3, [int(v) for v in sizes.ravel()])
    ok = not err and np.array_equal(np.frombuffer(y, np.int32).reshape(want.shape), want)
    res = tools.virtual_stress(comm, [algorithms.SPECS["oneshot_ll"].code],
                               algorithms.DTYPE_CODES["float32"], algorithms.OP_CODES["sum"],
                               [3001], n, 1)
    ok = ok and not res["mismatches"] and not res["error"]
    print(n, "ragged_all_to_all", rows_to, "ok" if ok else f"FAILED {err}", flush=True)
    bad += int(not ok)
  ext.free_workspace(comm)
  if n == 1:
    continue
  # error paths: a mismatch, a rank that never arrives, then a reset
  comm = make(n, 4096, 3000)
  ll, sen = algorithms.SPECS["oneshot_ll"].code, algorithms.SPECS["twoshot_sentinel"].code
  spec = [(ll, 0, 0, 5000, False, 0, 1)] * n
  spec[-1] = (sen, 0, 0, 3000, False, 0, 1)
  got = tools.virtual_calls(comm, spec)
  kinds = {int(ext.decode_error(w)[0]) for *_, w, _ in ext.workspace_errors(comm)}
  print(n, "mismatch", got, kinds, flush=True)
  bad += int(got != [5000] * (n - 1) + [3000] or kinds != {2})
  ext.workspace_reset(comm)
  spec = [(sen, 0, 0, 5000, r == 0, 0, 1) for r in range(n)]
  got = tools.virtual_calls(comm, spec)
  print(n, "skip", got, flush=True)
  bad += int(got != [0] + [5000] * (n - 1) or not ext.workspace_errors(comm))
  ext.workspace_reset(comm)
  # the fused kernel with a rank absent: the others give up (clustered blocks
  # still take part in every row's exchange), then a reset
  xb = np.full(n * 2 * 4096, 0x3C00, np.uint16)
  # (sentinel: on a workspace of 1 MiB of scratch, whose regions its
  # decode-shape kernel moves 2 x 4096 bf16 in, one round)
  big = make(n, 1 << 20, 3000)
  for c, protocol in ((comm, LL), (big, SENTINEL), (big, TWOSHOT_SENTINEL)):
    *_, err = tools.virtual_rmsnorm(c, algorithms.DTYPE_CODES["bfloat16"], xb.tobytes(),
                                  xb[:2 * 4096].tobytes(), xb[:4096].tobytes(), 2, 4096, 1e-6, 0,
                                  protocol=protocol)
    print(n, "rmsnorm absent", protocol, err[:60] or "no error", flush=True)
    bad += int(not err)
    ext.workspace_reset(c)
  xr = xb + 1  # (other inputs than those the absent rank's peers left)
  tools.virtual_rmsnorm(big, algorithms.DTYPE_CODES["bfloat16"], xr.tobytes(),
                      xr[:2 * 4096].tobytes(), xr[:4096].tobytes(), 2, 4096, 1e-6,
                      protocol=SENTINEL)
  errs = ext.workspace_errors(big)
  print(n, "rmsnorm sentinel after reset", errs or "no error", flush=True)
  bad += int(bool(errs))
  ext.free_workspace(big)
  got = tools.virtual_calls(comm, [(ll, 0, 0, 5000, False, 0, 1)] * n)
  print(n, "after reset", got, flush=True)
  bad += int(got != [0] * n or bool(ext.workspace_errors(comm)))
  ext.free_workspace(comm)
print("SANITIZER_RUN", "FAILED" if bad else "OK", flush=True)
sys.exit(1 if bad else 0)
