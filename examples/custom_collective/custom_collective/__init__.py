"""``custom_collective.broadcast(x, axis_name, root=0)``: every rank of the
group gets rank `root`'s ``x``. An example of a collective built outside jaxll
on its device API and workspaces (see README.md): a kernel of its own
(``csrc/broadcast_kernel.cu``), its own XLA FFI target, and
``jaxll.extension`` to find the workspace and keep the call ordered among
jaxll's own calls. Where no kernel can serve the call (CPU, ...), it lowers to
XLA: a psum of ``x`` masked to the root.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core
from jax._src.interpreters import mlir

import jaxll

__all__ = ["broadcast", "kernels_available", "virtual_broadcast"]

try:
  from custom_collective import _broadcast as _ext
except ImportError:  # built without CUDA: XLA serves every call
  _ext = None

if _ext is not None and jaxll.kernels_available():
  _ext.init(jaxll.extension.api())
  jax.ffi.register_ffi_target("custom_broadcast", _ext.handler(), platform="CUDA")
else:
  _ext = None


def kernels_available() -> bool:
  return _ext is not None


def virtual_broadcast(x, *, root: int = 0, device=None) -> np.ndarray:
  """The kernel on virtual ranks (several ranks on one GPU, for tests): row r
  of ``x`` (shape ``(N, ...)``) is rank r's input, run by the N virtual ranks
  of ``jaxll.tools.testing.virtual_workspace(N)`` on `device` (the first GPU by
  default); returns the N ranks' outputs (each should be ``x[root]``)."""
  if _ext is None:
    raise RuntimeError("custom_collective.virtual_broadcast needs the compiled kernel and jaxll's")
  from jaxll.tools import testing
  x = np.ascontiguousarray(np.asarray(x))
  n = x.shape[0]
  if not 0 <= root < n:
    raise ValueError(f"root must be in 0..{n - 1}, got {root}")
  ws = testing.virtual_workspace(n, device=device)  # (raises without a CUDA GPU)
  out = _ext.virtual_broadcast(ws.id, ws.ordinals[0][0], n, x.tobytes(), int(root))
  return np.frombuffer(out, dtype=x.dtype).reshape(x.shape)


broadcast_p = core.Primitive("custom_broadcast")


def broadcast(x, axis_name, *, root: int = 0):
  """Rank `root`'s ``x`` on every rank of the group over `axis_name` (a mesh
  axis name or tuple of them; ranks in row-major order over them, as
  ``jax.lax.axis_index``). Use inside ``jax.shard_map``."""
  axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
  x = jnp.asarray(x)
  if not (jnp.issubdtype(x.dtype, jnp.number)):
    raise TypeError(f"broadcast: numeric arrays only, got {x.dtype}")
  return broadcast_p.bind(x, axes=axes, root=int(root))


def _abstract_eval(x, *, axes, root):
  del root
  vma = getattr(x, "vma", None)
  if vma is None:
    return core.ShapedArray(x.shape, x.dtype)
  return x.update(vma=frozenset(vma) - set(axes))  # the same on every rank: invariant


broadcast_p.def_abstract_eval(_abstract_eval)


def _reference(x, *, axes, root):
  me = jax.lax.axis_index(axes)
  return jax.lax.psum(jnp.where(me == root, x, jnp.zeros_like(x)), axes)


def _xla_lowering(ctx, x, *, axes, root):
  return mlir.lower_fun(lambda v: _reference(v, axes=axes, root=root),
                        multiple_results=False)(ctx, x)


def _cuda_lowering(ctx, x, *, axes, root):
  ws, group_size, reason = jaxll.extension.workspace_for(ctx, axes)
  if not ws or _ext is None or not 0 <= root < group_size:
    return _xla_lowering(ctx, x, axes=axes, root=root)
  return jaxll.extension.emit_call(ctx, "custom_broadcast", [x], workspace=ws,
                                   root=np.int64(root))


mlir.register_lowering(broadcast_p, _xla_lowering)
# (not cached, so the call is chained with jaxll's calls of the same block)
jaxll.extension.register_lowering(broadcast_p, _cuda_lowering, platform="cuda")
