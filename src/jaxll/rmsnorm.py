"""``jaxll.all_reduce_rmsnorm``: the all-reduce that ends a row-parallel layer,
followed by the residual add and the RMSNorm of the next layer's input, the
pattern of every tensor-parallel decoder block.

``algorithm="fused"`` asks for the single kernel that does all three
(``ffi/kernels/all_reduce_rmsnorm.cu``: the one-shot rounds with the residual
add and the norm as their epilogue, or the two-shot kernel), its exchange
chosen by measurement (``jaxll/tuning/all_reduce_rmsnorm.json``, read by
``jaxll.choice``); ``"fused_ll"`` / ``"fused_sentinel"`` /
``"fused_twoshot_ll"`` / ``"fused_twoshot_sentinel"`` name the exchange.
``algorithm="auto"`` (the default) takes the fused kernel where it measured
faster than the composition (up to a size per group and exchange, the same
table), unless jaxll.all_reduce's auto would leave that all-reduce to XLA (a
group of one device, ``JAXLL_AUTO_MAX_BYTES``). Otherwise, or with a
jaxll.all_reduce algorithm named, it is the composition of
:func:`jaxll.all_reduce` (its kernels, its auto choice, its XLA fallback) and
the norm math, which XLA fuses into one kernel of its own. Wherever the fused
kernel cannot serve a call (CPU, no workspace, a hidden size whose bytes are
not a multiple of 8, ...) the composition serves it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import batching, mlir

from jaxll import algorithms, call_sites, choice, internals, native, ordering, placement, sites
from jaxll.all_reduce import all_reduce
from jaxll.collective_common import check_axes_bound, collective_pvary, normalize_axes

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
# under vmap with more rows than any group's fused limit)
COMPOSED = "composed"

_FLOATS = (np.dtype(np.float32), np.dtype(jnp.bfloat16), np.dtype(np.float16))


def all_reduce_rmsnorm(x, residual, weight, axis_name, *, eps: float = 1e-6,
                       algorithm: str = "auto", deterministic: bool | None = None):
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
    algorithm: ``"auto"``: the fused kernel up to the size where it measured
      faster than the composition (per group size and exchange:
      ``jaxll/tuning/all_reduce_rmsnorm.json``), else the composition with
      jaxll.all_reduce's auto choice; ``"fused"``: one kernel for all three
      steps where a jaxll workspace serves the axes (float32/bfloat16/float16,
      the hidden size's bytes a multiple of 8), its exchange chosen as auto
      chooses it, else the composition; ``"fused_ll"`` / ``"fused_sentinel"``:
      that kernel with its exchange named (LL16 packets, or the sentinel
      protocol's direct stores), else as ``"fused"``; sentinel serves only
      calls whose rows' bytes are a multiple of 16 and that its decode-shape
      cut moves in one round (a 16-byte unit a thread, e.g. up to 16 tokens
      at hidden 8192 bf16 with 8 ranks on one GPU); ``"fused_twoshot_ll"`` /
      ``"fused_twoshot_sentinel"``: the two-shot kernel (each rank reduces
      1/N of every row segment and sends the sums to all; every rank adds its
      own residual), for calls of one row-wave of its cut with at most 2
      units a thread; where a workspace serves the axes but the named
      exchange cannot serve the call, lowering raises ValueError; any other
      jaxll.all_reduce algorithm: the composition with that all-reduce. The
      kernel's cut (and so its exchange, and auto's choice) depends on the
      device (its SMs, cluster support), asked at lowering; ranks that cut a
      call differently report a signature mismatch.
    deterministic: ``True`` holds the call to jaxll's determinism contract
      (docs/determinism.md): the fused kernel serves it at every size (never
      the composition, whose norm is XLA's), with ``"auto"`` or ``"fused"``
      its exchange chosen as ``"fused"`` chooses it; a row's results are then
      bitwise the same whatever the token count, the exchange, the cut or the
      process layout. A call the fused kernel cannot serve raises
      (ValueError when tracing: a jaxll.all_reduce algorithm, an ``x`` typed
      unreduced, no axis; at lowering: no workspace, a hidden size whose
      bytes are not a multiple of 8). ``None`` (default):
      ``JAXLL_DETERMINISTIC``, read when tracing.

  An ``x`` typed ``unreduced`` over ``axis_name`` (explicit sharding's
  partial sums) takes the composition, whose all-reduce sums it as psum does.

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
  if algorithms.deterministic_request(_WHO, "auto", deterministic) == algorithms.DETERMINISTIC:
    return _deterministic(x, residual, weight, axis_name, eps, algorithm)
  x, residual, weight = _checked(x, residual, weight)
  nbytes = int(np.prod(x.shape)) * x.dtype.itemsize
  if algorithm == "auto" and nbytes > choice.fused_auto_ceiling():
    return _composed(x, residual, weight, axis_name, eps=eps, algorithm="auto")
  if algorithm not in _FUSED_NAMES + ("auto",):
    return _composed(x, residual, weight, axis_name, eps=eps, algorithm=algorithm)
  axes = normalize_axes(axis_name, _WHO)
  if not axes:
    return _composed(x, residual, weight, axis_name, eps=eps, algorithm="auto")
  check_axes_bound(axes, _WHO)
  if isinstance(x, jax.core.Tracer) and internals.unreduced_over(x, axes, _WHO):
    # partial sums typed unreduced (explicit sharding): the composition, whose
    # all-reduce sums them as psum does
    return _composed(x, residual, weight, axis_name, eps=eps,
                     algorithm="auto" if algorithm in _FUSED_NAMES else algorithm)
  return _fused(x, residual, weight.astype(x.dtype), axes, eps, algorithm, False,
                sites.user_site())


def _deterministic(x, residual, weight, axis_name, eps, algorithm):
  """all_reduce_rmsnorm in deterministic mode: the fused kernel, or an error."""
  def refuse(why: str):
    raise ValueError(f"{_WHO}: deterministic mode (deterministic=True or "
                     f"JAXLL_DETERMINISTIC=1) serves a call on the fused kernel only, and {why}")
  if algorithm not in _FUSED_NAMES + ("auto",):
    refuse(f"algorithm={algorithm!r} names the composition, whose norm is XLA's (its bits "
           f"change with the shape); use 'auto', 'fused' or a fused exchange")
  x, residual, weight = _checked(x, residual, weight)
  axes = normalize_axes(axis_name, _WHO)
  if not axes:
    refuse("no axis is reduced over")
  check_axes_bound(axes, _WHO)
  if isinstance(x, jax.core.Tracer) and internals.unreduced_over(x, axes, _WHO):
    refuse("an x typed unreduced takes the composition")
  requested = FUSED if algorithm == "auto" else algorithm
  return _fused(x, residual, weight.astype(x.dtype), axes, eps, requested, True,
                sites.user_site())


def _checked(x, residual, weight):
  """The operands as arrays; TypeError or ValueError where they do not fit."""
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
  return x, residual, weight


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

all_reduce_rmsnorm_p = internals.CollectivePrimitive("jaxll_all_reduce_rmsnorm")
all_reduce_rmsnorm_p.multiple_results = True


def _fused(x, residual, weight, axes, eps, requested, deterministic, site):
  x, residual, weight = _match_types(axes, x, residual, weight)
  fn = jax.custom_jvp(lambda x, r, w: tuple(all_reduce_rmsnorm_p.bind(
      x, r, w, axes=axes, eps=eps, requested=requested, deterministic=deterministic, site=site)))
  # (the derivative's all-reduce keeps the mode; its norm math is XLA's)
  fn.defjvp(lambda p, t: (fn(*p), jax.jvp(
      lambda x, r, w: residual_rmsnorm(
          all_reduce(x, axes, deterministic=deterministic), r, w, eps=eps), p, t)[1]))
  return fn(x, residual, weight)


def _varying(v) -> frozenset:
  """The mesh axes over which ``v``'s type says it varies (``check_vma``)."""
  aval = jax.typeof(v)
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
  x = collective_pvary(axes, x, _WHO)
  if not internals.check_vma():
    return x, residual, weight
  vx, vr, vw = _varying(x), _varying(residual), _varying(weight)
  summed = (vx - set(axes)) | vr
  return (x, internals.pvary(residual, tuple(summed - vr)),
          internals.pvary(weight, tuple((summed | vw) - vw)))


