"""``algorithm="auto"``: which kernel serves a call, or XLA's collective.

The one chooser of jaxll's collectives. It decides from tables of measurements
in ``jaxll/tuning/`` (each says where its figures come from):

- ``all_reduce.json``: per group size, element type and message size, the
  all-reduce kernels ranked by measured kernel time, and the crossover to XLA
  (``xla_above_bytes``). Replace it with ``JAXLL_AUTO_TABLE=/path/table.json``
  or :func:`set_auto_table`; ``JAXLL_AUTO_MAX_BYTES`` sets the crossover alone.
- ``gather_scatter.json``: from which piece size the sentinel kernel beats LL16,
  per collective, element width and group size.
- ``all_reduce_rmsnorm.json``: up to which size the fused kernel beats the
  composition, and which exchange the fused kernel takes.

Table format of ``all_reduce.json``::

  {"source": "...", "xla_above_bytes": {"default": B, "8": B8, ...},
   "tables": {"<N>": {"<dtype>": [[max_bytes, ["algo", ...]], ...]}}}

Group sizes without a table use the nearest smaller one that has one (else the
smallest); dtypes without one use the table of a dtype of equal width.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from typing import Callable

import numpy as np

from jaxll import algorithms, settings

TUNING_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuning")
DEFAULT_TABLE_PATH = os.path.join(TUNING_DIR, "all_reduce.json")
_WIDTH = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4}


@functools.cache
def tuning(name: str) -> dict:
  """The tuning table ``jaxll/tuning/<name>.json``."""
  with open(os.path.join(TUNING_DIR, f"{name}.json")) as f:
    return json.load(f)


# --- The all-reduce ---------------------------------------------------------------

_table_lock = threading.Lock()
_table: dict | None = None


def _check_table(table: dict) -> dict:
  try:
    int(table["xla_above_bytes"]["default"])
    for n, per_dtype in table["tables"].items():
      int(n)
      for dtype, rows in per_dtype.items():
        if dtype not in algorithms.DTYPE_CODES:
          raise ValueError(f"unknown dtype {dtype!r} (known: {sorted(algorithms.DTYPE_CODES)})")
        last = 0
        for max_bytes, ranked in rows:
          if int(max_bytes) <= last:
            raise ValueError(f"rows of N={n} {dtype} must grow in max_bytes")
          last = int(max_bytes)
          for name in ranked:
            if name not in algorithms.SPECS or name == algorithms.XLA:
              raise ValueError(f"unknown kernel {name!r} in N={n} {dtype}")
  except (KeyError, TypeError) as e:
    raise ValueError(f"malformed auto table: {e!r}") from None
  return table


def load_auto_table(path: str | None = None) -> dict:
  """Reads an all-reduce table (default: $JAXLL_AUTO_TABLE, else the shipped one)."""
  path = path or settings.auto_table_path() or DEFAULT_TABLE_PATH
  try:
    with open(path) as f:
      return _check_table(json.load(f))
  except OSError as e:
    raise ValueError(f"auto table {path} (JAXLL_AUTO_TABLE?): {e.strerror or e}") from None
  except (ValueError, json.JSONDecodeError) as e:
    raise ValueError(f"auto table {path}: {e}") from None


def auto_table() -> dict:
  """The all-reduce table ``auto`` uses now."""
  global _table
  with _table_lock:
    if _table is None:
      _table = load_auto_table()
    return _table


def set_auto_table(table: dict | str | None) -> None:
  """Replaces the all-reduce table (a dict, a path to a JSON file, or None to
  go back to the default). Affects call sites lowered from now on."""
  global _table
  with _table_lock:
    if table is None:
      _table = None
    elif isinstance(table, str):
      _table = load_auto_table(table)
    else:
      _table = _check_table(table)


def auto_max_bytes(group_size: int) -> int:
  """Largest message (bytes per rank) ``auto`` gives a jaxll kernel: the
  crossover to XLA's collectives (all-reduce, all-gather, reduce-scatter)."""
  value = settings.auto_max_bytes()
  if value is not None:
    return value
  xla = auto_table()["xla_above_bytes"]
  return int(xla.get(str(group_size), xla["default"]))


def _rows_for(table: dict, group_size: int, dtype: np.dtype) -> list:
  tables = table["tables"]
  sizes = sorted(int(n) for n in tables)
  if not sizes:
    return []
  below = [n for n in sizes if n <= group_size]
  per_dtype = tables[str(below[-1] if below else sizes[0])]
  name = np.dtype(dtype).name
  if name in per_dtype:
    return per_dtype[name]
  width = np.dtype(dtype).itemsize
  for other, rows in sorted(per_dtype.items()):
    if _WIDTH[other] == width:
      return rows
  return next(iter(per_dtype.values()), [])


def ranked_kernels(group_size: int, nbytes: int, dtype: np.dtype) -> list[str]:
  """The table's ranking (fastest first) for a message of `nbytes` per rank."""
  rows = _rows_for(auto_table(), group_size, dtype)
  for max_bytes, ranked in rows:
    if nbytes <= int(max_bytes):
      return list(ranked)
  return list(rows[-1][1]) if rows else [algorithms.ONESHOT_LL]


