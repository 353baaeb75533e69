"""jaxll's collectives give JAX's results and types on 8 CPU devices: every
collective (psum, pmax, pmin, pmean, all_gather with each ``to=``,
psum_scatter) x input type (varying, invariant, unreduced, reduced) x mesh form
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
