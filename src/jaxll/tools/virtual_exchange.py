"""The exchanges on N virtual ranks of one GPU: the ppermute, all-to-all and
ragged all-to-all kernels called on numpy arrays (one row per rank) and timed
in CUDA graphs. Part of ``jaxll.tools.testing``, which exports every function
here (see its docstring for what virtual ranks are)."""

from __future__ import annotations

import jax
import numpy as np

from jaxll import algorithms, workspace
from jaxll.tools.virtual_group import check_kernel_algorithm, dimension, tools, virtual_workspace


def virtual_ppermute(x, perm, *, algorithm: str = "oneshot_ll", absent: int = -1, device=None,
                     config: workspace.WorkspaceConfig | None = None):
  """The ppermute kernel on N virtual ranks: ``x[r]`` is rank r's input, sent
  as ``jax.lax.ppermute(x[r], perm=perm)`` would (a rank no pair sends to gets
  zeros). Returns every rank's result, stacked like ``x``. Rank `absent`
  (>= 0) makes no call: the others give up, and ``(outputs, error)`` comes
  back; else RuntimeError with the recorded error if a rank gave up."""
  from jaxll.exchange import normalized_perm
  x = np.ascontiguousarray(x)
  dtype = np.dtype(x.dtype)
  if dtype.name not in algorithms.DTYPE_CODES or x.ndim < 2:
    raise TypeError(f"virtual_ppermute needs x of shape (N, ...) of a kernel dtype, got "
                    f"{dtype} {x.shape}")
  check_kernel_algorithm(algorithm)
  n = x.shape[0]
  dests = [-1] * n
  for s, d in normalized_perm(perm, n):
    dests[s] = d
  ws = virtual_workspace(n, device=device, config=config)
  y, error = tools.virtual_ppermute(ws.id, algorithms.SPECS[algorithm].code,
                                     algorithms.DTYPE_CODES[dtype.name], x.tobytes(),
                                     int(x[0].size), dests, int(absent))
  y = np.frombuffer(y, dtype).copy().reshape(x.shape)
  if absent >= 0:
    return y, error
  if error:
    raise RuntimeError(error)
  return y


def virtual_all_to_all(x, split_axis: int, concat_axis: int, *, algorithm: str = "oneshot_ll",
                       absent: int = -1, device=None,
                       config: workspace.WorkspaceConfig | None = None):
  """The all-to-all kernel on N virtual ranks: ``x[r]`` is rank r's input,
  exchanged as ``jax.lax.all_to_all(x[r], split_axis=, concat_axis=,
  tiled=True)`` would (an untiled call is a tiled one between a reshape and a
  squeeze). Returns every rank's result, stacked. ``absent``
  as for :func:`virtual_ppermute`."""
  from jaxll.exchange import all_to_all_segments
  x = np.ascontiguousarray(x)
  dtype = np.dtype(x.dtype)
  if dtype.name not in algorithms.DTYPE_CODES or x.ndim < 2:
    raise TypeError(f"virtual_all_to_all needs x of shape (N, ...) of a kernel dtype, got "
                    f"{dtype} {x.shape}")
  check_kernel_algorithm(algorithm)
  n, shape = x.shape[0], list(x.shape[1:])
  split = dimension(split_axis, len(shape), "virtual_all_to_all")
  concat = dimension(concat_axis, len(shape), "virtual_all_to_all")
  if shape[split] % n:
    raise ValueError(f"dimension {split} ({shape[split]}) is not a multiple of {n}")
  count = int(np.prod(shape)) // n
  seg_in, seg_out = all_to_all_segments(shape, split, concat, n)
  out = list(shape)
  out[split] //= n
  out[concat] *= n
  ws = virtual_workspace(n, device=device, config=config)
  y, error = tools.virtual_all_to_all(ws.id, algorithms.SPECS[algorithm].code,
                                       algorithms.DTYPE_CODES[dtype.name], x.tobytes(), count,
                                       int(seg_in), int(seg_out), int(absent))
  y = np.frombuffer(y, dtype).copy().reshape(n, *out)
  if absent >= 0:
    return y, error
  if error:
    raise RuntimeError(error)
  return y


