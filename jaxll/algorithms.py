"""The algorithms an all-reduce can lower to, and the automatic choice between them.

Everything about which algorithm serves which call lives here: the kernel
catalogue (what each one supports) and the ``auto`` choice, which reads a table
of measurements (``jaxll/auto_table.json`` by default). The lowering rule in
``jaxll/lowering.py`` asks :func:`choose_auto` and :func:`kernel_limits` and
nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading

import numpy as np

AUTO = "auto"
XLA = "xla"
ONESHOT_LL = "oneshot_ll"
ONESHOT_SENTINEL = "oneshot_sentinel"
TWOSHOT_LL = "twoshot_ll"
TWOSHOT_SENTINEL = "twoshot_sentinel"
TWOSHOT_LL128_ATOMIC = "twoshot_ll128_atomic"
ONESHOT_BARRIER = "oneshot_barrier"
TWOSHOT_BARRIER = "twoshot_barrier"

_OPS = ("sum", "max", "min")
_DTYPES = ("float32", "bfloat16", "float16", "int32")
_WIDTH = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4}
# the fused all_reduce_rmsnorm kernel's exchange (auto: the kernel chooses)
_RMSNORM_PROTOCOLS = ("auto", "ll", "sentinel", "twoshot_ll", "twoshot_sentinel")
_KERNEL_NAMES = (ONESHOT_LL, ONESHOT_SENTINEL, TWOSHOT_LL, TWOSHOT_SENTINEL,
                 TWOSHOT_LL128_ATOMIC, ONESHOT_BARRIER, TWOSHOT_BARRIER)
# the call signature's collective field, and the error word's kind field
_COLLECTIVES = ("all_reduce", "all_reduce_rmsnorm", "all_gather", "psum_scatter")
_ERROR_KINDS = ("none", "timeout", "mismatch", "freed", "not_started")


def _codes() -> dict:
  """The codes the FFI handlers take, from the native side's one table
  (ffi/kernels/all_reduce.h, ``_jaxll.codes()``). Without the extension (an
  install without nvcc) nothing is ever passed to a handler: placeholder codes
  (kernels nonzero, XLA zero) keep the catalogue's shape."""
  from jaxll._ext import ext
  if ext is None:
    return {"algorithms": {XLA: 0, **{n: i + 1 for i, n in enumerate(_KERNEL_NAMES)}},
            "dtypes": {n: i for i, n in enumerate(_DTYPES)},
            "ops": {n: i for i, n in enumerate(_OPS)},
            "rmsnorm_protocols": {n: i for i, n in enumerate(_RMSNORM_PROTOCOLS)},
            "rmsnorm_refusals": {n: "no kernels in this install" for n in _RMSNORM_PROTOCOLS},
            "collectives": {n: i for i, n in enumerate(_COLLECTIVES)},
            "error_kinds": {n: i for i, n in enumerate(_ERROR_KINDS)}}
  native = ext.codes()
  for kind, names in (("algorithms", (XLA,) + _KERNEL_NAMES), ("dtypes", _DTYPES),
                      ("ops", _OPS), ("rmsnorm_protocols", _RMSNORM_PROTOCOLS),
                      ("rmsnorm_refusals", _RMSNORM_PROTOCOLS), ("collectives", _COLLECTIVES),
                      ("error_kinds", _ERROR_KINDS)):
    if set(native.get(kind, ())) != set(names):
      raise ImportError(f"jaxll: the compiled extension's {kind} {sorted(native.get(kind, ()))} "
                        f"differ from the Python package's {sorted(names)}: rebuild jaxll")
  return native