def _abstract_eval(x, residual, weight, *, axes, eps, requested, deterministic, site):
  # (operands typed by _match_types: normed has weight's type at x's shape,
  # new_residual residual's)
  del axes, eps, requested, deterministic, site
  normed = weight.update(shape=x.shape, sharding=residual.sharding, weak_type=False)
  return [normed, residual.update(weak_type=False)]


all_reduce_rmsnorm_p.def_abstract_eval(_abstract_eval)


def _batch(axis_data, vals_in, dims_in, *, axes, eps, requested, deterministic, site):
  """vmap: a batch dimension of x and residual is more rows for the same kernel
  (moved to the front, an unbatched operand broadcast); a batched weight, a
  reduction over the vmapped axis itself, or (for auto) rows beyond
  any group's auto limit take the composition under vmap (below it, the
  lowering decides as for any call)."""
  x, residual, weight = vals_in
  dx, dr, dw = dims_in
  params = dict(axes=axes, eps=eps, requested=requested, deterministic=deterministic, site=site)
  if dx is None and dr is None and dw is None and axis_data.name not in axes:
    # (nothing batched: a vmapped function called it on values from outside
    # the vmap; the call runs once, its rows not multiplied by the batch)
    return all_reduce_rmsnorm_p.bind(x, residual, weight, **params), [None, None]
  rows_bytes = int(np.prod(x.shape)) * x.dtype.itemsize * (axis_data.size if dx is None else 1)
  if requested == "auto" and rows_bytes > choice.fused_auto_ceiling():
    requested = COMPOSED  # (more rows than auto gives the kernel: the same primitive, composed)
  if deterministic and (dw is not None or axis_data.name in axes):
    raise ValueError(f"{_WHO}: deterministic mode serves a call on the fused kernel only, "
                     f"and under jax.vmap a batched weight, or a reduction over the vmapped "
                     f"axis, takes the composition")
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
  del requested  # (never deterministic: _choose_fused refuses those calls)
  with sites.call_site(site):  # (the all-reduce's site: the caller's line)
    return mlir.lower_fun(
        lambda a, r, w: list(_composed(a, r, w, axes, eps=eps, algorithm="auto")),
        multiple_results=True)(ctx, x, residual, weight)


