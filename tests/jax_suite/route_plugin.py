"""A pytest plugin that routes every function given to ``shard_map`` through ``jaxll.route``.

Loaded with ``-p route_plugin`` (this folder on ``PYTHONPATH``). With
``JAXLL_ROUTE_JAX_TESTS=1`` it replaces, before any test module is imported,

- ``jax.shard_map`` and ``jax._src.shard_map.shard_map`` (the same function; JAX's
  tests import the second),
- ``jax.experimental.shard_map.shard_map`` where it exists,

by a function that calls the original with ``jaxll.route(f)`` in place of ``f`` and
every other argument as given; the decorator form (``shard_map(mesh=..., ...)`` with
no function) returns a decorator that routes the function it is given. Without the
variable it patches nothing and only counts.

Either way it counts, per test, what jaxll saw: the functions routed; jaxll's
collectives in the jaxprs that ``jax.core.eval_jaxpr`` evaluates, nested ones
included (``jaxll.route`` evaluates the routed jaxpr with it: a count that stays 0
while the others do not means route evaluates its jaxpr some other way); the binds
of jaxll's collective primitives (only those at the top of a routed jaxpr: one in a
loop, conditional or jit body is bound with its parent); and the call sites lowered
(``jaxll.call_sites.record``). ``JAXLL_ROUTE_JAX_TESTS_REPORT=<file>`` writes them as
JSON at the end of the pytest run: ``{"routed": bool, "totals": {...}, "tests": {id:
{...}}}``, with the ids pytest's junit XML uses (``classname`` and ``name``).
"""

from __future__ import annotations

import collections
import functools
import json
import os

COUNTERS = ("functions_routed", "collectives_in_routed_jaxprs", "collectives_bound",
            "call_sites_lowered")

_totals = collections.Counter()
_per_test: dict = {}
_current: list = [None]  # the counter of the test that runs now
_ops = collections.Counter()  # lowered call sites per op


def _count(name: str, n: int = 1) -> None:
  _totals[name] += n
  if _current[0] is not None:
    _current[0][name] += n


def routing() -> bool:
  return os.environ.get("JAXLL_ROUTE_JAX_TESTS", "") not in ("", "0")


def _routing_shard_map(original):
  """``original`` (a shard_map) with ``jaxll.route`` around the function it maps."""
  import jaxll

  def route(f):
    _count("functions_routed")
    return jaxll.route(f)

  @functools.wraps(original)
  def shard_map(f=None, *args, **kwargs):
    if f is None:  # the decorator form: shard_map(mesh=..., in_specs=..., out_specs=...)
      decorator = original(None, *args, **kwargs)
      return lambda g: decorator(route(g))
    return original(route(f), *args, **kwargs)

  shard_map.__jaxll_routes__ = original
  return shard_map


def _patch_shard_map() -> list[str]:
  """Replaces every public name of shard_map; returns the names replaced."""
  import jax
  from jax._src import shard_map as src

  patched = []
  routed = _routing_shard_map(src.shard_map)
  for module, name in ((src, "shard_map"), (jax, "shard_map")):
    if getattr(module, name, None) is routed.__jaxll_routes__:
      setattr(module, name, routed)
      patched.append(f"{module.__name__}.{name}")
  try:
    import jax.experimental.shard_map as experimental
  except ImportError:
    return patched
  # A deprecated name that jax serves through the module's __getattr__ (or a plain
  # attribute in versions where it is not deprecated)
  deprecations = getattr(experimental, "_deprecations", {})
  if "shard_map" in deprecations:
    message, fn = deprecations["shard_map"]
    if fn is not None:
      deprecations["shard_map"] = (message, _experimental(fn))
      patched.append("jax.experimental.shard_map.shard_map (deprecated)")
  elif callable(experimental.__dict__.get("shard_map")):
    experimental.shard_map = _experimental(experimental.shard_map)
    patched.append("jax.experimental.shard_map.shard_map")
  return patched


def _experimental(original):
  """The experimental shard_map (f, mesh, in_specs, out_specs, ...) with f routed."""
  import jaxll

  @functools.wraps(original)
  def shard_map(f, *args, **kwargs):
    _count("functions_routed")
    return original(jaxll.route(f), *args, **kwargs)

  return shard_map


def _count_binds() -> None:
  """Counts each bind of jaxll's collective primitives (on the primitive objects)."""
  from jaxll.all_reduce import all_reduce_p
  from jaxll.gather_scatter import all_gather_p, psum_scatter_p

  for prim in (all_reduce_p, all_gather_p, psum_scatter_p):
    bind = prim.bind

    def counted(*args, _bind=bind, **params):
      _count("collectives_bound")
      return _bind(*args, **params)

    prim.bind = counted


def _jaxll_eqns(jaxpr, prims) -> int:
  """jaxll's collectives in `jaxpr` (a Jaxpr or ClosedJaxpr), nested jaxprs included."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  n = 0
  for eqn in getattr(jaxpr, "eqns", ()):
    n += eqn.primitive in prims
    for v in eqn.params.values():
      for sub in (v if isinstance(v, (tuple, list)) else (v,)):
        if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
          n += _jaxll_eqns(sub, prims)
  return n


def _count_evaluated() -> None:
  """Counts jaxll's collectives in every jaxpr ``jax.core.eval_jaxpr`` evaluates."""
  import jax
  from jaxll.all_reduce import all_reduce_p
  from jaxll.gather_scatter import all_gather_p, psum_scatter_p

  prims = (all_reduce_p, all_gather_p, psum_scatter_p)
  evaluate = jax.core.eval_jaxpr

  @functools.wraps(evaluate)
  def counted(jaxpr, *args, **kwargs):
    n = _jaxll_eqns(jaxpr, prims)
    if n:
      _count("collectives_in_routed_jaxprs", n)
    return evaluate(jaxpr, *args, **kwargs)

  jax.core.eval_jaxpr = counted


def _count_call_sites() -> None:
  from jaxll import call_sites

  record = call_sites.record

  def counted(site):
    _count("call_sites_lowered")
    _ops[site.op] += 1
    return record(site)

  call_sites.record = counted


def pytest_configure(config):
  _count_binds()
  _count_evaluated()
  _count_call_sites()
  config._jaxll_patched = _patch_shard_map() if routing() else []


def pytest_report_header(config):
  names = getattr(config, "_jaxll_patched", [])
  if not routing():
    return "jaxll route plugin: not routing (JAXLL_ROUTE_JAX_TESTS unset), counting only"
  return "jaxll route plugin: routing through jaxll.route: " + ", ".join(names)


def _test_id(item) -> str:
  """``classname::name`` as pytest's junit XML writes them."""
  names = item.nodeid.split("::")
  module = names[0].replace("/", ".").removesuffix(".py")
  classname = ".".join([module] + names[1:-1])
  return f"{classname}::{names[-1]}"


def pytest_runtest_setup(item):
  _current[0] = _per_test.setdefault(_test_id(item), collections.Counter())


def pytest_runtest_teardown(item, nextitem):
  _current[0] = None


def pytest_sessionfinish(session, exitstatus):
  path = os.environ.get("JAXLL_ROUTE_JAX_TESTS_REPORT")
  if not path:
    return
  report = {"routed": routing(),
            "patched": getattr(session.config, "_jaxll_patched", []),
            "totals": {k: _totals[k] for k in COUNTERS},
            "call_sites_by_op": dict(_ops),
            "tests": {t: {k: c[k] for k in COUNTERS if c[k]} for t, c in _per_test.items()}}
  with open(path, "w") as f:
    json.dump(report, f, indent=1, sort_keys=True)
