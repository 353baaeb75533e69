"""jaxll's collectives against JAX's, case by case: the same result, sharding
and type (or the same exception) for every collective, input type, mesh form
and transform. The cases run on 8 CPU devices, a (2, 4) mesh of Explicit axes
("a", "x"), each collective over "x".

    python tests/conformance.py     # the table for the installed jax and jaxll

prints one line per case; tests/test_conformance_cpu.py asserts every case.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np

AXIS = "x"

_CYCLIC = [(i, (i + 1) % 4) for i in range(4)]  # (over "x", of size 4)
_PARTIAL = [(0, 2), (3, 1)]
_A2A = {"split_axis": 0, "concat_axis": 0, "tiled": True}
_A2A_10 = {"split_axis": 1, "concat_axis": 0, "tiled": True}
# collective -> (JAX's, jaxll's), each a function of the per-device value
COLLECTIVES = {
    "psum": ("psum", {}, "all_reduce", {}),
    "pmax": ("pmax", {}, "all_reduce", {"op": "max"}),
    "pmin": ("pmin", {}, "all_reduce", {"op": "min"}),
    "pmean": ("pmean", {}, "all_reduce", {"op": "mean"}),
    "all_gather": ("all_gather", {"tiled": True}, "all_gather", {"tiled": True}),
    "all_gather(to=invarying)": ("all_gather", {"tiled": True, "to": "invarying"},
                                 "all_gather", {"tiled": True, "to": "invarying"}),
    "all_gather(to=reduced)": ("all_gather", {"tiled": True, "to": "reduced"},
                               "all_gather", {"tiled": True, "to": "reduced"}),
    "psum_scatter": ("psum_scatter", {"tiled": True}, "psum_scatter", {"tiled": True}),
    "ppermute(cyclic)": ("ppermute", {"perm": _CYCLIC}, "ppermute", {"perm": _CYCLIC}),
    "ppermute(partial)": ("ppermute", {"perm": _PARTIAL}, "ppermute", {"perm": _PARTIAL}),
    "all_to_all": ("all_to_all", _A2A, "all_to_all", _A2A),
    "all_to_all(split 1, concat 0)": ("all_to_all", _A2A_10, "all_to_all", _A2A_10),
    # (_ragged below: row j of every device to device j, at the sender's index)
    "ragged_all_to_all": ("ragged_all_to_all", {}, "ragged_all_to_all", {}),
}
INPUTS = ("varying", "invariant", "unreduced", "reduced")
MESHES = ("concrete", "abstract", "set_mesh")
# plain; grad: of the sum of shard_map's output; grad_inside: jax.grad inside the
# body; vmap: inside the body
TRANSFORMS = ("plain", "grad", "grad_inside", "vmap")


def collective(name: str, impl: str):
  import jax
  import jaxll
  jax_name, jax_kw, ll_name, ll_kw = COLLECTIVES[name]
  if impl == "jax":
    fn, kw = getattr(jax.lax, jax_name), jax_kw
  else:
    fn, kw = getattr(jaxll, ll_name), ll_kw
  if name == "ragged_all_to_all":
    return lambda v: _ragged(fn, v)
  return lambda v: fn(v, AXIS, **kw)


def _ragged(fn, v):
  """A ragged all-to-all of `v`'s rows: row j (of the first 4) to device j of
  AXIS, written at the row of the sender's index into zeros."""
  import jax
  import jax.numpy as jnp
  n = jax.lax.axis_size(AXIS)
  me = jax.lax.axis_index(AXIS)
  ones = jnp.ones(n, jnp.int32)
  return fn(v, jnp.zeros_like(v), jnp.arange(n, dtype=jnp.int32), ones, me * ones, ones,
            axis_name=AXIS)


class _JaxRaggedOnCpu:
  """While it lives, JAX's own ragged_all_to_all primitive lowers on the CPU
  (which XLA gives none) to jaxll's composition of an all-to-all and a
  scatter (jaxll.ragged.composed): JAX's typing, autodiff and batching rules
  then run, and jaxll's are compared with them, values included."""

  def __enter__(self):
    from jax._src.interpreters import mlir
    from jax._src.lax import parallel
    from jaxll.ragged import composed
    self.table = mlir._platform_specific_lowerings["cpu"]
    self.prim = parallel.ragged_all_to_all_p
    self.saved = self.table.get(self.prim)
    from jaxll import internals

    def lowered(*a, axis_name, axis_index_groups):
      with internals.checking_vma(False):
        return composed(*a, axis_name=axis_name, axis_index_groups=axis_index_groups)

    rule = mlir.lower_fun(lowered, multiple_results=False)
    mlir.register_lowering(self.prim, rule, platform="cpu")
    return self

  def __exit__(self, *exc):
    if self.saved is None:
      self.table.pop(self.prim, None)
    else:
      self.table[self.prim] = self.saved


def _prepare(v, input_type: str):
  """The per-device value of `input_type` over AXIS, from a varying (sharded)
  or invariant (replicated) one."""
  import jax
  if input_type == "unreduced":
    return jax.lax.pcast(v, AXIS, to="unreduced")
  if input_type == "reduced":
    return jax.lax.pcast(v, AXIS, to="reduced")
  return v


def _state(aval) -> str:
  mat = aval.mat
  for state, axes in (("varying", mat.varying), ("unreduced", mat.unreduced),
                      ("reduced", mat.reduced)):
    if AXIS in axes:
      return state
  return "invariant"