def _kernel_plan(ws: int, dtype: np.dtype, tokens: int, hidden: int, exchange: str) -> dict:
  """How workspace `ws`'s rank here cuts the call on `exchange` (the native
  plan: "blocks", 0 where that exchange cannot serve it; "protocol", the
  units it moves, "ll" or "sentinel"; "twoshot"; "lean", the decode-shape cut)."""
  return native.ext.rmsnorm_plan(ws, algorithms.DTYPE_CODES[dtype.name], tokens, hidden,
                                 algorithms.RMSNORM_PROTOCOL_CODES[exchange])


def _choose_fused(ctx, aval, axes, requested,
                  deterministic=False) -> tuple[int, int, str, str | None, dict | None]:
  """(workspace id or 0, group size, reason, exchange, its plan) of one fused
  call site: a workspace and the exchange the kernel takes, or 0 and why the
  composition serves it. In deterministic mode, a call the kernel cannot serve
  raises AlgorithmUnavailableError instead."""
  if deterministic:
    ws, group_size, reason, exchange, plan = _choose_fused(ctx, aval, axes, requested)
    if not ws:
      raise placement.AlgorithmUnavailableError(
          f"{_WHO}(deterministic=True) cannot serve the call at "
          f"{sites.call_text(ctx, 'sum+rmsnorm', axes)} on the fused kernel: {reason}")
    return ws, group_size, f"deterministic: {reason}", exchange, plan
  group_size = placement.group_size(ctx, axes)
  dtype = np.dtype(aval.dtype)
  nbytes = int(aval.size) * dtype.itemsize
  if requested == COMPOSED:
    return 0, group_size, (f"under jax.vmap: more rows than any group's fused auto limit "
                           f"({choice.fused_auto_ceiling()} bytes per rank)"), None, None
  if requested == "auto":
    # where jaxll.all_reduce's auto would leave the all-reduce to XLA (a group
    # of one, JAXLL_AUTO_MAX_BYTES), so does this, before building a workspace
    path, why = choice.choose_auto(group_size, nbytes, dtype, "sum")
    if path == algorithms.XLA:
      return 0, group_size, why, None, None
  ws, group_size, reason = placement.workspace_for(ctx, axes)
  hidden = aval.shape[-1] if aval.shape else 0
  if ws and dtype not in _FLOATS:
    return 0, group_size, f"no fused kernel for {dtype}", None, None
  if ws and (hidden * dtype.itemsize) % 8:
    return 0, group_size, "the hidden size's bytes are not a multiple of 8", None, None
  if ws and not aval.size:
    return 0, group_size, "no elements", None, None
  if not ws:
    return 0, group_size, reason, None, None
  tokens = int(aval.size) // hidden

  def plan_of(exchange: str) -> dict:
    return _kernel_plan(ws, dtype, tokens, hidden, exchange)

  named = _PROTOCOL_OF.get(requested)
  if named is not None:
    exchange, plan = named, plan_of(named)
  else:
    exchange, plan = choice.fused_exchange(group_size, nbytes, hidden * dtype.itemsize, plan_of)
  twoshot = bool(plan["twoshot"])
  limit = choice.fused_auto_max_bytes(group_size, plan["protocol"] == "sentinel", twoshot)
  kind = f"{'two-shot' if twoshot else 'one-shot'} {plan['protocol']}"
  if requested == "auto" and nbytes > limit:
    return 0, group_size, (f"{nbytes} bytes per rank > the fused kernel's auto limit "
                           f"{limit} for N={group_size} on its {kind} exchange "
                           f"(all_reduce_rmsnorm table)"), None, None
  if not plan["blocks"]:
    raise ValueError(
        f"jaxll.all_reduce_rmsnorm(algorithm={requested!r}): that exchange cannot "
        f"serve {tuple(aval.shape)} {dtype} on this workspace "
        f"({algorithms.RMSNORM_REFUSALS[exchange]}); use 'fused' or 'fused_ll'")
  if requested in _FUSED_NAMES:
    reason = f"algorithm={requested!r} requested"
  else:
    reason = (f"all_reduce_rmsnorm table: {nbytes} bytes per rank, at most {limit} (measured "
              f"faster than the composition for N={group_size} on its {kind} exchange)")
  if named is None:
    reason += f"; {kind} exchange (measured choice)"
  return ws, group_size, reason, exchange, plan


def _fused_lowering(ctx, x, residual, weight, *, axes, eps, requested, deterministic, site):
  aval = ctx.avals_in[0]
  ws, group_size, reason, exchange, plan = _choose_fused(ctx, aval, axes, requested,
                                                         deterministic)
  if ws:
    results = ordering.emit_ordered_call(
        ctx, "jaxll_all_reduce_rmsnorm", [x, residual, weight], workspace=ws,
        eps=np.float32(eps), protocol=np.int32(algorithms.RMSNORM_PROTOCOL_CODES[exchange]),
        uses_pdl=True)
    algorithm = f"fused_{'twoshot' if plan['twoshot'] else 'oneshot'}_{plan['protocol']}"
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
  call_sites.tag(results[:1], record)
  call_sites.record(record)
  return results


# (every platform: where no kernel serves, the lowering is the composition, and
# the call's record says why)
internals.register_lowering(all_reduce_rmsnorm_p, _fused_lowering)
