"""jaxll's collectives give JAX's results and types on 8 CPU devices: every
collective (psum, pmax, pmin, pmean, all_gather with each ``to=``,
psum_scatter, ppermute cyclic and partial, all_to_all along two split
dimensions, ragged_all_to_all, whose JAX primitive lowers on the CPU to jaxll's
composition while the cases run) x input type (varying, invariant, unreduced, reduced) x mesh form
(concrete, abstract, ``jax.set_mesh``) x transform (none, grad outside and
inside shard_map, vmap). Where JAX raises, jaxll raises the same exception
class. The cases are in tests/conformance.py (``python tests/conformance.py``
prints the table)."""

import pytest

import conformance


@pytest.mark.parametrize("case", list(conformance.cases()), ids=" ".join)
def test_same_as_jax(cpu_devices, case):
  ref = conformance.run(cpu_devices, *case, impl="jax")
  got = conformance.run(cpu_devices, *case, impl="jaxll")
  if conformance.known_difference(case, ref, got):
    return
  assert conformance.compare(ref, got) == "", (ref.summary(), got.summary())


def test_cases_compute_something(cpu_devices):
  # The table is not all errors: JAX itself computes most cases, varying,
  # invariant and unreduced inputs among them, so equality above compares
  # values and types. (JAX's collectives take no reduced input: they raise.)
  ok = {}
  for case in conformance.cases():
    if case[2] == "concrete" and case[3] == "plain":
      ok[case[:2]] = not conformance.run(cpu_devices, *case, impl="jax").error
  for input_type in ("varying", "invariant", "unreduced"):
    assert any(v for (name, t), v in ok.items() if t == input_type), input_type
  assert sum(ok.values()) >= 14, ok


def test_varying_over_some_axes_invariant_over_others(cpu_devices):
  # The one difference kept: jax.lax.psum refuses an input varying over "a" and
  # invariant over "x" when it reduces over both; jaxll makes it vary over both
  # first (as it always has), i.e. psum of the pcast value. Unreduced over some
  # of the axes only is refused by both.
  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxll
  m = conformance.mesh(cpu_devices)
  x = jax.device_put(np.arange(32, dtype=np.float32).reshape(8, 4), NamedSharding(m, P("a")))
  types = {}

  def run(name, reduce):
    def body(v):
      y = reduce(v)
      types[name] = str(jax.typeof(y))
      return y
    return jax.jit(jax.shard_map(body, mesh=m, in_specs=P("a"), out_specs=P()))(x)

  want = run("jax", lambda v: jax.lax.psum(jax.lax.pcast(v, "x", to="varying"), ("a", "x")))
  got = run("jaxll", lambda v: jaxll.all_reduce(v, ("a", "x")))
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert types["jaxll"] == types["jax"]
  with pytest.raises(ValueError, match="can only accept"):
    run("jax", lambda v: jax.lax.psum(v, ("a", "x")))
  for reduce in (lambda u: jaxll.all_reduce(u, ("a", "x")),
                 lambda u: jaxll.psum_scatter(u, ("a", "x"), tiled=True)):
    with pytest.raises(ValueError, match="can only accept"):
      run("jaxll", lambda v: reduce(jax.lax.pcast(jax.lax.pcast(v, "x", to="varying"), "x",
                                                  to="unreduced")))
