"""How kernel calls lower, cross-lowered for CUDA on CPU: every call of a
program chained in program order through its order operand (across loops and
conditionals), and one host check of every workspace at the program's start."""

import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll

ALL_REDUCE = sys.modules["jaxll.all_reduce"]  # (the module; jaxll.all_reduce is the function)


def _put(mesh, x, spec):
  return jax.device_put(x, NamedSharding(mesh, spec))


def _kernel_call_chains(text: str) -> list[list[tuple[str, str]]]:
  """(result, order operand) of each jaxll_all_reduce custom call in the
  lowered text, grouped into chains: a call whose order operand is the order
  result (#1) of an earlier call continues that call's chain."""
  calls = re.findall(r"(%[\w]+):2 = stablehlo\.custom_call @jaxll_all_reduce\((%[\w#]+), (%[\w#]+)\)",
                     text)
  chains, tail = [], {}
  for result, _, order in calls:
    if order in tail:
      chain = tail.pop(order)
    else:
      chain = []
      chains.append(chain)
    chain.append((result, order))
    tail[f"{result}#1"] = chain
  return chains


def test_kernel_calls_are_chained_in_program_order(mesh1, monkeypatch):
  # Every kernel call reads and advances the workspace's epochs, so the calls of
  # one block take and return an order buffer that chains them in program order
  # (XLA may otherwise reorder independent calls, or run them side by side in a
  # concurrent command buffer). Lowering only: CPU cannot run the kernels, so the
  # path decision is forced to a kernel here.
  monkeypatch.setattr(ALL_REDUCE, "decide", lambda ctx, aval, axes, op, requested:
                      ALL_REDUCE.Decision("oneshot_ll", "forced by the test", 7, 8))

  def body(a, b):
    outs = [jaxll.all_reduce(a, "tp"), jaxll.all_reduce(b, "tp"), jaxll.all_reduce(a * 2, "tp")]
    loop = jax.lax.fori_loop(0, 3, lambda i, v: jaxll.all_reduce(jaxll.all_reduce(v, "tp"), "tp"), b)
    return (*outs, loop, jaxll.all_reduce(b * 3, "tp"))

  f = jax.jit(jax.shard_map(body, mesh=mesh1, in_specs=(P("tp"), P("tp")),
                            out_specs=(P(),) * 5, check_vma=False))
  x = _put(mesh1, np.ones((8,), np.float32), P("tp"))
  text = f.lower(x, x).as_text()
  chains = _kernel_call_chains(text)
  # the first three calls of the function body form one chain, in program
  # order; the loop body's two calls their own; the call after the loop
  # continues the first chain through a join with the loop (see
  # test_kernel_calls_stay_ordered_across_loops_and_conditionals)
  assert sorted(len(c) for c in chains) == [1, 2, 3], chains
  # the body's chain starts at the program's host check (which runs first), the
  # loop body's and the call after the loop at a join (a custom call XLA keeps,
  # unlike an optimization barrier, which it removes after scheduling)
  starts = {}
  for chain in chains:
    first = re.escape(chain[0][1].split("#")[0])
    if re.search(rf"{first} = stablehlo\.custom_call @jaxll_check", text):
      starts[len(chain)] = "check"
    elif re.search(rf"{first} = stablehlo\.custom_call @jaxll_join", text):
      starts[len(chain)] = "join"
  assert starts == {3: "check", 2: "join", 1: "join"}, (starts, chains)
  assert "optimization_barrier" not in text
  assert text.count("@jaxll_all_reduce(") == 6


def _top_level_deps(text: str):
  """(ops, deps) of the block that holds the host check (the shard_map body) in
  lowered text: ops is [(result, op name)] in program order, deps maps a
  result name to the names it uses directly (for a loop or conditional: its
  operands)."""
  lines = text.splitlines()
  start = next(i for i, line in enumerate(lines) if "@jaxll_check" in line)
  indent = len(lines[start]) - len(lines[start].lstrip())
  ops, deps = [], {}
  for line in lines[start:]:
    here = len(line) - len(line.lstrip())
    if line.strip() and here < indent:
      break
    m = re.match(r"(%[\w]+)(?::\d+)? = \"?([\w.]+)\"?(.*)", line.strip())
    if here != indent or not m:
      continue
    result, name, rest = m.groups()
    rest = rest.split(" : ", 1)[0] if name != "stablehlo.while" else rest.split(")", 1)[0]
    if name == "stablehlo.custom_call":
      name = "call " + re.match(r" @(\w+)", rest).group(1)
    ops.append((result, name))
    deps[result] = {u.split("#")[0] for u in re.findall(r"%[\w]+(?:#\d+)?", rest)}
  return ops, deps


def _reaches(deps, start, target) -> bool:
  seen, todo = set(), [start]
  while todo:
    v = todo.pop()
    if v == target:
      return True
    if v not in seen:
      seen.add(v)
      todo.extend(deps.get(v, ()))
  return False