def exchange_time_us(nranks: int, nbytes: int, *, collective: str = "ppermute",
                     perm=None, dtype="float32", algorithm: str = "oneshot_ll",
                     iters: int = 200, reps: int = 20, device=None,
                     config: workspace.WorkspaceConfig | None = None) -> list[float]:
  """Kernel time per ppermute or all-to-all call (µs, one value per
  repetition), measured as :func:`kernel_time_us` measures the all-reduce:
  ``nbytes`` a peer gets (a ppermute's message; an all-to-all's piece, of N
  per rank). ``perm`` (ppermute): pairs (source, destination); the ring shift
  by one by default."""
  from jaxll.exchange import normalized_perm
  if collective not in ("ppermute", "all_to_all"):
    raise ValueError(f"collective must be ppermute or all_to_all, got {collective!r}")
  check_kernel_algorithm(algorithm)
  dtype = np.dtype(jax.numpy.dtype(dtype))
  ws = virtual_workspace(nranks, device=device, config=config)
  count = max(1, nbytes // dtype.itemsize)
  dests = [-1] * nranks
  if collective == "ppermute":
    perm = perm if perm is not None else [(i, (i + 1) % nranks) for i in range(nranks)]
    for s, d in normalized_perm(perm, nranks):
      dests[s] = d
  return list(tools.virtual_exchange_bench(
      ws.id, algorithms.COLLECTIVE_CODES[collective], algorithms.SPECS[algorithm].code,
      algorithms.DTYPE_CODES[dtype.name], count, dests, int(iters), int(reps)))


def _ragged_sizes(n: int, sizes) -> tuple[list[int], int]:
  """Every rank's four offset and size arrays (`sizes`: (N, 4, K) in
  ragged_all_to_all's order) flattened, and K."""
  a = np.asarray(sizes)
  if a.ndim != 3 or a.shape[:2] != (n, 4) or a.shape[2] == 0 or a.shape[2] % n:
    raise ValueError(f"sizes must be (N, 4, K) with K a multiple of N = {n} (input_offsets, "
                     f"send_sizes, output_offsets, recv_sizes of every rank), got {a.shape}")
  return [int(v) for v in a.astype(np.int64).ravel()], a.shape[2]


def virtual_ragged_all_to_all(operand, output, sizes, *, algorithm: str = "oneshot_ll",
                              absent: int = -1, device=None,
                              config: workspace.WorkspaceConfig | None = None):
  """The ragged all-to-all kernel on N virtual ranks: ``operand[r]`` and
  ``output[r]`` are rank r's, ``sizes[r]`` its ``(input_offsets, send_sizes,
  output_offsets, recv_sizes)`` (an (N, 4, K) array), exchanged as
  ``jax.lax.ragged_all_to_all`` would. Returns every rank's updated output,
  stacked like ``output``. ``absent`` as for :func:`virtual_ppermute`; a
  rank whose sizes or offsets do not fit records the error and poisons its
  output (RuntimeError with the message, or it comes back with ``absent``)."""
  operand = np.ascontiguousarray(operand)
  output = np.ascontiguousarray(output)
  dtype = np.dtype(operand.dtype)
  if (dtype.name not in algorithms.DTYPE_CODES or output.dtype != dtype or operand.ndim < 2 or
      output.ndim != operand.ndim or operand.shape[0] != output.shape[0] or
      operand.shape[2:] != output.shape[2:]):
    raise TypeError(f"virtual_ragged_all_to_all needs operand and output of shape (N, rows, "
                    f"...) of one kernel dtype, got {operand.dtype} {operand.shape} and "
                    f"{output.dtype} {output.shape}")
  n = operand.shape[0]
  flat, _ = _ragged_sizes(n, sizes)
  ws = virtual_workspace(n, device=device, config=config)
  row_elems = int(np.prod(operand.shape[2:], dtype=np.int64))
  y, error = tools.virtual_ragged_all_to_all(
      ws.id, algorithms.SPECS[algorithm].code, algorithms.DTYPE_CODES[dtype.name],
      operand.tobytes(), output.tobytes(), operand.shape[1], output.shape[1], row_elems, flat,
      int(absent))
  y = np.frombuffer(y, dtype).copy().reshape(output.shape)
  if absent >= 0:
    return y, error
  if error:
    raise RuntimeError(error)
  return y


def ragged_time_us(nranks: int, operand_rows: int, output_rows: int, row_elems: int, sizes, *,
                   dtype="bfloat16", algorithm: str = "oneshot_ll", iters: int = 200,
                   reps: int = 20, device=None,
                   config: workspace.WorkspaceConfig | None = None) -> list[float]:
  """Kernel time per ragged all-to-all call (µs, one value per repetition),
  measured as :func:`kernel_time_us` measures the all-reduce: every rank's
  operand of `operand_rows` and output of `output_rows` rows of `row_elems`
  elements, the slices `sizes` (as for :func:`virtual_ragged_all_to_all`)."""
  dtype = np.dtype(jax.numpy.dtype(dtype))
  flat, _ = _ragged_sizes(nranks, sizes)
  ws = virtual_workspace(nranks, device=device, config=config)
  return list(tools.virtual_ragged_bench(
      ws.id, algorithms.SPECS[algorithm].code, algorithms.DTYPE_CODES[dtype.name],
      int(operand_rows), int(output_rows), int(row_elems), flat, int(iters), int(reps)))
