"""Building collectives of your own on jaxll's workspaces.

An out-of-tree CUDA extension (see ``examples/custom_collective``) writes its
kernel against the device API (``jaxll.get_include()``, or CMake's
``find_package(jaxll CONFIG)`` with ``jaxll_DIR=jaxll.get_cmake_dir()``) and
registers its own XLA FFI target. Its JAX primitive's GPU lowering rule,
registered with :func:`register_lowering`, calls :func:`workspace_for` and
:func:`emit_call`:

  def _lowering(ctx, x, *, axes):
    ws, group_size, reason = jaxll.extension.workspace_for(ctx, axes)
    if not ws:
      return fallback_rule(ctx, x, axes=axes)        # XLA's collectives
    return jaxll.extension.emit_call(ctx, "my_target", [x], workspace=ws)

  jaxll.extension.register_lowering(my_p, _lowering, platform="cuda")

:func:`emit_call` adds the workspace id as the ``workspace`` attribute and a 4-byte
order buffer as the last operand and result, which chains the call with
jaxll's own calls of the same block, so XLA keeps every rank's calls on a
workspace in one order and never runs two at once (see ``jaxll/ordering.py``);
the handler must accept and ignore it. At run time the handler turns
(``workspace``, device ordinal) into the rank's ``RankView`` through the table
:func:`api` returns (``jaxll/extension.h``); the extension's init registers
a loader of its kernels there (``register_loader``), which jaxll runs on a
workspace's devices while it builds it, so that they are never loaded inside a
step.
"""

from __future__ import annotations

import os

from jaxll import internals, native, ordering, placement

__all__ = ["api", "emit_call", "get_cmake_dir", "get_include", "register_lowering",
           "workspace_for"]

_HERE = os.path.dirname(os.path.abspath(__file__))


def get_include() -> str:
  """The directory that holds ``jaxll/jaxll.cuh`` (the device API) and
  ``jaxll/extension.h``: add it to an extension's include path."""
  return os.path.join(_HERE, "include")


def get_cmake_dir() -> str:
  """The directory of ``jaxllConfig.cmake``: set ``jaxll_DIR`` to it, then
  ``find_package(jaxll CONFIG REQUIRED)`` gives the target ``jaxll::device_api``."""
  return os.path.join(_HERE, "cmake")


def api():
  """A PyCapsule named ``"jaxll.extension_api"`` holding the
  ``const jaxll::ExtensionApi*`` (``jaxll/extension.h``). Raises RuntimeError
  where jaxll was installed without its CUDA kernels."""
  if native.ext is None:
    raise RuntimeError(f"jaxll.extension.api(): {native.NO_KERNELS_REASON}")
  return native.ext.extension_api()


def workspace_for(ctx, axes) -> tuple[int, int, str]:
  """In a lowering rule: ``(workspace id, group size, reason)`` for a
  collective over the mesh axis name(s) `axes`. The id is that of the
  workspace jaxll's own calls over those axes use (built on first use); 0 when
  no kernel can serve the call here (CPU, a group spanning hosts,
  ``JAXLL_DISABLE``, ...), with the reason: lower to XLA's collectives then."""
  axes = tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)
  return placement.workspace_for(ctx, axes)


def emit_call(ctx, target: str, operands, *, workspace: int, **attributes) -> list:
  """In a lowering rule: the custom call of FFI target `target` on
  `workspace`, operands `operands` (typed by ``ctx.avals_in``), results typed
  by ``ctx.avals_out``, ordered among the program's jaxll calls (the order
  buffer is the last operand and the last result; the returned list leaves
  it out). Extra keyword arguments become FFI attributes (numpy scalars or
  arrays, as ``jax.ffi.ffi_lowering`` takes them)."""
  if not workspace:
    raise ValueError("jaxll.extension.emit_call: no workspace (workspace_for returned 0: "
                     "lower to XLA's collectives instead)")
  return ordering.emit_ordered_call(ctx, target, list(operands), workspace=int(workspace),
                                    **attributes)


def register_lowering(primitive, rule, *, platform: str | None = "cuda") -> None:
  """Registers `rule` as `primitive`'s lowering (for `platform`) the way
  jaxll registers its own: emitted inline at every call, never cached into a
  shared function, so that :func:`emit_call` sees the block the call is in and
  chains it with the calls around it. (JAX's default caches a primitive's
  lowering in a function of its own; the call would then start a chain of its
  own, unordered against jaxll's calls.)"""
  internals.register_lowering(primitive, rule, platform=platform)