def choose_auto(group_size: int, nbytes: int, dtype: np.dtype, op: str,
                deterministic: bool = False) -> tuple[str, str]:
  """(algorithm, reason) of ``jaxll.all_reduce(algorithm="auto")``; with
  `deterministic`, of its deterministic mode: the table's fastest kernel at
  every size (no crossover to XLA), XLA only for a group of one device (where
  the result is the input on every path)."""
  if group_size == 1:
    return algorithms.XLA, ("group of one device: the result is the input, on every path"
                            if deterministic else "group of one device: XLA elides the all-reduce")
  limit = auto_max_bytes(group_size)
  if nbytes > limit and not deterministic:
    return algorithms.XLA, f"{nbytes} bytes per rank > auto crossover {limit} bytes"
  problems = []
  for name in ranked_kernels(group_size, nbytes, dtype):
    if not algorithms.SPECS[name].auto:
      continue
    problem = algorithms.kernel_limits(name, dtype, op)
    if problem is None:
      if deterministic:
        beyond = f", above auto's crossover {limit} bytes to XLA" if nbytes > limit else ""
        return name, (f"deterministic: the auto table's fastest kernel for N={group_size}, "
                      f"{np.dtype(dtype).name}, {nbytes} bytes{beyond} that supports op={op!r}")
      return name, (f"auto table: fastest kernel for N={group_size}, {np.dtype(dtype).name}, "
                    f"{nbytes} bytes that supports op={op!r}")
    problems.append(problem)
  return algorithms.XLA, "no kernel in the auto table serves it: " + "; ".join(problems)


# --- All-gather and reduce-scatter --------------------------------------------------

def sentinel_from(op: str, itemsize: int, group_size: int) -> tuple[int, int | None]:
  """(the group size measured, the piece size from which the sentinel kernel
  serves) for collective `op` of elements of `itemsize` bytes: the nearest
  measured group size below (else the smallest); None: LL16 at every size."""
  row = tuning("gather_scatter")["sentinel_from_bytes"][op]["4" if itemsize >= 4 else "2"]
  sizes = sorted(int(n) for n in row)
  measured = max([n for n in sizes if n <= group_size] or [sizes[0]])
  return measured, row[str(measured)]


def gather_scatter_auto(op: str, group_size: int, nbytes: int, dtype,
                        deterministic: bool = False) -> tuple[str, str]:
  """(algorithm, reason) of ``algorithm="auto"`` for an all-gather or a
  reduce-scatter (`op`) of an operand of `nbytes` per rank that a kernel can
  serve: XLA's collective where a rank would read more than the all-reduce's
  crossover (the gathered result, or the input it sums), else the faster of the
  LL16 and sentinel kernels as measured (LL16 for int32, which has no sentinel
  kernel). With `deterministic`, a reduce-scatter takes a kernel at every size
  (an all-gather moves bits: every path gives the same, so it chooses as auto)."""
  if group_size == 1:
    collective = "all-gather" if op == "all_gather" else "reduce-scatter"
    return algorithms.XLA, f"group of one device: XLA's {collective} is a copy"
  moved = nbytes * (group_size if op == "all_gather" else 1)
  limit = auto_max_bytes(group_size)
  if moved <= limit:
    within = f"{moved} bytes per rank <= auto crossover {limit} bytes"
  elif deterministic and op != "all_gather":
    within = f"{moved} bytes per rank, above auto's crossover {limit} bytes to XLA"
  else:
    return algorithms.XLA, f"{moved} bytes per rank > auto crossover {limit} bytes"
  piece = nbytes // (1 if op == "all_gather" else group_size)
  return _ll_or_sentinel(op, "gather_scatter table", dtype, group_size, piece, within)


def _ll_or_sentinel(table_op: str, label: str, dtype, group_size: int, piece: int,
                    within: str) -> tuple[str, str]:
  """The faster of the LL16 and sentinel kernels for pieces of `piece` bytes,
  by the gather_scatter table's row of `table_op` (LL16 for int32, which has no
  sentinel kernel), and why: `label`, then `within`."""
  dtype = np.dtype(dtype)
  if dtype.name not in ("float32", "bfloat16", "float16"):
    return algorithms.ONESHOT_LL, (f"{label}: LL16, the one kernel for "
                                   f"{dtype.name} (no sentinel kernel); {within}")
  measured, start = sentinel_from(table_op, dtype.itemsize, group_size)
  table = (f"{label}: fastest kernel for N={measured}, {dtype.itemsize}-byte "
           f"elements, pieces of {piece} bytes")
  if start is not None and piece >= start:
    return algorithms.ONESHOT_SENTINEL, f"{table} (sentinel from {start}); {within}"
  below = f"below {start}" if start is not None else "at every size"
  return algorithms.ONESHOT_LL, f"{table} (LL16 {below}); {within}"


