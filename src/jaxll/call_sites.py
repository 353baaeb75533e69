"""Which path each call site of a jaxll collective took.

Every lowering rule tags the ops it emits with a frontend attribute
``jaxll_call`` describing its decision (visible in ``jax.jit(f).lower(...)
.as_text()`` and in XLA's HLO dumps), keeps the last decisions in memory, and
logs them on the ``jaxll`` logger at INFO level (``JAXLL_LOG_PATHS=1`` turns
that on).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import re
import threading
import urllib.parse

from jaxll import settings
from jaxll.internals import ir

logger = logging.getLogger("jaxll")

if settings.log_paths():
  logger.setLevel(logging.INFO)
  if not logger.handlers:
    logger.addHandler(logging.StreamHandler())


@dataclasses.dataclass(frozen=True)
class CallSite:
  """The decision taken for one call site of a jaxll collective (``op`` says which:
  sum/max/min for ``jaxll.all_reduce``, sum+rmsnorm, all_gather, psum_scatter)."""
  site: str          # "file.py:LINE (function)" of the user's call, when known, then
                     # " <- caller" for each user function that called it directly
  axes: str          # mesh axes reduced over, comma-separated
  group_size: int    # devices per reduction group (0 if unknown)
  shape: str         # per-device shape, e.g. "(1024,)"
  dtype: str
  nbytes: int        # bytes per device
  op: str
  requested: str     # algorithm asked for
  algorithm: str     # algorithm it lowered to ("xla" = XLA's own all-reduce)
  reason: str
  workspace: int     # workspace id (0 for xla)
  dimension: int = -1  # the dimension gathered along or scattered (-1: an all-reduce)

  def encode(self) -> str:
    """The ``jaxll_call`` attribute's text: ``field=value`` for every field,
    joined by ";", each value percent-encoded (see _escape) so that decode()
    gives back exactly these strings."""
    return ";".join(f"{f.name}={_escape(str(getattr(self, f.name)))}"
                    for f in dataclasses.fields(self))

  @classmethod
  def decode(cls, text: str) -> "CallSite":
    values = dict(part.split("=", 1) for part in text.split(";"))
    kwargs = {}
    for f in dataclasses.fields(cls):
      if f.name not in values and f.default is not dataclasses.MISSING:
        continue
      v = urllib.parse.unquote(values.get(f.name, ""), errors="surrogatepass")
      kwargs[f.name] = int(v) if f.type in ("int", int) else v
    return cls(**kwargs)


# Printable ASCII but the attribute's separators (";", "="), the escape ("%") and
# what MLIR and HLO escape in a quoted string ('"', "\\") stays as it is, so that
# the lowered text reads; everything else is percent-encoded (UTF-8).
_SAFE = "".join(chr(c) for c in range(0x20, 0x7f) if chr(c) not in '%;="\\')


def _escape(text: str) -> str:
  return urllib.parse.quote(text, safe=_SAFE, errors="surrogatepass")


ATTRIBUTE = "jaxll_call"
_recent: collections.deque[CallSite] = collections.deque(maxlen=1000)
_recent_lock = threading.Lock()


def tag(results, site: CallSite) -> None:
  """Records `site` on the ops that produce `results` (the ``jaxll_call``
  frontend attribute, which explain reads back from the lowered text); a
  result no op produces is skipped (internals.produced_by_an_op gives it one)."""
  value = ir.StringAttr.get(site.encode())
  for r in results:
    owner = getattr(r, "owner", None)
    if owner is None or isinstance(owner, ir.Block):
      continue
    op = getattr(owner, "operation", owner)
    existing = {}
    if "mhlo.frontend_attributes" in op.attributes:
      old = ir.DictAttr(op.attributes["mhlo.frontend_attributes"])
      existing = {old[i].name: old[i].attr for i in range(len(old))}
    existing[ATTRIBUTE] = value
    op.attributes["mhlo.frontend_attributes"] = ir.DictAttr.get(existing)


def record(site: CallSite) -> None:
  with _recent_lock:
    _recent.append(site)
  logger.info("jaxll %s at %s: %s (%s) for %s %s over %s", site.op,
              site.site, site.algorithm, site.reason, site.shape, site.dtype, site.axes)


def recent_call_sites() -> list[CallSite]:
  """Decisions of the most recent lowerings in this process (up to 1000)."""
  with _recent_lock:
    return list(_recent)


_ATTR_RE = re.compile(ATTRIBUTE + r'\s*=\s*"([^"]*)"')


def call_sites_in(text: str) -> list[CallSite]:
  """The decisions recorded in lowered StableHLO / HLO text, in program order."""
  return [CallSite.decode(m.group(1)) for m in _ATTR_RE.finditer(text)]


def explain(fn, *args, **kwargs) -> list[CallSite]:
  """Lowers ``jax.jit(fn)`` for these arguments and returns, for every
  jaxll collective call site in it (``all_reduce``, ``all_reduce_rmsnorm``,
  ``all_gather``, ``psum_scatter``), the path it took.

  Example::

    for site in jaxll.explain(step, params, batch):
      print(site.site, site.algorithm, site.reason)
  """
  import jax
  jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
  return call_sites_in(jitted.lower(*args, **kwargs).as_text())
