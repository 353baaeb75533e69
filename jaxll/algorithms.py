"""The algorithms an all-reduce can lower to, and the automatic choice between them.

Everything about which algorithm serves which call lives here: the kernel
catalogue (what each one supports) and the ``auto`` table. The lowering rule in
``jaxll/lowering.py`` asks :func:`choose_auto` and :func:`kernel_limits` and
nothing else.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

AUTO = "auto"
XLA = "xla"
ONESHOT_LL = "oneshot_ll"

# Codes shared with the native side (ffi/kernels/all_reduce.h).
OP_CODES = {"sum": 0, "max": 1, "min": 2}
DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2, "int32": 3}


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  name: str
  code: int  # passed to the FFI handler; 0 means XLA's own all-reduce
  ops: frozenset[str]
  dtypes: frozenset[str]
  summary: str


_KERNEL_DTYPES = frozenset(DTYPE_CODES)

SPECS: dict[str, AlgorithmSpec] = {
    XLA: AlgorithmSpec(
        XLA, 0, frozenset(OP_CODES), frozenset(),
        "XLA's own all-reduce (NCCL on GPUs); serves every dtype and size"),
    ONESHOT_LL: AlgorithmSpec(
        ONESHOT_LL, 1, frozenset(OP_CODES), _KERNEL_DTYPES,
        "one-shot push of LL16 packets (8 B data + flag per 16 B store), "
        "double-buffered by epoch parity, no barrier"),
}

#: Every name ``jaxll.all_reduce(algorithm=...)`` accepts.
ALGORITHMS: tuple[str, ...] = (AUTO,) + tuple(SPECS)

# --- The automatic choice -----------------------------------------------------
#
# Provisional table (issue 2): the only kernel so far is the one-shot LL kernel,
# whose traffic grows as 2 (N-1) M per GPU. It is chosen up to DEFAULT_AUTO_MAX_BYTES
# per rank, beyond which XLA's all-reduce (NCCL) serves the call. The crossover is
# to be re-measured with the algorithms issue (virtual ranks) and on multi-GPU
# hosts; until then it is the only tunable and can be overridden with the
# JAXLL_AUTO_MAX_BYTES environment variable.
DEFAULT_AUTO_MAX_BYTES = 256 * 1024


def auto_max_bytes() -> int:
  value = os.environ.get("JAXLL_AUTO_MAX_BYTES")
  if value is None:
    return DEFAULT_AUTO_MAX_BYTES
  try:
    return int(value)
  except ValueError:
    raise ValueError(
        f"JAXLL_AUTO_MAX_BYTES must be an integer number of bytes, got {value!r}"
    ) from None


def choose_auto(group_size: int, nbytes: int, dtype: np.dtype, op: str) -> tuple[str, str]:
  """Returns (algorithm, reason) for ``algorithm="auto"``."""
  if group_size == 1:
    return XLA, "group of one device: XLA elides the all-reduce"
  limit = auto_max_bytes()
  if nbytes > limit:
    return XLA, f"{nbytes} bytes > auto crossover {limit} bytes"
  reason = kernel_limits(ONESHOT_LL, dtype, op)
  if reason:
    return XLA, reason
  return ONESHOT_LL, f"{nbytes} bytes <= auto crossover {limit} bytes"


def kernel_limits(name: str, dtype: np.dtype, op: str) -> str | None:
  """Why kernel `name` cannot serve (dtype, op), or None if it can."""
  spec = SPECS[name]
  dtype_name = np.dtype(dtype).name
  if dtype_name not in spec.dtypes:
    return (f"{name} has no kernel for {dtype_name} "
            f"(it supports {', '.join(sorted(spec.dtypes))})")
  if op not in spec.ops:
    return f"{name} does not support op={op!r}"
  return None
