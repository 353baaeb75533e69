"""``jaxll.all_reduce_rmsnorm``: the all-reduce that ends a row-parallel layer,
followed by the residual add and the RMSNorm of the next layer's input, the
pattern of every tensor-parallel decoder block.

``algorithm="fused"`` asks for the single kernel that does all three
(``ffi/kernels/all_reduce_rmsnorm.cu``), on the one-shot path with its exchange
LL16 or, for calls of 64 KiB and more (or rows of 32 KiB and more, or any
call in groups of 2) that its decode-shape cut serves, the sentinel protocol;
or on the two-shot path (reduce-scatter, then all-gather of the sums, on
sentinel) in groups of 8 from 128 KiB and for calls of 64 KiB and more that
no decode-shape cut serves
(``"fused_ll"`` / ``"fused_sentinel"`` / ``"fused_twoshot_ll"`` /
``"fused_twoshot_sentinel"`` name one); ``algorithm="auto"``
(the default) takes it where it was measured faster: at most
``FUSED_AUTO_MAX_BYTES`` (128 KiB) of ``x`` per rank, where the kernel runs
on the sentinel exchange up to ``FUSED_SENTINEL_AUTO_MAX_BYTES`` (512 KiB in
groups of 2, 256 KiB in groups of 4), and where it runs two-shot up to
``FUSED_TWOSHOT_AUTO_MAX_BYTES`` (256 KiB in groups of 8): a decode step's few
tokens (1-16 tokens at hidden 8192 in bfloat16, 32 in groups of 2;
``benchmarks/README.md``, "Fused all-reduce + RMSNorm"), unless jaxll.all_reduce's auto would leave that
all-reduce to XLA (a group of one device, ``JAXLL_AUTO_MAX_BYTES``). Otherwise, or with a jaxll.all_reduce algorithm
named, it is the composition of :func:`jaxll.all_reduce` (its kernels, its
auto choice, its XLA fallback) and the norm math, which XLA fuses into one
kernel of its own. Wherever the fused kernel cannot serve a call (CPU, no
workspace, a hidden size whose bytes are not a multiple of 8, ...) the
composition serves it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import config as jax_config
from jax._src import core
from jax._src.interpreters import batching, mlir

from jaxll import algorithms, call_sites, lowering
from jaxll._ext import ext
from jaxll.all_reduce import _check_axes_bound, _collective_pvary, _normalize_axes, all_reduce

_WHO = "jaxll.all_reduce_rmsnorm"

FUSED = "fused"
# The fused kernel with its exchange named: "fused" lets the kernel choose
# (LL16, or sentinel for the calls where it measured faster).
FUSED_LL = "fused_ll"
FUSED_SENTINEL = "fused_sentinel"
# ... and the two-shot kernel (reduce-scatter, all-gather of the sums) with its
# exchange named.
FUSED_TWOSHOT_LL = "fused_twoshot_ll"
FUSED_TWOSHOT_SENTINEL = "fused_twoshot_sentinel"
_FUSED_NAMES = (FUSED, FUSED_LL, FUSED_SENTINEL, FUSED_TWOSHOT_LL, FUSED_TWOSHOT_SENTINEL)
_PROTOCOL_OF = {FUSED_LL: "ll", FUSED_SENTINEL: "sentinel", FUSED_TWOSHOT_LL: "twoshot_ll",
                FUSED_TWOSHOT_SENTINEL: "twoshot_sentinel"}
# (the primitive's `requested` for a call that must take the composition: auto
# under vmap with more rows than FUSED_AUTO_MAX_BYTES)
COMPOSED = "composed"
# algorithm="auto" takes the fused kernel up to this many bytes of x per rank.
# Measured on one H200 with 2 and 8 processes sharing it (bfloat16, hidden 4096
# and 8192): 1.17-1.65x faster than the composition from 8 KiB to 128 KiB,
# 0.95-1.14x at 256 KiB, at most 1.0x from 512 KiB (one exception, 1.24x).
# Not measured across GPUs. (The runs cited here and below gave the chains new
# input buffers every run, so XLA recorded its command buffers again each time
# and the host's cost, which bounded the 2-process and virtual-rank steps, is in
# them; with the inputs donated, device-bound, session 15 measured 1.31-1.50x
# at 1-16 tokens, 8 KiB to 256 KiB, with 2 and 8 processes: benchmarks/README.md.)
FUSED_AUTO_MAX_BYTES = 128 * 1024
# ... and, for the group sizes listed, up to this many where the kernel runs on
# the sentinel exchange (its decode-shape cut; the kernel's own protocol
# choice). Measured on one H200, bfloat16, hidden 8192, against the composition
# with jaxll.all_reduce's auto choice (benchmarks/README.md, "Session 11"):
# N=2 processes 1.41-1.74x at 16 tokens (256 KiB), 1.24-1.27x at 32 (512 KiB;
# beyond, the sentinel cut does not serve); N=4 processes 1.26x at 16 tokens
# (virtual ranks 1.25x); at N=8 the composition's two-shot all-reduce is faster
# from 16 tokens (virtual ranks 0.63x), so 8 is not listed.
FUSED_SENTINEL_AUTO_MAX_BYTES: dict[int, int] = {2: 512 * 1024, 4: 256 * 1024}


# ... and for the group sizes listed, up to this many where the kernel takes
# its two-shot cut (its own choice in groups of 8 from 128 KiB). Measured on
# one H200, bfloat16, hidden 8192, against the composition with
# jaxll.all_reduce's auto (two-shot) all-reduce (benchmarks/README.md,
# "Session 12" and "Session 13"): at 16 tokens 1.34x with 8 processes (two
# runs, session 13), 1.05-1.37x on 8 virtual ranks (three runs); at 32 tokens
# 1.06-1.09x on virtual ranks and not served with 8 processes (so not listed).
FUSED_TWOSHOT_AUTO_MAX_BYTES: dict[int, int] = {8: 256 * 1024}


def fused_auto_max_bytes(group_size: int, sentinel: bool, twoshot: bool = False) -> int:
  """The most bytes of x per rank for which algorithm="auto" takes the fused
  kernel in a group of `group_size`, on the sentinel exchange or not, one-shot
  or two-shot."""
  if twoshot:
    return max(FUSED_AUTO_MAX_BYTES, FUSED_TWOSHOT_AUTO_MAX_BYTES.get(group_size, 0))
  if sentinel:
    return max(FUSED_AUTO_MAX_BYTES, FUSED_SENTINEL_AUTO_MAX_BYTES.get(group_size, 0))
  return FUSED_AUTO_MAX_BYTES

# (no group's auto limit is higher: beyond it, auto is the composition at once;
# computed at import, as the limits are constants)
_AUTO_CEILING = max([FUSED_AUTO_MAX_BYTES, *FUSED_SENTINEL_AUTO_MAX_BYTES.values(),
                     *FUSED_TWOSHOT_AUTO_MAX_BYTES.values()])

_FLOATS = (np.dtype(np.float32), np.dtype(jnp.bfloat16), np.dtype(np.float16))


def all_reduce_rmsnorm(x, residual, weight, axis_name, *, eps: float = 1e-6,
                       algorithm: str = "auto"):
  """``(normed, new_residual)`` with ``new_residual = all_reduce(x) + residual``
  and ``normed = rmsnorm(new_residual) * weight`` over the last axis.

  Use it inside ``jax.shard_map`` at the end of a row-parallel layer, where a
  model would write ``h = psum(partial, "tp") + residual`` and then normalize
  ``h`` for the next layer.

  Numerics (those of the Hugging Face Llama blocks, for float32, bfloat16 and
  float16): the all-reduce sums ``x`` over the group as :func:`jaxll.all_reduce`
  does (rank order on the kernels); ``new_residual`` is the sum and ``residual``
  added in float32 and rounded once to ``x.dtype``; ``normed`` is
  ``new_residual`` in float32 times ``rsqrt(mean(new_residual**2) + eps)``,
  rounded to ``x.dtype``, times ``weight`` (cast to ``x.dtype``) in ``x.dtype``.

  Args:
    x: this rank's partial sums, shape ``(..., hidden)``.
    residual: the residual stream, the shape and dtype of ``x``.
    weight: the norm's scale, shape ``(hidden,)``.
    axis_name: mesh axis name (or tuple of names) to reduce over.
    eps: added to the mean square before the reciprocal square root; a real
      number >= 0 known when tracing (a Python float or a concrete scalar).
    algorithm: ``"auto"``: the fused kernel for at most
      ``FUSED_AUTO_MAX_BYTES`` of ``x`` per rank (more where it runs on the
      sentinel exchange or two-shot in a group that
      ``FUSED_SENTINEL_AUTO_MAX_BYTES`` or ``FUSED_TWOSHOT_AUTO_MAX_BYTES``
      lists), else the composition with jaxll.all_reduce's auto choice; ``"fused"``: one kernel for all three
      steps where a jaxll workspace serves the axes (float32/bfloat16/float16,
      the hidden size's bytes a multiple of 8), else the composition;
      ``"fused_ll"`` / ``"fused_sentinel"``: that kernel with its exchange
      named (LL16 packets, or the sentinel protocol's direct stores; ``"fused"``
      and auto let the kernel choose, sentinel and two-shot where they
      measured faster), else as ``"fused"``; sentinel serves only calls whose
      rows' bytes are a multiple of 16 and that its decode-shape kernel moves
      in one round (a 16-byte unit a thread, e.g. up to 16 tokens at hidden
      8192 bf16 with 8 ranks on one H200); ``"fused_twoshot_ll"`` /
      ``"fused_twoshot_sentinel"``: the two-shot kernel (each rank reduces
      1/N of every row segment and sends the sums to all; every rank adds its
      own residual), for calls of one row-wave of its cut with at most 2
      units a thread (e.g. at hidden 8192 bf16 on sentinel, up to 32 tokens
      with 8 virtual ranks on one H200, 16 with 8 processes sharing it); where a workspace serves the axes but the named exchange
      cannot serve the call, lowering raises ValueError; any other
      jaxll.all_reduce algorithm: the composition with that all-reduce. The
      kernel's cut (and so its exchange, and auto's choice above
      ``FUSED_AUTO_MAX_BYTES``) depends on the device (its SMs, cluster
      support), asked at lowering; ranks that cut a call differently report a
      signature mismatch.

  Differentiable in ``x``, ``residual`` and ``weight`` (the all-reduce's
  transpose is psum's). Under ``check_vma`` the results' types are the
  composition's: ``new_residual`` varies over the mesh axes ``x`` varies over
  other than ``axis_name`` and over those ``residual`` varies over, ``normed``
  also over those of ``weight``. ``jaxll.explain`` lists the call (op
  ``sum+rmsnorm``: the kernel it runs, or ``composed`` and why) at the
  caller's line, and where it is composed, the composition's all-reduce as an
  entry of its own.

  Raises TypeError or ValueError (naming this function) for an unknown
  ``algorithm``, an ``eps`` that is negative or not a real number known when
  tracing, operands whose shapes or dtypes do not fit, a complex or boolean
  ``weight``, and NameError for an axis name that no enclosing shard_map has.
  """
  names = ("auto",) + _FUSED_NAMES + tuple(a for a in algorithms.ALGORITHMS if a != "auto")
  if not isinstance(algorithm, str) or algorithm not in names:
    raise ValueError(f"{_WHO}: algorithm must be one of {list(names)} (the fused "
                     f"kernel's names, then jaxll.all_reduce's for the composition), "
                     f"got {algorithm!r}")
  eps = _static_eps(eps)
  x = jnp.asarray(x)
  residual = jnp.asarray(residual)
  weight = jnp.asarray(weight)
  if x.dtype not in _FLOATS:
    raise TypeError(f"jaxll.all_reduce_rmsnorm: x must be float32, bfloat16 or "
                    f"float16, got {x.dtype}")
  if x.ndim < 1:
    raise ValueError("jaxll.all_reduce_rmsnorm: x needs a last (hidden) axis; got a scalar")
  if residual.shape != x.shape or residual.dtype != x.dtype:
    raise ValueError(f"jaxll.all_reduce_rmsnorm: residual must have x's shape and dtype "
                     f"{x.shape} {x.dtype}, got {residual.shape} {residual.dtype}")
  if weight.shape != x.shape[-1:]:
    raise ValueError(f"jaxll.all_reduce_rmsnorm: weight must have shape "
                     f"{x.shape[-1:]} (the hidden size), got {weight.shape}")
  if not (jnp.issubdtype(weight.dtype, jnp.floating) or jnp.issubdtype(weight.dtype, jnp.integer)):
    raise TypeError(f"jaxll.all_reduce_rmsnorm: weight must be real (a float or integer "
                    f"dtype, cast to {x.dtype}), got {weight.dtype}")
  nbytes = int(np.prod(x.shape)) * x.dtype.itemsize
  if algorithm == "auto" and nbytes > _AUTO_CEILING:
    return _composed(x, residual, weight, axis_name, eps=eps, algorithm="auto")
  if algorithm not in _FUSED_NAMES + ("auto",):
    return _composed(x, residual, weight, axis_name, eps=eps, algorithm=algorithm)
  axes = _normalize_axes(axis_name, _WHO)
  if not axes:
    return _composed(x, residual, weight, axis_name, eps=eps, algorithm="auto")
  _check_axes_bound(axes, _WHO)
  return _fused(x, residual, weight.astype(x.dtype), axes, eps, algorithm,
                lowering.user_site())


def _static_eps(eps) -> float:
  """``eps`` as a Python float: a real number known when tracing (it is a
  parameter of the kernel, not an operand), and not negative."""
  value = None
  if np.ndim(eps) == 0 and not isinstance(eps, (str, bytes)) and not np.iscomplexobj(eps):
    try:
      value = float(eps)
    except (TypeError, ValueError):  # (a traced value: jax's ConcretizationTypeError)
      value = None
  if value is None:
    raise TypeError(f"{_WHO}: eps must be a real number known when tracing (a Python "
                    f"float, or a concrete scalar), got {eps!r}")
  if not value >= 0:
    raise ValueError(f"{_WHO}: eps must be >= 0, got {value}")
  return value


def _composed(x, residual, weight, axis_name, *, eps, algorithm):
  return residual_rmsnorm(all_reduce(x, axis_name, algorithm=algorithm), residual, weight, eps=eps)


def residual_rmsnorm(reduced, residual, weight, *, eps: float):
  """``(normed, new_residual)`` from an all-reduced ``reduced``: the math that
  follows the all-reduce in the composition (and that the fused kernel does)."""
  new_residual = (reduced.astype(jnp.float32) + residual.astype(jnp.float32)).astype(reduced.dtype)
  h = new_residual.astype(jnp.float32)
  inv = jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + jnp.float32(eps))
  normed = (h * inv).astype(reduced.dtype) * weight.astype(reduced.dtype)
  return normed, new_residual


# --- The fused kernel ------------------------------------------------------------------
# A primitive with two results; its derivative is the composition's (so the
# backward pass reduces through jaxll.all_reduce), and its lowering emits the
# kernel where a workspace serves the axes, else the composition.

all_reduce_rmsnorm_p = core.Primitive("jaxll_all_reduce_rmsnorm")
all_reduce_rmsnorm_p.multiple_results = True


def _fused(x, residual, weight, axes, eps, requested, site):
  x, residual, weight = _match_types(axes, x, residual, weight)
  fn = jax.custom_jvp(lambda x, r, w: tuple(
      all_reduce_rmsnorm_p.bind(x, r, w, axes=axes, eps=eps, requested=requested, site=site)))
  fn.defjvp(lambda p, t: (fn(*p), jax.jvp(
      lambda x, r, w: _composed(x, r, w, axes, eps=eps, algorithm="auto"), p, t)[1]))
  return fn(x, residual, weight)


def _varying(v) -> frozenset:
  """The mesh axes over which ``v``'s type says it varies (``check_vma``)."""
  aval = core.typeof(v)
  mat = getattr(aval, "mat", None)  # (jax 0.10 and later)
  if mat is not None:
    return frozenset(mat.varying)
  if hasattr(aval, "vma"):  # (the name jax used before)
    return frozenset(aval.vma)
  raise NotImplementedError(f"{_WHO}: this jax ({jax.__version__}) types values "
                            f"inside shard_map in a way jaxll does not know")


def _match_types(axes, x, residual, weight):
  """The operands with the types the primitive expects, from which it takes
  its results' types, those of the composition: ``new_residual`` varies over
  the mesh axes that ``x`` varies over other than ``axes`` (it is reduced over
  those, as psum's result is) and over those ``residual`` varies over;
  ``normed`` over those and the ones ``weight`` varies over. Under
  ``check_vma`` ``residual`` and ``weight`` are cast to vary over those (no-op
  casts, as jax.numpy's arithmetic inserts), and ``x`` over ``axes``."""
  x = _collective_pvary(axes, x, _WHO)
  if not jax_config._check_vma.value:
    return x, residual, weight
  vx, vr, vw = _varying(x), _varying(residual), _varying(weight)
  summed = (vx - set(axes)) | vr
  return (x, core.pvary(residual, tuple(summed - vr)),
          core.pvary(weight, tuple((summed | vw) - vw)))


def _abstract_eval(x, residual, weight, *, axes, eps, requested, site):
  # (operands typed by _match_types: normed has weight's type at x's shape,
  # new_residual residual's)
  del axes, eps, requested, site
  normed = weight.update(shape=x.shape, sharding=residual.sharding, weak_type=False)
  return [normed, residual.update(weak_type=False)]


all_reduce_rmsnorm_p.def_abstract_eval(_abstract_eval)


def _batch(axis_data, vals_in, dims_in, *, axes, eps, requested, site):
  """vmap: a batch dimension of x and residual is more rows for the same kernel
  (moved to the front, an unbatched operand broadcast); a batched weight, a
  reduction over the vmapped axis itself, or (for auto) rows beyond
  any group's auto limit take the composition under vmap (below it, the
  lowering decides as for any call)."""
  x, residual, weight = vals_in
  dx, dr, dw = dims_in
  params = dict(axes=axes, eps=eps, requested=requested, site=site)
  if dx is None and dr is None and dw is None and axis_data.name not in axes:
    # (nothing batched: a vmapped function called it on values from outside
    # the vmap; the call runs once, its rows not multiplied by the batch)
    return all_reduce_rmsnorm_p.bind(x, residual, weight, **params), [None, None]
  rows_bytes = int(np.prod(x.shape)) * x.dtype.itemsize * (axis_data.size if dx is None else 1)
  if requested == "auto" and rows_bytes > _AUTO_CEILING:
    requested = COMPOSED  # (more rows than auto gives the kernel: the same primitive, composed)
  if dw is not None or axis_data.name in axes:
    # (the all-reduce of this composition is traced here, where JAX's traceback
    # lacks the caller's frames: jaxll.explain names its site "unknown")
    outs = jax.vmap(lambda a, r, w: _composed(a, r, w, axes, eps=eps, algorithm="auto"),
                    in_axes=(dx, dr, dw), axis_name=axis_data.name,
                    axis_size=axis_data.size)(x, residual, weight)
    return list(outs), [0, 0]
  def front(v, d):
    if d is None:
      return jnp.broadcast_to(v, (axis_data.size,) + v.shape)
    return jnp.moveaxis(v, d, 0)
  x, residual = front(x, dx), front(residual, dr)
  params["requested"] = requested
  return all_reduce_rmsnorm_p.bind(x, residual, weight, **params), [0, 0]


batching.fancy_primitive_batchers[all_reduce_rmsnorm_p] = _batch


def _composed_lowering(ctx, x, residual, weight, *, axes, eps, requested, site):
  del requested
  with lowering.call_site(site):  # (the all-reduce's site: the caller's line)
    return mlir.lower_fun(
        lambda a, r, w: list(_composed(a, r, w, axes, eps=eps, algorithm="auto")),
        multiple_results=True)(ctx, x, residual, weight)


def _kernel_plan(ws: int, dtype: np.dtype, tokens: int, hidden: int, protocol: int) -> dict:
  """How workspace `ws`'s rank here cuts the call (the native plan: "blocks",
  0 where the protocol asked for cannot serve it, and "protocol", the exchange
  taken: "ll" or "sentinel")."""
  return ext.rmsnorm_plan(ws, algorithms.DTYPE_CODES[dtype.name], tokens, hidden, protocol)


def _fused_lowering(ctx, x, residual, weight, *, axes, eps, requested, site):
  aval = ctx.avals_in[0]
  group_size = lowering.group_size(ctx, axes)
  ws = 0
  if requested == COMPOSED:
    reason = (f"auto under jax.vmap: more rows than any group's fused auto limit "
              f"({_AUTO_CEILING} B per rank)")
  else:
    choice, why = algorithms.XLA, ""
    if requested == "auto":
      # where jaxll.all_reduce's auto would leave the all-reduce to XLA (a group
      # of one, JAXLL_AUTO_MAX_BYTES), so does this, before building a workspace
      nbytes = int(aval.size) * np.dtype(aval.dtype).itemsize
      choice, why = algorithms.choose_auto(group_size, nbytes, np.dtype(aval.dtype), "sum")
    if requested == "auto" and choice == algorithms.XLA:
      reason = f"auto: {why}"
    else:
      ws, group_size, reason = lowering.workspace_for(ctx, axes)
  hidden = aval.shape[-1] if aval.shape else 0
  if ws and np.dtype(aval.dtype) not in _FLOATS:
    ws, reason = 0, f"no fused kernel for {np.dtype(aval.dtype)}"
  if ws and (hidden * np.dtype(aval.dtype).itemsize) % 8:
    ws, reason = 0, "the hidden size's bytes are not a multiple of 8"
  if ws and not aval.size:
    ws, reason = 0, "no elements"
  if ws:
    protocol = _PROTOCOL_OF.get(requested, "auto")
    code = algorithms.RMSNORM_PROTOCOL_CODES[protocol]
    tokens = int(aval.size) // hidden
    plan = _kernel_plan(ws, np.dtype(aval.dtype), tokens, hidden, code)
    nbytes = int(aval.size) * np.dtype(aval.dtype).itemsize
    twoshot = bool(plan.get("twoshot"))
    limit = fused_auto_max_bytes(group_size, plan["protocol"] == "sentinel", twoshot)
    exchange = f"{'two-shot' if twoshot else 'one-shot'} {plan['protocol']}"
    if requested == "auto" and nbytes > limit:
      ws, reason = 0, (f"auto: {nbytes} B per rank, above the fused kernel's auto limit "
                       f"{limit} for N={group_size} on its {exchange} exchange "
                       f"(FUSED_AUTO_MAX_BYTES, FUSED_SENTINEL_AUTO_MAX_BYTES, "
                       f"FUSED_TWOSHOT_AUTO_MAX_BYTES)")
  if ws:
    if not plan["blocks"]:
      raise ValueError(
          f"jaxll.all_reduce_rmsnorm(algorithm={requested!r}): that exchange cannot "
          f"serve {tuple(aval.shape)} {np.dtype(aval.dtype)} on this workspace "
          f"({algorithms.RMSNORM_REFUSALS[protocol]}); "
          f"use 'fused' or 'fused_ll'")
    results = lowering.emit_ordered_call(ctx, "jaxll_all_reduce_rmsnorm",
                                         [x, residual, weight], workspace=ws,
                                         eps=np.float32(eps), protocol=np.int32(code))
    algorithm = f"fused_{'twoshot' if twoshot else 'oneshot'}_{plan['protocol']}"
    limit_name, limit = (("FUSED_AUTO_MAX_BYTES", FUSED_AUTO_MAX_BYTES)
                         if nbytes <= FUSED_AUTO_MAX_BYTES else
                         (f"FUSED_{'TWOSHOT' if twoshot else 'SENTINEL'}_AUTO_MAX_BYTES"
                          f"[{group_size}]", limit))
    reason = (
        f"algorithm={requested!r} requested" if requested in _FUSED_NAMES else
        f"auto: {nbytes} B per rank, at most {limit_name} = {limit} (measured faster than "
        f"the composition)")
    if protocol == "auto":
      reason += f"; {exchange} exchange (the kernel's choice)"
  else:
    results = _composed_lowering(ctx, x, residual, weight, axes=axes, eps=eps,
                                 requested=requested, site=site)
    algorithm = COMPOSED
    reason += "; jaxll.all_reduce (its own entry) then XLA's residual add and RMSNorm"
  record = call_sites.CallSite(
      site=site, axes=",".join(map(str, axes)), group_size=group_size,
      shape=str(tuple(aval.shape)), dtype=str(np.dtype(aval.dtype)),
      nbytes=int(aval.size) * np.dtype(aval.dtype).itemsize, op="sum+rmsnorm",
      requested=requested, algorithm=algorithm, reason=reason, workspace=ws)
  # (one op carries the record: the kernel's call, or the op that computes the
  # composition's normed result)
  lowering._tag(results[:1], record)
  call_sites.record(record)
  return results


# (every platform: where no kernel serves, the lowering is the composition, and
# the call's record says why)
mlir.register_lowering(all_reduce_rmsnorm_p, _fused_lowering, cacheable=False)
