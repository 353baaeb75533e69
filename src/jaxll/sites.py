"""Naming a call site: the user's line (and up to two user functions that called
it) of each jaxll collective, as ``jaxll.explain`` and the errors show it.
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
  tb = getattr(ctx, "traceback", None)
  frames = list(getattr(tb, "frames", None) or ())
  return _chain_of_frames((fr.file_name, fr.line_num, fr.function_name) for fr in frames)


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


def _chain_of_frames(frames) -> str:
  """frames: (file, line, function), innermost first."""
  here = os.path.dirname(os.path.abspath(__file__))
  jax_dir = os.path.dirname(os.path.abspath(jax.__file__))
  # The innermost user frame, followed by the user frames that called it
  # directly (a helper and its callers, up to 3), so that call sites that go
  # through one helper are told apart: "layers.py:8 (reduce) <- model.py:40 (mlp)".
  chain = []
  for file_name, line_num, function_name in frames:
    path = os.path.abspath(file_name)
    if path.startswith(here) or path.startswith(jax_dir):
      if chain:
        break
      continue
    chain.append(f"{os.path.basename(file_name)}:{line_num} ({function_name})")
    if len(chain) == 3:
      break
  return " <- ".join(chain) if chain else "unknown"


