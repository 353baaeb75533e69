"""The algorithms jaxll's collectives can lower to: the catalogue of kernels
(what each one supports) and the codes the native side gives them. Which one
serves a call is jaxll/choice.py's question.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxll import settings

AUTO = "auto"
XLA = "xla"
# What a call that asked for "auto" requests in deterministic mode (see
# deterministic_request): auto's choice among jaxll's kernels at every size.
DETERMINISTIC = "deterministic"
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
# the fused all_reduce_rmsnorm kernel's exchanges
_RMSNORM_PROTOCOLS = ("ll", "sentinel", "twoshot_ll", "twoshot_sentinel")
_KERNEL_NAMES = (ONESHOT_LL, ONESHOT_SENTINEL, TWOSHOT_LL, TWOSHOT_SENTINEL,
                 TWOSHOT_LL128_ATOMIC, ONESHOT_BARRIER, TWOSHOT_BARRIER)
# the call signature's collective field, and the error word's kind field
_COLLECTIVES = ("all_reduce", "all_reduce_rmsnorm", "all_gather", "psum_scatter", "ppermute",
                "all_to_all", "ragged_all_to_all")
_ERROR_KINDS = ("none", "timeout", "mismatch", "freed", "not_started", "ragged")


def _codes() -> dict:
  """The codes the FFI handlers take, from the native side's one table
  (ffi/kernels/types.h, ``jaxll.native.ext.codes()``). Without the extension (an
  install without nvcc) nothing is ever passed to a handler: placeholder codes
  (kernels nonzero, XLA zero) keep the catalogue's shape."""
  from jaxll.native import ext
  if ext is None:
    return {"algorithms": {XLA: 0, **{n: i + 1 for i, n in enumerate(_KERNEL_NAMES)}},
            "dtypes": {n: i for i, n in enumerate(_DTYPES)},
            "ops": {n: i for i, n in enumerate(_OPS)},
            "rmsnorm_protocols": {n: i + 1 for i, n in enumerate(_RMSNORM_PROTOCOLS)},
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
#: The fused kernel's exchange codes, by name ("ll", "sentinel", "twoshot_ll",
#: "twoshot_sentinel").
RMSNORM_PROTOCOL_CODES: dict[str, int] = dict(_NATIVE["rmsnorm_protocols"])
#: Why each of those exchanges, asked for, may refuse a call (the native
#: side's text, the one its errors give).
RMSNORM_REFUSALS: dict[str, str] = dict(_NATIVE["rmsnorm_refusals"])
#: The call signature's collective codes ("all_reduce", "all_reduce_rmsnorm",
#: "all_gather", "psum_scatter", "ppermute", "all_to_all", "ragged_all_to_all"), which
#: the gather/scatter handlers also take.
COLLECTIVE_CODES: dict[str, int] = dict(_NATIVE["collectives"])
#: The error word's kinds ("none", "timeout", "mismatch", "freed", "not_started",
#: "ragged").
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


def deterministic_request(who: str, algorithm: str, deterministic: bool | None) -> str:
  """The algorithm a call of `who` requests, given its ``deterministic=``
  (None: ``JAXLL_DETERMINISTIC``): ``algorithm`` itself outside deterministic
  mode; in it, DETERMINISTIC for ``"auto"``, a named reproducible kernel as
  named, and ValueError for XLA's path and the atomic kernel, whose sums do
  not keep the contract (docs/determinism.md), and under JAXLL_DISABLE, which
  sends every call to XLA."""
  if deterministic is None:
    deterministic = settings.deterministic()
  elif not isinstance(deterministic, (bool, np.bool_)):
    raise TypeError(f"{who}: deterministic must be True, False or None, got {deterministic!r}")
  if not deterministic:
    return algorithm
  if settings.disabled():
    raise ValueError(f"{who}: deterministic mode (deterministic=True or JAXLL_DETERMINISTIC=1) "
                     f"needs jaxll's kernels, and JAXLL_DISABLE is set")
  if algorithm == AUTO:
    return DETERMINISTIC
  spec = SPECS.get(algorithm)
  if algorithm == XLA or (spec is not None and not spec.reproducible):
    why = ("XLA's collectives reduce in their own order" if algorithm == XLA else
           "its sums vary from run to run")
    raise ValueError(f"{who}: algorithm={algorithm!r} cannot keep deterministic mode "
                     f"(deterministic=True or JAXLL_DETERMINISTIC=1): {why}")
  return algorithm


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
