"""Naming a call site: the user's line (and up to two user functions that called
it) of each jaxll collective, as ``jaxll.explain`` and the errors show it, and
for a collective that autodiff or ``check_vma`` wrote, what it is (origin()).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

import jax

# Call sites named by a wrapper whose own primitive lowers jaxll calls (a stack
# per thread; see call_site()): JAX does not keep the caller's frames in every traceback
# (not in a custom_jvp's body, for one), so such a wrapper records the site
# when it is called and hands it to the lowerings under it.
_named = threading.local()  # .sites: this thread's stack


def _named_sites() -> list[str]:
  if not hasattr(_named, "sites"):
    _named.sites = []
  return _named.sites


def site_of(ctx) -> str:
  """The call site of the lowering `ctx` (a name given by call_site() first)."""
  if _named_sites():
    return _named_sites()[-1]
  return _chain_of_frames((fr.file_name, fr.line_num, fr.function_name) for fr in _frames(ctx))


def _frames(ctx) -> list:
  tb = getattr(ctx, "traceback", None)
  return list(getattr(tb, "frames", None) or ())


def user_site() -> str:
  """The call site of the Python code running now, as the lowerings name one
  (for a wrapper to pass on to call_site() at lowering time)."""
  def frames():
    f = sys._getframe(1)
    while f is not None:  # innermost first
      code = f.f_code
      yield code.co_filename, f.f_lineno, getattr(code, "co_qualname", code.co_name)
      f = f.f_back
  return _chain_of_frames(frames())


@contextlib.contextmanager
def call_site(site: str | None):
  """Lowerings inside name `site` as their call site (None: their own)."""
  if site is None:
    yield
    return
  stack = _named_sites()
  stack.append(site)
  try:
    yield
  finally:
    stack.pop()


_HERE = os.path.dirname(os.path.abspath(__file__))
_JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__))


def _internal(file_name: str) -> bool:
  path = os.path.abspath(file_name)
  return path.startswith(_HERE) or path.startswith(_JAX_DIR)


def _chain_of_frames(frames) -> str:
  """frames: (file, line, function), innermost first."""
  # The innermost user frame, followed by the user frames that called it
  # directly (a helper and its callers, up to 3), so that call sites that go
  # through one helper are told apart: "layers.py:8 (reduce) <- model.py:40 (mlp)".
  chain = []
  for file_name, line_num, function_name in frames:
    if _internal(file_name):
      if chain:
        break
      continue
    chain.append(f"{os.path.basename(file_name)}:{line_num} ({function_name})")
    if len(chain) == 3:
      break
  return " <- ".join(chain) if chain else "unknown"


# --- What wrote a collective -------------------------------------------------------
# JAX transposes each equation of a linear function under that equation's source
# information: the transpose of an all_gather (a psum_scatter) carries the
# traceback of the user's all_gather, that of a pvary (a psum) the traceback of
# the line where check_vma made a replicated value vary. The function the user's
# line called (the frame inside the user's) tells what that line wrote; the
# name stack's "transpose" transform tells a backward pass.

_GATHERS = frozenset(["all_gather", "all_gather_invariant", "all_gather_reduced"])
_SCATTERS = frozenset(["psum_scatter", "reduce_scatter"])
_SUMS = frozenset(["psum", "pmean", "all_reduce", "all_reduce_rmsnorm"])
_CASTS = frozenset(["pvary", "pcast"])
# (a collective of this op whose line called one of these is that call's transpose)
_TRANSPOSE_OF = {"psum_scatter": _GATHERS, "all_gather": _SCATTERS}


def _called(ctx) -> tuple[str | None, bool]:
  """(the jax.lax or jaxll collective the user's line of the traceback called,
  e.g. "jax.lax.all_gather", or None; whether that call went through a
  jax.custom_vjp, whose backward function JAX binds under the call's traceback)."""
  frames = _frames(ctx)
  for i, fr in enumerate(frames):
    if _internal(fr.file_name):
      continue
    inner = frames[:i]
    vjp = any("custom_vjp" in f.function_name for f in inner)
    if not inner:
      return None, vjp
    api = inner[-1]
    name = api.function_name.split(".<locals>")[0].rsplit(".", 1)[-1]
    if name not in _GATHERS | _SCATTERS | _SUMS | _CASTS:
      return None, vjp
    if os.path.abspath(api.file_name).startswith(_HERE):
      return f"jaxll.{name}", vjp
    return f"jax.lax.{name}", vjp
  return None, False


def _under_transpose(ctx) -> bool:
  """Whether the lowering of `ctx` is of an equation of a backward pass. JAX
  lowers a shard_map's body through its lowering cache, which starts the body
  with an empty name stack, so the transform may be on an enclosing equation:
  the enclosing lowering frames hold their equations' name stacks."""
  stacks = [getattr(ctx, "name_stack", None)]
  frame = sys._getframe(1)
  while frame is not None:
    code = frame.f_code
    if code.co_name == "jaxpr_subcomp" and code.co_filename.startswith(_JAX_DIR):
      stacks.append(frame.f_locals.get("eqn_name_stack"))
    frame = frame.f_back
  return any(type(t).__name__ == "Transform" and getattr(t, "name", None) == "transpose"
             for s in stacks for t in getattr(s, "stack", ()))


def _typed_varying(aval, axes: tuple) -> bool:
  """Whether `aval` is typed as varying over `axes` (check_vma's typing: a
  sum's operand is, under check_vma)."""
  mat = getattr(aval, "mat", None)  # (jax 0.10 and later)
  varying = mat.varying if mat is not None else getattr(aval, "vma", ())
  return bool(axes) and set(axes) <= set(varying)


def origin(ctx, op: str, axes: tuple, *, there: bool = False) -> str:
  """What the collective that `ctx` lowers is, where autodiff or check_vma wrote
  it, e.g. "autodiff's transpose of the jax.lax.all_gather at model.py:12
  (loss)"; "" for a call the user wrote (or one it cannot tell). `op`: "sum",
  "max", "min", "all_gather", "psum_scatter" or "sum+rmsnorm". `there`: the
  site as "there", for a message that has just named it."""
  if _named_sites() or op not in ("sum", "all_gather", "psum_scatter"):
    return ""  # (a wrapper's site: the traceback is not the user's)
  site = site_of(ctx)
  if site == "unknown":
    at = written = ""
  elif there:
    at, written = " there", " written there"
  else:
    at = written = f" at {site}"
  api, vjp = _called(ctx)
  kind = api.rsplit(".", 1)[-1] if api else None
  if kind in _TRANSPOSE_OF.get(op, ()):
    return f"autodiff's transpose of the {api}{written}"
  transposed = _under_transpose(ctx)
  if vjp and kind is None and transposed:
    return f"a collective of the backward function of the jax.custom_vjp called{at}"
  if op != "sum" or not (transposed or kind not in _SUMS | {None}):
    return ""
  over = ", ".join(repr(a) for a in axes)
  check_vma = _typed_varying(ctx.avals_in[0], axes)
  grad = f"autodiff's reduction of the gradient of a value replicated over {over}"
  if kind in _CASTS:
    return f"{grad} (the transpose of the {api}{written})"
  if kind in _SUMS and not check_vma:  # (psum's transpose, without check_vma)
    return f"autodiff's transpose of the {api}{written}"
  if kind is not None and check_vma:
    return f"{grad} (the pvary {api} inserts on a replicated operand{at})"
  if kind is None and check_vma:
    return f"{grad} (check_vma's implicit pvary where it meets a varying value{at})"
  if kind is None:
    return (f"autodiff's reduction of the gradient of a shard_map input replicated over "
            f"{over} (check_vma=False){at}")
  return f"a collective autodiff wrote for the code{at}"


def call_text(ctx, op: str, axes: tuple) -> str:
  """The call an error names: its site, operand and axes, and for a collective
  that autodiff or check_vma wrote, what it is: "model.py:12 (loss) (f32[64]
  over ('tp',)), autodiff's transpose of the jax.lax.all_gather written there"."""
  aval = ctx.avals_in[0]
  text = f"{site_of(ctx)} ({aval.str_short()} over {axes})"
  what = origin(ctx, op, axes, there=True)
  return f"{text}, {what}" if what else text


def with_origin(reason: str, ctx, op: str, axes: tuple) -> str:
  """A call site's `reason`, followed for a collective that autodiff or
  check_vma wrote by what it is ("...; this call is autodiff's transpose of
  the jax.lax.all_gather written there": the CallSite's site)."""
  what = origin(ctx, op, axes, there=True)
  return f"{reason}; this call is {what}" if what else reason
