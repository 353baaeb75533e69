"""Virtual ranks: N ranks of one group on a single GPU (``jaxll.tools.testing``).

Each virtual rank has its own workspace allocation and its own CUDA stream and
runs the same kernels as a real rank, so multi-rank logic (the LL protocol,
epochs, double buffering, timeouts) can be tested and tuned on one GPU.

- :func:`virtual_all_reduce` all-reduces the rows of an ``(N, ...)`` array as N
  virtual ranks, through JAX (works under ``jit``); :func:`virtual_fused_rmsnorm`
  does the same with the fused all-reduce + residual + RMSNorm kernel.
- :func:`stress` runs long randomized sequences of calls with the ranks skewed
  against each other and checks every element bit for bit on the device.
- :func:`virtual_ppermute`, :func:`virtual_all_to_all` and
  :func:`virtual_ragged_all_to_all` run those kernels on numpy arrays, one row
  per rank (``jaxll.tools.virtual_exchange``).
- :func:`kernel_time_us`, :func:`rmsnorm_kernel_time_us`,
  :func:`gather_scatter_time_us`, :func:`exchange_time_us`,
  :func:`ragged_time_us` and :func:`graph_floor_us` time kernels inside CUDA
  graphs.
- ``one_launch=True`` (the jittable calls and the all-reduce and fused timers)
  runs every rank's call as one kernel launch on one stream instead of a fork
  onto the ranks' streams: rank r's blocks are those with ``blockIdx.y == r``.

All ranks share one GPU, so every rank's kernel must be resident at once (the
workspace bounds grids for that) and no rank's all-reduce may sit in a hardware
queue behind work that waits on another rank's: set
``CUDA_DEVICE_MAX_CONNECTIONS=32`` before CUDA starts, and issue the ranks'
calls breadth-first (all ranks' all-reduces, then anything that depends on
them), as these tools do.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxll import algorithms, choice, workspace
from jaxll.native import ext
from jaxll.tools.virtual_group import (check_kernel_algorithm as _check_gather_scatter_algorithm,
                                       cuda_device as _cuda_device, dimension as _dimension,
                                       need_kernels as _need_kernels, tools as _tools,
                                       virtual_workspace)
# the exchanges' tools, part of this module's API
from jaxll.tools.virtual_exchange import (  # noqa: F401
    exchange_time_us, ragged_time_us, virtual_all_to_all, virtual_ppermute,
    virtual_ragged_all_to_all)


def _kernel_name(algorithm: str) -> str:
  if algorithm not in algorithms.KERNELS:
    raise ValueError(f"virtual ranks run jaxll kernels ({list(algorithms.KERNELS)}), "
                     f"not {algorithm!r}")
  return algorithm


def virtual_all_reduce(x, *, op: str = "sum", algorithm: str = "oneshot_ll", device=None,
                       config: workspace.WorkspaceConfig | None = None,
                       command_buffer: bool = False, one_launch: bool = False,
                       _skip_rank: int = -1):
  """All-reduces the rows of ``x`` (shape ``(N, ...)``) as N virtual ranks.

  Row r is rank r's input; every row of the result is the reduction (bitwise
  identical across rows). Runs as one XLA custom call that forks onto the N
  ranks' streams, so it composes with ``jax.jit``. ``x`` must live on `device`
  (the first GPU by default). With ``command_buffer`` XLA may capture the call
  into a CUDA graph (for benchmarks: the ranks' recorded errors are then checked
  only when it is captured, not at every run). With ``one_launch`` the call
  does not fork: every rank's blocks run in one kernel launch on XLA's stream
  (rank r's blocks at ``blockIdx.y == r``), the same kernel body, plan and
  arguments per rank, one graph node instead of a fork, N kernels and a join;
  its ranks start together, so the default (a stream each) is the one that
  lets them drift apart.
  """
  x = jax.numpy.asarray(x)
  if x.ndim < 1:
    raise ValueError("virtual_all_reduce needs an (N, ...) array, one row per rank")
  if op not in algorithms.OP_CODES:
    raise ValueError(f"op must be one of {sorted(algorithms.OP_CODES)}, got {op!r}")
  if one_launch and _skip_rank >= 0:
    raise ValueError("virtual_all_reduce: one_launch runs every rank; a skipped rank needs "
                     "one_launch=False")
  name = _kernel_name(algorithm)
  problem = algorithms.kernel_limits(name, x.dtype, op)
  if problem:
    raise TypeError(f"virtual_all_reduce: {problem}")
  n = int(x.shape[0])
  ws = virtual_workspace(n, device=device, config=config)
  call = jax.ffi.ffi_call("jaxll_virtual_all_reduce" + ("_graph" if command_buffer else ""),
                          jax.ShapeDtypeStruct(x.shape, x.dtype))
  return call(x, workspace=np.int64(ws.id), algorithm=np.int64(algorithms.SPECS[name].code),
              op=np.int64(algorithms.OP_CODES[op]), skip_rank=np.int64(_skip_rank),
              one_launch=np.int64(bool(one_launch)))


# Element types of the fused all-reduce + residual + RMSNorm kernel.
_FUSED_DTYPES = ("float32", "bfloat16", "float16")


def _check_protocol(protocol: str) -> None:
  codes = algorithms.RMSNORM_PROTOCOL_CODES
  if protocol != "auto" and protocol not in codes:
    raise ValueError(f"protocol must be one of {['auto', *sorted(codes)]}, got {protocol!r}")


def _protocol_code(ws: workspace.Workspace, protocol: str, dtype, shape) -> int:
  """The exchange code of `protocol` for a fused call of `shape` (tokens...,
  hidden) per rank on `ws`: the named one, or for "auto" the one jaxll's
  lowering would choose (jaxll.choice.fused_exchange)."""
  _check_protocol(protocol)
  codes = algorithms.RMSNORM_PROTOCOL_CODES
  if protocol != "auto":
    return codes[protocol]
  dtype = np.dtype(dtype)
  hidden = int(shape[-1])
  tokens = int(np.prod(shape)) // max(hidden, 1)
  nbytes = tokens * hidden * dtype.itemsize

  def plan_of(exchange: str) -> dict:
    return ext.rmsnorm_plan(ws.id, algorithms.DTYPE_CODES[dtype.name], tokens, hidden,
                            codes[exchange])

  n = len(ws.ordinals[0])
  return codes[choice.fused_exchange(n, nbytes, hidden * dtype.itemsize, plan_of)[0]]


def rmsnorm_plan(nranks: int, tokens: int, hidden: int, *, dtype="bfloat16",
                 protocol: str = "auto", device=None,
                 config: workspace.WorkspaceConfig | None = None) -> dict:
  """How the fused kernel cuts a call of ``tokens x hidden`` per rank on
  `nranks` virtual ranks: the native plan (blocks, threads, segments,
  rows_at_once, waves, cluster, lean, twoshot, protocol, units, pdl; blocks 0
  where the named `protocol` cannot serve the call) and ``exchange``, the
  protocol it runs on (for ``"auto"``, the one jaxll's lowering chooses)."""
  dtype = np.dtype(jax.numpy.dtype(dtype))
  ws = virtual_workspace(nranks, device=device, config=config)
  code = _protocol_code(ws, protocol, dtype, (tokens, hidden))
  plan = dict(ext.rmsnorm_plan(ws.id, algorithms.DTYPE_CODES[dtype.name], int(tokens),
                               int(hidden), code))
  plan["exchange"] = next(n for n, c in algorithms.RMSNORM_PROTOCOL_CODES.items() if c == code)
  return plan


def virtual_fused_rmsnorm(x, residual, weight, *, eps: float = 1e-6, device=None,
                          config: workspace.WorkspaceConfig | None = None,
                          command_buffer: bool = False, protocol: str = "auto",
                          one_launch: bool = False):
  """The fused all-reduce + residual + RMSNorm kernel on N virtual ranks, as one
  XLA custom call (composes with ``jax.jit``, as :func:`virtual_all_reduce`):
  ``x`` and ``residual`` are ``(N, ..., hidden)`` (row r is rank r's),
  ``weight`` is ``(hidden,)``, all of one dtype (float32, bfloat16, float16).
  Returns ``(normed, new_residual)``, each of x's shape: rank r's outputs in row
  r (bitwise equal across rows where the residual rows are equal).
  ``command_buffer`` as for :func:`virtual_all_reduce`; ``protocol``: the
  kernel's exchange, ``"auto"`` (the kernel's choice), ``"ll"``,
  ``"sentinel"``, ``"twoshot_ll"`` or ``"twoshot_sentinel"`` (a call the named
  exchange cannot serve fails when it runs); ``one_launch`` as for
  :func:`virtual_all_reduce`."""
  _check_protocol(protocol)
  x, residual, weight = (jax.numpy.asarray(a) for a in (x, residual, weight))
  if x.ndim < 2:
    raise ValueError("virtual_fused_rmsnorm needs x of shape (N, ..., hidden)")
  if residual.shape != x.shape or weight.shape != x.shape[-1:]:
    raise ValueError(f"residual must have x's shape {x.shape} and weight {x.shape[-1:]}, got "
                     f"{residual.shape} and {weight.shape}")
  if not (x.dtype == residual.dtype == weight.dtype) or x.dtype.name not in _FUSED_DTYPES:
    raise TypeError(f"x, residual and weight must share one of float32, bfloat16, float16; got "
                    f"{x.dtype}, {residual.dtype}, {weight.dtype}")
  ws = virtual_workspace(int(x.shape[0]), device=device, config=config)
  code = _protocol_code(ws, protocol, x.dtype, x.shape[1:])
  out = jax.ShapeDtypeStruct(x.shape, x.dtype)
  call = jax.ffi.ffi_call("jaxll_virtual_all_reduce_rmsnorm" + ("_graph" if command_buffer else ""),
                          (out, out))
  return tuple(call(x, residual, weight, workspace=np.int64(ws.id), eps=np.float32(eps),
                    protocol=np.int32(code), one_launch=np.int64(bool(one_launch))))


def virtual_all_reduce_rmsnorm(x, residual, weight, *, eps: float = 1e-6, device=None,
                               config: workspace.WorkspaceConfig | None = None,
                               absent_rank: int | None = None, late_rank: int | None = None,
                               delay_us: int = 0, protocol: str = "auto"):
  """The fused all-reduce + residual + RMSNorm kernel on N virtual ranks:
  ``x`` is ``(N, tokens, hidden)`` (row r is rank r's partial sums), residual
  ``(tokens, hidden)`` and weight ``(hidden,)`` of x's dtype (float32,
  bfloat16, float16), numpy arrays. Returns numpy ``(normed, new_residual)``,
  each ``(N, tokens, hidden)``: every rank's outputs (bitwise equal across
  ranks). Raises RuntimeError with the recorded error if a rank gave up.

  Fault injection: with ``absent_rank`` set, that rank makes no call, the
  others give up after the workspace's timeout, and the return value is
  ``(normed, new_residual, error)`` with the first recorded error (the absent
  rank's outputs stay zero); nothing is raised. With ``late_rank`` set, that
  rank's call is queued 2 ms after the others', behind a one-thread kernel of
  ``delay_us`` microseconds (it must still find room on the GPU).

  ``protocol``: the kernel's exchange, ``"auto"`` (the kernel's choice),
  ``"ll"``, ``"sentinel"``, ``"twoshot_ll"`` or ``"twoshot_sentinel"``
  (ValueError where the named exchange cannot serve)."""
  _check_protocol(protocol)
  x = np.asarray(x)
  dtype = np.dtype(x.dtype)
  if x.ndim != 3:
    raise ValueError("virtual_all_reduce_rmsnorm needs x of shape (N, tokens, hidden)")
  n, tokens, hidden = x.shape
  for name, r in (("absent_rank", absent_rank), ("late_rank", late_rank)):
    if r is not None and not 0 <= int(r) < n:
      raise ValueError(f"{name} must be a rank of the {n}, got {r}")
  residual = np.ascontiguousarray(np.asarray(residual, dtype))
  weight = np.ascontiguousarray(np.asarray(weight, dtype))
  if residual.shape != (tokens, hidden) or weight.shape != (hidden,):
    raise ValueError("residual must be (tokens, hidden) and weight (hidden,)")
  ws = virtual_workspace(n, device=device, config=config)
  code = _protocol_code(ws, protocol, dtype, (tokens, hidden))
  normed, new_residual, error = _tools.virtual_rmsnorm(
      ws.id, algorithms.DTYPE_CODES[dtype.name], np.ascontiguousarray(x).tobytes(),
      residual.tobytes(), weight.tobytes(), int(tokens), int(hidden), float(eps),
      -1 if absent_rank is None else int(absent_rank),
      -1 if late_rank is None else int(late_rank), int(delay_us), code)
  shape = (n, tokens, hidden)
  out = (np.frombuffer(normed, dtype).reshape(shape).copy(),
         np.frombuffer(new_residual, dtype).reshape(shape).copy())
  return out if absent_rank is None else out + (error,)


# Call-signature collective codes of the gather/scatter kernels (from the native table).
_ALL_GATHER = algorithms.COLLECTIVE_CODES["all_gather"]
_REDUCE_SCATTER = algorithms.COLLECTIVE_CODES["psum_scatter"]


def _gather_scatter(code, x, count, segment, algorithm, device, config):
  x = np.ascontiguousarray(x)
  dtype = np.dtype(x.dtype)
  if dtype.name not in algorithms.DTYPE_CODES:
    raise TypeError(f"no kernel for {dtype}")
  _check_gather_scatter_algorithm(algorithm)
  ws = virtual_workspace(x.shape[0], device=device, config=config)
  y, error = _tools.virtual_gather_scatter(ws.id, code, algorithms.SPECS[algorithm].code,
                                        algorithms.DTYPE_CODES[dtype.name], x.tobytes(),
                                        int(count), int(segment))
  if error:
    raise RuntimeError(error)
  return np.frombuffer(y, dtype).copy()


def virtual_all_gather(x, *, axis: int = 0, tiled: bool = False, algorithm: str = "oneshot_ll",
                       device=None, config: workspace.WorkspaceConfig | None = None):
  """The all-gather kernel on N virtual ranks: ``x[r]`` is rank r's input
  (float32, bfloat16, float16 or int32), gathered as ``jax.lax.all_gather(
  x[r], axis=axis, tiled=tiled)`` would. Returns every rank's result, stacked:
  ``(N, *gathered shape)``; for ``x`` of shape ``(N, count)`` and the defaults,
  ``(N, N, count)``. Raises RuntimeError with the recorded error if a rank gave
  up, ValueError where the kernel cannot cut the pieces (gather_scatter.h)."""
  from jaxll.gather_scatter import segment_of
  x = np.asarray(x)
  if x.ndim < 2:
    raise ValueError("virtual_all_gather needs x of shape (N, ...) with at least one "
                     "dimension per rank")
  n, shape = x.shape[0], x.shape[1:]
  dim = _dimension(axis, len(shape) if tiled else len(shape) + 1, "virtual_all_gather")
  out = list(shape)
  if tiled:
    out[dim] *= n
  else:
    out.insert(dim, n)
  count = int(np.prod(shape))
  y = _gather_scatter(_ALL_GATHER, x, count, segment_of("all_gather", shape, dim, n),
                      algorithm, device, config)
  return y.reshape(n, *out)


def virtual_psum_scatter(x, *, scatter_dimension: int = 0, tiled: bool = False,
                         algorithm: str = "oneshot_ll", device=None,
                         config: workspace.WorkspaceConfig | None = None):
  """The reduce-scatter kernel on N virtual ranks: ``x[r]`` is rank r's input,
  reduced and scattered as ``jax.lax.psum_scatter(x[r], scatter_dimension=,
  tiled=)`` would, the sum added in rank order. Returns every rank's piece,
  stacked: ``(N, *piece shape)``; for ``x`` of shape ``(N, N, count)`` and the
  defaults, ``(N, count)``. Raises RuntimeError with the recorded error if a
  rank gave up, ValueError where the kernel cannot cut the pieces."""
  from jaxll.gather_scatter import segment_of
  x = np.asarray(x)
  if x.ndim < 2:
    raise ValueError("virtual_psum_scatter needs x of shape (N, ...) with at least one "
                     "dimension per rank")
  n, shape = x.shape[0], x.shape[1:]
  dim = _dimension(scatter_dimension, len(shape), "virtual_psum_scatter")
  out = list(shape)
  if tiled:
    if out[dim] % n:
      raise ValueError(f"virtual_psum_scatter: dimension {dim} of size {out[dim]} is not a "
                       f"multiple of {n}")
    out[dim] //= n
  else:
    if out[dim] != n:
      raise ValueError(f"virtual_psum_scatter: dimension {dim} must have size {n}, "
                       f"got {out[dim]}")
    del out[dim]
  count = int(np.prod(shape)) // n
  y = _gather_scatter(_REDUCE_SCATTER, x, count, segment_of("psum_scatter", shape, dim, n),
                      algorithm, device, config)
  return y.reshape(n, *out)


def stress(nranks: int, counts, *, dtype="float32", op: str = "sum",
           algorithm="oneshot_ll", seed: int = 0, max_delay_us: int = 20,
           device=None, config: workspace.WorkspaceConfig | None = None) -> dict:
  """Runs ``len(counts)`` consecutive all-reduces (``counts[i]`` elements each)
  on every virtual rank, ranks racing each other (random delays of up to
  `max_delay_us`), and checks every output element and the guard elements
  around it on the device. `algorithm` is one name or a sequence of names (call
  i uses ``algorithm[i % len]``). Reproducible algorithms are checked bit for
  bit against the rank-order reduction; LL128-atomic against the float64 sum
  (within N * eps * sum|x|) and bitwise across ranks. Returns a dict with
  ``mismatches`` (0 if all correct), the first mismatch, ``error`` (a
  recorded timeout, if any) and ``rank_errors`` (every rank's raw error word, 0
  for none; ``jaxll.native.ext.decode_error`` splits one into kind, rank, peer,
  block and epoch).
  """
  names = [algorithm] if isinstance(algorithm, str) else list(algorithm)
  if not names:
    raise ValueError("stress: no algorithm given")
  names = [_kernel_name(a) for a in names]
  dtype = np.dtype(jax.numpy.dtype(dtype))
  for name in names:
    problem = algorithms.kernel_limits(name, dtype, op)
    if problem:
      raise TypeError(f"stress: {problem}")
  ws = virtual_workspace(nranks, device=device, config=config)
  counts = [int(c) for c in counts]
  if any(c <= 0 for c in counts):
    raise ValueError("stress: element counts must be positive")
  result = _tools.virtual_stress(ws.id, [algorithms.SPECS[a].code for a in names],
                                 algorithms.DTYPE_CODES[dtype.name], algorithms.OP_CODES[op],
                                 counts, int(seed), int(max_delay_us))
  words = {rank: word for _, rank, _, word, _ in ext.workspace_errors(ws.id)}
  result["rank_errors"] = [words.get(r, 0) for r in range(nranks)]
  return result


def calls(nranks: int, ranks, *, device=None,
          config: workspace.WorkspaceConfig | None = None) -> list[int]:
  """Fault injection: one all-reduce per virtual rank, each rank with its own
  arguments. ``ranks[r]`` is a dict for rank r with any of ``algorithm``
  (default "oneshot_ll"), ``dtype`` ("float32"), ``op`` ("sum"), ``count``
  (1024), ``skip`` (False: the rank makes no call, it never arrives) and
  ``delay_us`` (0: how long the rank's stream is held before its call) and
  ``delay_kernels`` (1: that many one-thread delay kernels of ``delay_us`` each
  in a row). A late rank's kernels are queued 2 ms after the other ranks' calls,
  so they have to start while those calls already spin on the GPU. Inputs
  are 0x11 bytes. Waits for every rank and returns, per rank, how many of its
  output elements hold the poison pattern (all-ones bits); errors the kernels
  recorded are in :func:`jaxll.errors`.
  """
  if len(ranks) != nranks:
    raise ValueError(f"calls: need one dict per rank ({nranks}), got {len(ranks)}")
  spec = []
  for r in ranks:
    unknown = set(r) - {"algorithm", "dtype", "op", "count", "skip", "delay_us", "delay_kernels"}
    if unknown:
      raise ValueError(f"calls: unknown keys {sorted(unknown)}")
    if int(r.get("delay_kernels", 1)) < 1:
      raise ValueError(f"calls: delay_kernels must be at least 1, got {r['delay_kernels']}")
    name = _kernel_name(r.get("algorithm", "oneshot_ll"))
    dtype = np.dtype(jax.numpy.dtype(r.get("dtype", "float32")))
    op = r.get("op", "sum")
    problem = algorithms.kernel_limits(name, dtype, op)
    if problem:
      raise TypeError(f"calls: {problem}")
    spec.append((algorithms.SPECS[name].code, algorithms.DTYPE_CODES[dtype.name],
                 algorithms.OP_CODES[op], int(r.get("count", 1024)), bool(r.get("skip", False)),
                 int(r.get("delay_us", 0)), int(r.get("delay_kernels", 1))))
  ws = virtual_workspace(nranks, device=device, config=config)
  return list(_tools.virtual_calls(ws.id, spec))


def kernel_time_us(nranks: int, nbytes: int, *, dtype="float32", op: str = "sum",
                   algorithm: str = "oneshot_ll", iters: int = 200, reps: int = 20,
                   device=None, config: workspace.WorkspaceConfig | None = None,
                   one_launch: bool = False) -> list[float]:
  """Kernel time per all-reduce call (µs), one value per repetition: a CUDA graph
  of `iters` back-to-back calls on every virtual rank, replayed `reps` times
  (``one_launch``: each call every rank's in one launch, as
  :func:`virtual_all_reduce` with ``one_launch``; subtract
  ``graph_floor_us(..., one_launch=True)``)."""
  name = _kernel_name(algorithm)
  dtype = np.dtype(jax.numpy.dtype(dtype))
  problem = algorithms.kernel_limits(name, dtype, op)
  if problem:
    raise TypeError(f"kernel_time_us: {problem}")
  ws = virtual_workspace(nranks, device=device, config=config)
  count = max(1, nbytes // dtype.itemsize)
  return list(_tools.virtual_bench(ws.id, algorithms.SPECS[name].code,
                                algorithms.DTYPE_CODES[dtype.name], algorithms.OP_CODES[op],
                                count, int(iters), int(reps), bool(one_launch)))


def rmsnorm_kernel_time_us(nranks: int, tokens: int, hidden: int, *, dtype="bfloat16",
                           iters: int = 200, reps: int = 20, device=None,
                           config: workspace.WorkspaceConfig | None = None,
                           protocol: str = "auto", one_launch: bool = False) -> list[float]:
  """Kernel time per call (µs, one value per repetition) of the fused
  all-reduce + residual + RMSNorm kernel, ``tokens x hidden`` per rank, measured
  as :func:`kernel_time_us` measures the all-reduce (subtract
  :func:`graph_floor_us` for the kernel's own time). ``protocol`` as for
  :func:`virtual_all_reduce_rmsnorm`, ``one_launch`` as for
  :func:`kernel_time_us`."""
  _check_protocol(protocol)
  dtype = np.dtype(jax.numpy.dtype(dtype))
  if dtype.name not in _FUSED_DTYPES:
    raise TypeError(f"rmsnorm_kernel_time_us: no fused kernel for {dtype}")
  ws = virtual_workspace(nranks, device=device, config=config)
  code = _protocol_code(ws, protocol, dtype, (tokens, hidden))
  return list(_tools.virtual_rmsnorm_bench(ws.id, algorithms.DTYPE_CODES[dtype.name], int(tokens),
                                        int(hidden), int(iters), int(reps), code,
                                        bool(one_launch)))


def gather_scatter_time_us(nranks: int, nbytes: int, *, collective: str = "all_gather",
                           dtype="float32", algorithm: str = "oneshot_ll", iters: int = 200,
                           reps: int = 20, segment_bytes: int = 0, device=None,
                           config: workspace.WorkspaceConfig | None = None) -> list[float]:
  """Kernel time per all-gather or reduce-scatter call (``collective``
  "all_gather" or "psum_scatter"; µs, one value per repetition), pieces of
  ``nbytes`` per rank, measured as :func:`kernel_time_us` measures the
  all-reduce (subtract :func:`graph_floor_us` for the kernel's own time).
  ``segment_bytes``: the pieces lie in segments of that many bytes, as along
  a dimension past the first (0: one segment, as along dimension 0)."""
  codes = {"all_gather": _ALL_GATHER, "psum_scatter": _REDUCE_SCATTER}
  if collective not in codes:
    raise ValueError(f"collective must be all_gather or psum_scatter, got {collective!r}")
  _check_gather_scatter_algorithm(algorithm)
  dtype = np.dtype(jax.numpy.dtype(dtype))
  ws = virtual_workspace(nranks, device=device, config=config)
  count = max(1, nbytes // dtype.itemsize)
  segment = segment_bytes // dtype.itemsize
  return list(_tools.virtual_gather_scatter_bench(
      ws.id, codes[collective], algorithms.SPECS[algorithm].code,
      algorithms.DTYPE_CODES[dtype.name], count, int(iters), int(reps), segment=segment))


def graph_floor_us(nranks: int, *, iters: int = 200, reps: int = 20, device=None,
                   config: workspace.WorkspaceConfig | None = None,
                   one_launch: bool = False) -> list[float]:
  """Time per round of the same graph with an empty kernel per rank (with
  ``one_launch``: one empty kernel per round): the floor that graph-node
  launches put under :func:`kernel_time_us`."""
  ws = virtual_workspace(nranks, device=device, config=config)
  return list(_tools.virtual_floor(ws.id, int(iters), int(reps), bool(one_launch)))


def probe_l2_fence_us(ordinal: int, iters: int = 20000, with_store: bool = False) -> float:
  """Microseconds per ``__threadfence()`` in a one-thread loop on CUDA device
  `ordinal` (the paper's L2 round trip), or per store + fence."""
  _need_kernels()
  return _tools.probe_l2_fence_us(int(ordinal), int(iters), bool(with_store))


def probe_pingpong_one_way_us(ordinal_a: int, ordinal_b: int, iters: int = 20000) -> float:
  """One-way latency in microseconds of a flag ping-pong between a block on
  each of two CUDA devices (the same device: two blocks on two streams)."""
  _need_kernels()
  return _tools.probe_pingpong_one_way_us(int(ordinal_a), int(ordinal_b), int(iters))


def set_epochs(ws: workspace.Workspace, epoch: int) -> None:
  """Sets every block's epoch of every rank of virtual workspace `ws` (devices
  idle first), as if that many rounds had run: crosses the 32-bit flag wrap
  and the LL16 refresh without 2^30 calls."""
  _need_kernels()
  _tools.set_epochs(ws.id, int(epoch))


def device_ordinal(device=None) -> int:
  """The device ordinal XLA passes to FFI handlers on `device` (it must equal
  ``device.local_hardware_id`` for jaxll's per-device state to be right)."""
  _need_kernels()
  dev = _cuda_device(device)
  call = jax.ffi.ffi_call("jaxll_device_ordinal", jax.ShapeDtypeStruct((), np.int32))
  with jax.default_device(dev):
    return int(jax.jit(call)())