def exchange_auto(op: str, group_size: int, nbytes: int, dtype) -> tuple[str, str]:
  """(algorithm, reason) of ``algorithm="auto"`` for a ppermute or an
  all-to-all (`op`) of an operand of `nbytes` per rank that a kernel can serve:
  XLA's collective where that is above the all-reduce's crossover, else the
  faster of the LL16 and sentinel kernels for the piece a peer gets (the whole
  operand for a ppermute, 1 / group size of it for an all-to-all), by the
  all-gather's measurements, whose kernel moves the same pieces the same way
  (LL16 for int32). Deterministic mode chooses alike: both move bits."""
  if group_size == 1:
    return algorithms.XLA, f"group of one device: XLA's {op} is a copy"
  limit = auto_max_bytes(group_size)
  if nbytes > limit:
    return algorithms.XLA, f"{nbytes} bytes per rank > auto crossover {limit} bytes"
  within = f"{nbytes} bytes per rank <= auto crossover {limit} bytes"
  piece = nbytes // (1 if op == "ppermute" else group_size)
  return _ll_or_sentinel("all_gather", "gather_scatter table (all_gather, the same pieces)",
                         dtype, group_size, piece, within)


def ragged_auto(group_size: int, nbytes: int) -> tuple[str, str]:
  """(algorithm, reason) of ``algorithm="auto"`` for a ragged all-to-all of an
  operand of `nbytes` per rank that the kernel can serve: XLA's op for a group
  of one device or above the all-reduce's crossover (the most a rank may
  send), else the LL16 kernel (the one ragged kernel). Deterministic mode
  chooses alike: both move bits."""
  if group_size == 1:
    return algorithms.XLA, "group of one device: XLA's ragged_all_to_all is a copy"
  limit = auto_max_bytes(group_size)
  if nbytes > limit:
    return algorithms.XLA, f"{nbytes} bytes of operand per rank > auto crossover {limit} bytes"
  return algorithms.ONESHOT_LL, (f"LL16, the ragged kernel's protocol; {nbytes} bytes of operand "
                                 f"per rank <= auto crossover {limit} bytes")


# --- The fused all-reduce + RMSNorm -------------------------------------------------

def fused_auto_max_bytes(group_size: int, sentinel: bool = False, twoshot: bool = False) -> int:
  """The most bytes of x per rank for which ``auto`` takes the fused kernel in
  a group of `group_size`, on the sentinel exchange or not, one-shot or two-shot."""
  t = tuning("all_reduce_rmsnorm")
  base = int(t["fused_max_bytes"])
  if twoshot:
    return max(base, int(t["fused_twoshot_max_bytes"].get(str(group_size), 0)))
  if sentinel:
    return max(base, int(t["fused_sentinel_max_bytes"].get(str(group_size), 0)))
  return base


def fused_auto_ceiling() -> int:
  """No group's fused limit is higher: beyond it ``auto`` is the composition at once."""
  t = tuning("all_reduce_rmsnorm")
  return max([int(t["fused_max_bytes"]), *map(int, t["fused_sentinel_max_bytes"].values()),
              *map(int, t["fused_twoshot_max_bytes"].values())])


def fused_exchange(group_size: int, nbytes: int, row_bytes: int,
                   plan_of: Callable[[str], dict]) -> tuple[str, dict]:
  """(exchange, its plan) the fused kernel takes for a call of `nbytes` of x
  per rank in rows of `row_bytes`: the two-shot kernel on sentinel in large
  groups from a size, the sentinel exchange where it measured faster, else
  LL16, or the two-shot kernel where LL16 would take the general kernel's
  rounds. `plan_of(exchange)` is the native plan on the call's workspace
  (blocks 0: that exchange cannot serve the call)."""
  t = tuning("all_reduce_rmsnorm")["exchange"]
  if group_size >= t["twoshot_from_ranks"] and nbytes >= t["twoshot_from_bytes"]:
    plan = plan_of("twoshot_sentinel")
    if plan["blocks"]:
      return "twoshot_sentinel", plan
  if (group_size == t["sentinel_any_size_ranks"] or nbytes >= t["sentinel_from_bytes"]
      or row_bytes >= t["sentinel_from_row_bytes"]):
    plan = plan_of("sentinel")
    if plan["blocks"]:
      return "sentinel", plan
  plan = plan_of("ll")
  if not plan["lean"] and nbytes >= t["sentinel_from_bytes"]:
    # (beyond the decode-shape cut the general kernel's rounds cost more than
    # the two-shot kernel's two exchanges)
    twoshot = plan_of("twoshot_sentinel")
    if twoshot["blocks"]:
      return "twoshot_sentinel", twoshot
  return "ll", plan


def check_tables() -> None:
  """Reads the table JAXLL_AUTO_TABLE names, if any, and every shipped tuning
  table; raises ValueError for a missing or malformed one."""
  if settings.auto_table_path():
    load_auto_table()
  for name in ("gather_scatter", "all_reduce_rmsnorm"):
    tuning(name)