_NATIVE = _codes()
#: Codes the FFI handlers take, by name (from the native side).
OP_CODES: dict[str, int] = dict(_NATIVE["ops"])
DTYPE_CODES: dict[str, int] = dict(_NATIVE["dtypes"])
_ALGORITHM_CODES: dict[str, int] = dict(_NATIVE["algorithms"])
#: The fused kernel's protocol codes, by name ("auto", "ll", "sentinel",
#: "twoshot_ll", "twoshot_sentinel").
RMSNORM_PROTOCOL_CODES: dict[str, int] = dict(_NATIVE["rmsnorm_protocols"])
#: Why each of those protocols, asked for, may refuse a call (the native
#: side's text, the one its errors give).
RMSNORM_REFUSALS: dict[str, str] = dict(_NATIVE["rmsnorm_refusals"])
#: The call signature's collective codes ("all_reduce", "all_reduce_rmsnorm",
#: "all_gather", "psum_scatter"), which the gather/scatter handlers also take.
COLLECTIVE_CODES: dict[str, int] = dict(_NATIVE["collectives"])
#: The error word's kinds ("none", "timeout", "mismatch", "freed", "not_started").
ERROR_KIND_CODES: dict[str, int] = dict(_NATIVE["error_kinds"])


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  name: str
  code: int  # passed to the FFI handler; 0 means XLA's own all-reduce
  ops: frozenset[str]
  dtypes: frozenset[str]
  auto: bool           # may "auto" pick it
  reproducible: bool   # bitwise identical results from run to run
  summary: str


_ALL_OPS = frozenset(OP_CODES)
_SUM = frozenset({"sum"})
_ALL_DTYPES = frozenset(DTYPE_CODES)
_FLOATS = frozenset({"float32", "bfloat16", "float16"})


def _spec(name, *rest) -> AlgorithmSpec:
  return AlgorithmSpec(name, _ALGORITHM_CODES[name], *rest)


SPECS: dict[str, AlgorithmSpec] = {s.name: s for s in [
    _spec(XLA, _ALL_OPS, frozenset(), True, True,
          "XLA's own all-reduce (NCCL on GPUs); serves every dtype and size"),
    _spec(ONESHOT_LL, _ALL_OPS, _ALL_DTYPES, True, True,
          "one-shot push of LL16 packets (8 B data + flag per 16 B store); "
          "the smallest messages"),
    _spec(ONESHOT_SENTINEL, _ALL_OPS, _FLOATS, True, True,
          "one-shot push of raw data into sentinel-filled scratch (full bandwidth)"),
    _spec(TWOSHOT_LL, _ALL_OPS, _ALL_DTYPES, True, True,
          "reduce-scatter + all-gather over LL16 packets"),
    _spec(TWOSHOT_SENTINEL, _ALL_OPS, _FLOATS, True, True,
          "reduce-scatter + all-gather over sentinel scratch; mid-size and large "
          "messages"),
    _spec(TWOSHOT_LL128_ATOMIC, _SUM, _FLOATS, False, False,
          "reduce-scatter by vector atomic adds into 128 B lines with an arrival "
          "counter, all-gather over sentinel scratch; opt-in: sums vary from run "
          "to run (identical across ranks), f16/bf16 accumulate in their own "
          "precision, f32 subnormals flush to zero, -0.0 sums to +0.0"),
    _spec(ONESHOT_BARRIER, _SUM, _ALL_DTYPES, False, True,
          "baseline: one-shot with two explicit cross-rank flag barriers per round"),
    _spec(TWOSHOT_BARRIER, _SUM, _ALL_DTYPES, False, True,
          "baseline: two-shot with three explicit cross-rank flag barriers per "
          "round"),
]}

#: Every name ``jaxll.all_reduce(algorithm=...)`` accepts.
ALGORITHMS: tuple[str, ...] = (AUTO,) + tuple(SPECS)
#: The jaxll kernels (everything but XLA).
KERNELS: tuple[str, ...] = tuple(n for n, s in SPECS.items() if s.code)


def kernel_limits(name: str, dtype: np.dtype, op: str) -> str | None:
  """Why kernel `name` cannot serve (dtype, op), or None if it can."""
  spec = SPECS[name]
  dtype_name = np.dtype(dtype).name
  if dtype_name not in spec.dtypes:
    return (f"{name} has no kernel for {dtype_name} "
            f"(it supports {', '.join(sorted(spec.dtypes))})")
  if op not in spec.ops:
    return f"{name} does not support op={op!r} (it supports {', '.join(sorted(spec.ops))})"
  return None