def _out_spec(state: str):
  from jax.sharding import PartitionSpec as P
  return {"varying": P(AXIS), "invariant": P(), "unreduced": P(unreduced={AXIS}),
          "reduced": P(reduced={AXIS})}[state]


@dataclasses.dataclass
class Outcome:
  """What one implementation did with one case."""
  value: np.ndarray | None = None
  sharding: str = ""
  types: tuple = ()      # the traced output types inside shard_map, as JAX prints them
  error: str = ""        # the exception's class, where it raised

  def summary(self) -> str:
    if self.error:
      return f"raises {self.error}"
    return " ".join(self.types)


def mesh(devices):
  import jax
  from jax.sharding import AxisType
  return jax.make_mesh((2, 4), ("a", AXIS), axis_types=(AxisType.Explicit,) * 2,
                       devices=devices)


def run(devices, name: str, input_type: str, mesh_form: str, transform: str,
        impl: str) -> Outcome:
  """Runs one case with JAX's (`impl="jax"`) or jaxll's collective."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  m = mesh(devices)
  coll = collective(name, impl)
  in_spec = P(AXIS) if input_type in ("varying", "unreduced") else P()
  x = jax.device_put(np.arange(16 * 8, dtype=np.float32).reshape(16, 8) % 7,
                     NamedSharding(m, in_spec))
  types = []

  def body(v):
    if transform == "vmap":  # a batch of two inside the body, the collective vmapped
      y = jax.vmap(lambda r: coll(_prepare(r, input_type)))(jnp.stack([v, 2 * v]))
    elif transform == "grad_inside":  # the collective's transpose, inside the body
      y = jax.grad(lambda r: jnp.sum(coll(_prepare(r, input_type)) ** 2))(v)
    else:
      y = coll(_prepare(v, input_type))
    types.append(str(jax.typeof(y)))
    return y

  def shmap(fun, out_spec):
    if mesh_form == "set_mesh":
      return jax.shard_map(fun, in_specs=in_spec, out_specs=out_spec)
    return jax.shard_map(fun, mesh=m if mesh_form == "concrete" else m.abstract_mesh,
                         in_specs=in_spec, out_specs=out_spec)

  def traced_state():
    # the output's type decides the out_specs: trace once with a stand-in output
    states = []

    def probe(v):
      y = body(v)
      states.append(_state(jax.typeof(y)))
      return jax.lax.axis_index(AXIS)[None].astype(np.float32)

    jax.jit(shmap(probe, P(AXIS))).trace(x)
    return states[0]

  def go():
    f = shmap(body, _out_spec(traced_state()))
    if transform == "grad":
      g = jax.jit(jax.grad(lambda v: f(v).sum()))
      return g(x)
    return jax.jit(f)(x)

  try:
    with _JaxRaggedOnCpu():
      if mesh_form == "set_mesh":
        with jax.set_mesh(m):
          out = go()
      else:
        out = go()
    return Outcome(value=np.asarray(out), sharding=str(out.sharding.spec), types=tuple(types))
  except Exception as e:  # (the outcome: JAX's own collectives raise in some cases)
    return Outcome(error=type(e).__name__ + ": " + str(e).split("\n")[0][:160])


def known_difference(case, ref: Outcome, got: Outcome) -> str:
  """Why jaxll's outcome of `case` rightly differs from the installed JAX's,
  or "": jax.lax.ragged_all_to_all's batching rule before jax 0.12 asserts on
  offsets it does not batch (jax 0.12 broadcasts them); jaxll follows 0.12."""
  name, _, _, transform = case
  if (name == "ragged_all_to_all" and transform == "vmap" and
      ref.error.startswith("AssertionError") and not got.error):
    return "jax.lax.ragged_all_to_all's batching rule of jax < 0.12 asserts on unbatched offsets"
  return ""


def compare(ref: Outcome, got: Outcome) -> str:
  """"" where jaxll's outcome equals JAX's, else what differs."""
  if ref.error or got.error:
    ref_class, got_class = ref.error.split(":")[0], got.error.split(":")[0]
    if ref_class == got_class:
      return ""
    return f"JAX {ref.summary()}; jaxll {got.summary()}"
  if ref.types != got.types:
    return f"types: JAX {ref.types}, jaxll {got.types}"
  if ref.sharding != got.sharding:
    return f"sharding: JAX {ref.sharding}, jaxll {got.sharding}"
  if ref.value.shape != got.value.shape or not np.array_equal(ref.value, got.value):
    return "values differ"
  return ""


def cases():
  for name in COLLECTIVES:
    for input_type in INPUTS:
      for mesh_form in MESHES:
        for transform in TRANSFORMS:
          yield name, input_type, mesh_form, transform


def main() -> int:
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8")
  import jax
  import jaxll
  devices = jax.devices("cpu")[:8]
  print(f"jax {jax.__version__}, jaxll {jaxll.__version__}")
  bad = 0
  for case in cases():
    ref = run(devices, *case, impl="jax")
    got = run(devices, *case, impl="jaxll")
    diff = "" if known_difference(case, ref, got) else compare(ref, got)
    bad += bool(diff)
    print(f"{'DIFF' if diff else 'same'} {' '.join(case)}: JAX {ref.summary()}"
          + (f" | {diff}" if diff else ""))
  print(f"{bad} of {len(list(cases()))} cases differ")
  return 0


if __name__ == "__main__":
  sys.exit(main())