def test_kernel_calls_stay_ordered_across_loops_and_conditionals(mesh1, monkeypatch):
  # A loop or conditional that holds kernel calls (JAX often outlines a loop
  # body into a function called with func.call) must run after the calls before
  # it and before the calls after it: the conjugate-gradient pattern (a dot
  # product, the iteration loop, a norm after it) otherwise lets XLA run the
  # norm before or beside the loop.
  monkeypatch.setattr(ALL_REDUCE, "decide", lambda ctx, aval, axes, op, requested:
                      ALL_REDUCE.Decision("oneshot_ll", "forced by the test", 7, 8))

  def ar(v):
    return jaxll.all_reduce(v, "tp")

  def body(a, b):
    c1 = ar(a)
    loop = jax.lax.fori_loop(0, 3, lambda i, v: ar(ar(v)), b)
    c2 = ar(b * 2)
    branch = jax.lax.cond(a[0] > 0, lambda v: ar(v) + 1, lambda v: ar(v * 2), b)
    scanned, _ = jax.lax.scan(lambda c, x: (ar(c) + x, None), b, jnp.ones((2,) + b.shape))
    c3 = ar(a * 3)
    return c1, loop, c2, branch, scanned, c3

  f = jax.jit(jax.shard_map(body, mesh=mesh1, in_specs=(P("tp"), P("tp")),
                            out_specs=(P(),) * 6, check_vma=False))
  x = _put(mesh1, np.ones((8,), np.float32), P("tp"))
  text = f.lower(x, x).as_text()
  ops, deps = _top_level_deps(text)
  holders = [r for r, name in ops
             if name in ("call jaxll_all_reduce", "stablehlo.while", "stablehlo.case")]
  kinds = [dict(ops)[r] for r in holders]
  assert kinds == ["call jaxll_all_reduce", "stablehlo.while", "call jaxll_all_reduce",
                   "stablehlo.case", "stablehlo.while", "call jaxll_all_reduce"], kinds
  for before, after in zip(holders, holders[1:]):
    assert _reaches(deps, after, before), (after, "does not depend on", before)
  # each outlined loop body starts its chain after the body's arguments
  for fn in re.findall(r"func\.func private @(closed_call\w*)\(", text):
    fbody = text.split(f"func.func private @{fn}(", 1)[1].split("\n  }", 1)[0]
    first = re.search(r"@jaxll_all_reduce\((%[\w#]+), (%[\w#]+)\)", fbody).group(2)
    assert re.search(rf"{first.split('#')[0]} = stablehlo\.custom_call @jaxll_join\(%c, %arg0",
                     fbody), fbody
  # a join that stands for an operand of a loop or conditional aliases it (no
  # copy); one that makes an order value does not
  joins = re.findall(r"stablehlo\.custom_call @jaxll_join\(([^)]*)\)([^\n]*)", text)
  assert joins and "optimization_barrier" not in text
  aliased = [rest for _, rest in joins if "output_operand_aliases" in rest]
  assert aliased and len(aliased) < len(joins), joins


def test_program_starts_with_one_host_check_of_every_workspace(mesh1, monkeypatch):
  # XLA replays command buffers without calling jaxll, so a program with kernel
  # calls starts with one host-only jaxll_check that lists every workspace its
  # calls use (it fails the run if one holds an error or was freed). Lowering
  # only, as above: two call sites forced onto workspaces 7 and 9, one of them
  # inside a loop.
  ids = iter([7, 9, 7, 9])
  monkeypatch.setattr(ALL_REDUCE, "decide", lambda ctx, aval, axes, op, requested:
                      ALL_REDUCE.Decision("oneshot_ll", "forced by the test", next(ids), 8))

  def body(a):
    a = jaxll.all_reduce(a, "tp")
    a = jax.lax.fori_loop(0, 2, lambda i, v: jaxll.all_reduce(v, "tp"), a)
    return jaxll.all_reduce(jaxll.all_reduce(a, "tp"), "tp")

  f = jax.jit(jax.shard_map(body, mesh=mesh1, in_specs=P("tp"), out_specs=P(),
                            check_vma=False))
  text = f.lower(_put(mesh1, np.ones((8,), np.float32), P("tp"))).as_text()
  checks = re.findall(r"stablehlo\.custom_call @jaxll_check\(\).*", text)
  assert len(checks) == 1, checks
  assert "has_side_effect = true" in checks[0]
  assert re.search(r"workspaces = dense<\[7, 9\]> : tensor<2xi64>", checks[0]), checks[0]
  # it comes first in the shard_map body, outside the loop
  assert text.index("@jaxll_check") < text.index("@jaxll_all_reduce")
  assert text.index("@jaxll_check") < text.index("stablehlo.while")
  # and its result starts the order chain of the body's calls, so it runs first
  name = re.search(r"(%[\w#]+) = stablehlo\.custom_call @jaxll_check", text).group(1)
  first = re.search(r"stablehlo\.custom_call @jaxll_all_reduce\(([^)]*)\)", text).group(1)
  assert first.split(", ")[1] == name, (first, name)


def test_no_host_check_without_kernel_calls(mesh1):
  f = jax.jit(jax.shard_map(lambda a: jaxll.all_reduce(a, "tp"), mesh=mesh1, in_specs=P("tp"),
                            out_specs=P(), check_vma=False))
  assert "jaxll_check" not in f.lower(_put(mesh1, np.ones((8,), np.float32), P("tp"))).as_text()