# --- The automatic choice -----------------------------------------------------
#
# The table maps (group size, element type, message bytes per rank) to the
# algorithms ranked fastest first, as measured by ``benchmarks/tune_auto.py``
# (kernel time on virtual ranks); ``auto`` takes the first one that supports the
# call's dtype and op. Above ``xla_above_bytes`` (per group size) XLA's
# all-reduce serves the call. Format of the JSON document:
#
#   {"source": "...", "xla_above_bytes": {"default": B, "8": B8, ...},
#    "tables": {"<N>": {"<dtype>": [[max_bytes, ["algo", ...]], ...]}}}
#
# Group sizes without a table use the nearest smaller one that has one (else
# the smallest); dtypes without one use the table of a dtype of equal width.
# Overrides: JAXLL_AUTO_TABLE=/path/to/table.json, set_auto_table(), and
# JAXLL_AUTO_MAX_BYTES (replaces every xla_above_bytes).

DEFAULT_TABLE_PATH = os.path.join(os.path.dirname(__file__), "auto_table.json")
_table_lock = threading.Lock()
_table: dict | None = None


def _check_table(table: dict) -> dict:
  try:
    xla = table["xla_above_bytes"]
    int(xla["default"])
    for n, per_dtype in table["tables"].items():
      int(n)
      for dtype, rows in per_dtype.items():
        if dtype not in DTYPE_CODES:
          raise ValueError(f"unknown dtype {dtype!r} (known: {sorted(DTYPE_CODES)})")
        last = 0
        for max_bytes, ranked in rows:
          if int(max_bytes) <= last:
            raise ValueError(f"rows of N={n} {dtype} must grow in max_bytes")
          last = int(max_bytes)
          for name in ranked:
            if name not in SPECS or name == XLA:
              raise ValueError(f"unknown kernel {name!r} in N={n} {dtype}")
  except (KeyError, TypeError) as e:
    raise ValueError(f"malformed auto table: {e!r}") from None
  return table


def load_auto_table(path: str | None = None) -> dict:
  """Reads an auto table (default: $JAXLL_AUTO_TABLE, else the shipped one)."""
  path = path or os.environ.get("JAXLL_AUTO_TABLE") or DEFAULT_TABLE_PATH
  try:
    with open(path) as f:
      return _check_table(json.load(f))
  except OSError as e:
    raise ValueError(f"auto table {path} (JAXLL_AUTO_TABLE?): {e.strerror or e}") from None
  except (ValueError, json.JSONDecodeError) as e:
    raise ValueError(f"auto table {path}: {e}") from None


def auto_table() -> dict:
  """The table ``auto`` uses now."""
  global _table
  with _table_lock:
    if _table is None:
      _table = load_auto_table()
    return _table


def set_auto_table(table: dict | str | None) -> None:
  """Replaces the auto table (a dict, a path to a JSON file, or None to go back
  to the default). Affects call sites lowered from now on."""
  global _table
  with _table_lock:
    if table is None:
      _table = None
    elif isinstance(table, str):
      _table = load_auto_table(table)
    else:
      _table = _check_table(table)


def auto_max_bytes(group_size: int) -> int:
  """Largest message (bytes per rank) ``auto`` gives a jaxll kernel."""
  from jaxll import settings
  value = settings.env_bytes("JAXLL_AUTO_MAX_BYTES")
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
  return list(rows[-1][1]) if rows else [ONESHOT_LL]


def choose_auto(group_size: int, nbytes: int, dtype: np.dtype, op: str) -> tuple[str, str]:
  """Returns (algorithm, reason) for ``algorithm="auto"``."""
  if group_size == 1:
    return XLA, "group of one device: XLA elides the all-reduce"
  limit = auto_max_bytes(group_size)
  if nbytes > limit:
    return XLA, f"{nbytes} bytes > auto crossover {limit} bytes"
  problems = []
  for name in ranked_kernels(group_size, nbytes, dtype):
    if not SPECS[name].auto:
      continue
    problem = kernel_limits(name, dtype, op)
    if problem is None:
      return name, (f"auto table: fastest kernel for N={group_size}, {np.dtype(dtype).name}, "
                    f"{nbytes} bytes that supports op={op!r}")
    problems.append(problem)
  return XLA, "no kernel in the auto table serves it: " + "; ".join(problems)
