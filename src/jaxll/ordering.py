"""Every jaxll custom call that touches a workspace goes through
emit_ordered_call: chained in program order with the calls around it (the
order chains and their joins), and announced to the program's host check,
which fails a run whose workspaces hold an error."""

from __future__ import annotations

import jax
import numpy as np
from jax.interpreters import mlir

from jaxll.internals import custom_call, ir

# --- Order chains --------------------------------------------------------------------------
# Every kernel call on a workspace reads and advances that workspace's epochs, so
# two calls must never run at the same time on one GPU, and every rank must make
# them in the same order. XLA orders only what data dependencies order: two
# independent all-reduces in one program may be scheduled either way round, and
# run side by side where XLA builds its command buffers from buffer dependencies
# (--xla_gpu_command_buffer_scheduling_mode=CONCURRENT). So the custom call takes
# and returns a 4-byte "order" buffer, and each call in a block (a function body,
# a loop body, a branch) takes the one the call before it in that block returned:
# a real read-after-write dependency, which every scheduler and every
# command-buffer mode keeps. The kernels never touch it.
#
# Blocks nest (a loop inside the shard_map body, a branch inside a loop; JAX
# often outlines a loop body into a function called with func.call), and the
# chain of a block is joined across them with ``jaxll_join`` custom calls: a
# join's result depends on all its operands, and the device does nothing for
# it. When a call is lowered, every op of its block since the block's previous
# call that holds kernel calls (a loop, a conditional or a func.call, searched
# through regions and called functions) is
#  - ordered after the calls before it: one of its operands (the smallest
#    tensor; for a loop, never its induction variable) passes through a join
#    with the chain's order value, the join's result aliasing that operand;
#  - ordered before this call: the order value this call takes is a join over
#    the chain's order value and the op's first tensor result.
# A loop or conditional whose calls are lowered inline is ordered after the
# calls before it as soon as its first call is lowered. The chain of a block
# with arguments (a loop body, an outlined function) starts from a join over
# them, so a call of iteration i+1 comes after everything iteration i returned,
# also in an unrolled or pipelined loop. Not joined: a call-holding op after
# the last call of its block that has no data dependency on the calls before it,
# and a func.call of a function JAX lowered earlier and reuses (the block is
# looked at again only when a call was emitted elsewhere since its last call).
# Joins are custom calls, which XLA never removes (it removes optimization
# barriers after scheduling), so they order command buffers built from buffer
# dependencies (CONCURRENT mode) as well as the schedule.
_ORDER_KEY = ("jaxll", "order chains")
_JOIN_TARGET = "jaxll_join"
_ORDER_AVAL = jax.core.ShapedArray((1,), np.dtype(np.uint32))
_CHECK_TARGET = "jaxll_check"


class _Chain:
  """The order chain of one block."""

  def __init__(self, block):
    self.block = block
    self.value = None    # the order value the last call returned (None: none yet)
    self.last_op = None  # the block's last kernel call (or host check) so far
    self.joined = []     # ops of this block already ordered after the chain
    self.emitted = -1    # the module's count of ordered calls when this chain last looked


def _order_state(ctx):
  cache = getattr(ctx.module_context, "cached_primitive_lowerings", None)
  if cache is None:  # (a JAX without that dict: every call starts its own chain)
    return None
  # targets: the FFI targets emitted with an order buffer (emit_ordered_call)
  # emitted: ordered calls emitted so far in the module
  return cache.setdefault(_ORDER_KEY, {"chains": [], "holds": {}, "targets": set(),
                                       "emitted": 0})


def _zero_order():
  return mlir.ir_constant(np.zeros((1,), np.uint32))


def _as(cls, t):
  """`t` as an instance of the MLIR type class `cls`, or None."""
  try:
    return cls(t)
  except (ValueError, TypeError):
    return None


def _row_major(value: ir.Value) -> list[int]:
  return list(reversed(range(ir.RankedTensorType(value.type).rank)))


def _join(first: ir.Value, others, *, alias: bool) -> ir.Value:
  """`first`, made to depend on every tensor of `others`: a ``jaxll_join``
  custom call (emitted at the current insertion point) that does nothing on the
  device. alias=True: its result is `first` itself (the result aliases operand
  0, so it holds first's value; XLA copies only where first stays live);
  alias=False: `first` is an order value, which nobody reads, so the result is
  a fresh buffer and no copy is ever made. Unlike an optimization barrier, the
  custom call stays in the program after scheduling: the dependency holds in
  command buffers built from buffer dependencies too."""
  others = [v for v in others if _as(ir.RankedTensorType, v.type) is not None]
  operands = [first, *others]
  op = custom_call(
      _JOIN_TARGET, result_types=[first.type], operands=operands, backend_config={},
      api_version=4, operand_output_aliases={0: 0} if alias else None,
      operand_layouts=[_row_major(v) for v in operands], result_layouts=[_row_major(first)])
  return op.results[0]


def _element_bytes(t) -> int:
  for cls in (ir.IntegerType, getattr(ir, "FloatType", None)):
    typed = _as(cls, t) if cls is not None else None
    if typed is not None:
      return max(1, (typed.width + 7) // 8)
  return 8


def _first_tensor(values) -> ir.Value | None:
  for v in values:
    if _as(ir.RankedTensorType, v.type) is not None:
      return v
  return None


def _join_operand(op) -> int | None:
  """The operand of `op` to pass through a join: the smallest tensor (the join
  may cost a copy of it), never a loop's first (its induction variable, whose
  constant start XLA reads to count the trips). None: no such operand."""
  operands = op.operation.operands
  first = 1 if op.operation.name in ("stablehlo.while", "mhlo.while") else 0
  best, best_bytes = None, None
  for i in range(first, len(operands)):
    rt = _as(ir.RankedTensorType, operands[i].type)
    if rt is None or not rt.has_static_shape:
      continue
    nbytes = int(np.prod(rt.shape, dtype=np.int64)) * _element_bytes(rt.element_type)
    if best is None or nbytes < best_bytes:
      best, best_bytes = i, nbytes
  return best


def _same_op(a, b) -> bool:
  return a is not None and b is not None and a.operation == b.operation


def _target(op) -> str:
  op = op.operation
  if op.name != "stablehlo.custom_call" or "call_target_name" not in op.attributes:
    return ""
  return ir.StringAttr(op.attributes["call_target_name"]).value


def _holds_calls(ctx, op, state) -> bool:
  """Whether `op` is or contains a kernel call (through regions and func.call)."""
  op = op.operation
  name = op.name
  if name == "stablehlo.custom_call":
    return _target(op) in state["targets"]
  if name == "func.call":
    callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
    holds = state["holds"]
    if callee not in holds:
      holds[callee] = False  # (recursion guard)
      try:
        fn = ctx.module_context.symbol_table[callee]
      except (KeyError, AttributeError):
        fn = None
      holds[callee] = fn is not None and _holds_calls(ctx, fn, state)
    return holds[callee]
  for region in op.regions:
    for block in region.blocks:
      for inner in block.operations:
        if _holds_calls(ctx, inner, state):
          return True
  return False


def _order_before(chain: _Chain, op, *, ordered_call: bool = False) -> None:
  """Orders `op` (of chain's block) after the chain's calls so far: one of its
  operands passes through a join with the chain's order value (for an ordered
  kernel call, its order operand, the last, which nobody reads: no alias)."""
  chain.joined.append(op)
  if chain.value is None:
    return
  operands = op.operation.operands
  i = len(operands) - 1 if ordered_call else _join_operand(op)
  if i is None or i < 0:
    return
  with ir.InsertionPoint(op.operation):
    operands[i] = _join(operands[i], [chain.value], alias=not ordered_call)


def _chain_of(ctx, state, block) -> _Chain:
  """The chain of `block`, created on first use (and then, for the region of a
  loop or conditional, that op ordered after the enclosing block's calls)."""
  for chain in state["chains"]:
    if chain.block == block:
      return chain
  chain = _Chain(block)
  state["chains"].append(chain)
  check = _check_entry(ctx)
  if check is not None and check[2] == block:
    # the block that holds the host check: its calls come after the check
    chain.value, chain.last_op = check[0].result, check[0]
    return chain
  owner = block.owner
  name = owner.operation.name if owner is not None else ""
  if name in _CONTROL_FLOW and owner.operation.parent is not None:
    parent = _chain_of(ctx, state, owner.operation.block)
    _catch_up(ctx, state, parent, stop=owner)
    if not any(_same_op(owner, j) for j in parent.joined):
      _order_before(parent, owner)
  if len(block.arguments):
    with ir.InsertionPoint.at_block_begin(block):
      chain.value = _join(_zero_order(), list(block.arguments), alias=False)
  return chain


def _catch_up(ctx, state, chain: _Chain, stop=None) -> None:
  """Joins to `chain` every op of its block after its last call (up to `stop`,
  exclusive) that holds kernel calls."""
  ops = list(chain.block.operations)
  start = 0
  if chain.last_op is not None:
    for i, op in enumerate(ops):
      if _same_op(op, chain.last_op):
        start = i + 1
        break
  for i in range(start, len(ops)):
    op = ops[i]
    if _same_op(op, stop):
      break
    target = _target(op)
    if target == _CHECK_TARGET and chain.value is None:
      # a host check lowered elsewhere and inlined here (JAX outlines, then
      # inlines, some lowerings): the chain starts at it
      chain.value, chain.last_op = op.results[0], op
      continue
    if target in state["targets"]:
      # an ordered call lowered elsewhere and inlined here: its order operand
      # (the last) follows this chain, its order result continues it
      if not any(_same_op(op, j) for j in chain.joined):
        _order_before(chain, op, ordered_call=True)
      chain.value, chain.last_op = op.results[len(op.results) - 1], op
      continue
    if not _holds_calls(ctx, op, state):
      continue
    if not any(_same_op(op, j) for j in chain.joined):
      _order_before(chain, op)
    result = _first_tensor(op.results)
    if result is not None:
      after = ir.InsertionPoint(ops[i + 1]) if i + 1 < len(ops) else \
          ir.InsertionPoint(chain.block)
      with after:
        before = chain.value if chain.value is not None else _zero_order()
        chain.value = _join(before, [result], alias=False)
    chain.last_op = op


def _order_in(ctx) -> tuple[ir.Value, _Chain | None]:
  state = _order_state(ctx)
  if state is None:
    return _zero_order(), None
  chain = _chain_of(ctx, state, ir.InsertionPoint.current.block)
  if chain.emitted != state["emitted"]:
    # a call was lowered elsewhere since this chain's last one: its block may
    # now hold an op with calls (a scan costs a walk over the block, so it is
    # skipped for consecutive calls of one block)
    _catch_up(ctx, state, chain)
  if chain.value is None:
    chain.value = _zero_order()
  return chain.value, chain


# --- The host check ---------------------------------------------------------------------
# A kernel that gives up records the error on the device and in pinned host
# memory, but XLA replays recorded command buffers without asking jaxll, so
# nothing on the host would see it. So a program with kernel calls gets one
# ``jaxll_check`` custom call (host only, never in a command buffer) that lists
# every workspace the program's calls use: each time XLA runs the program it
# reads their error records on the host and fails the run (ABORTED, with the
# recorded message) if one holds an error, or FAILED_PRECONDITION if a
# workspace was freed. It goes first into the region of the first kernel call
# (the shard_map body), or, when that call sits in a loop or conditional, into
# the region around it, so it runs once per run of that region. Its result
# starts the order chain of the calls in its own block, so it runs before them
# (and an error a call of this run records surfaces in the next run, never by
# chance in this one); calls inside a loop or conditional are not ordered
# after it (an error there may surface in the same run or the next).
_CHECK_KEY = ("jaxll", "host check")
_CONTROL_FLOW = ("stablehlo.while", "stablehlo.case", "stablehlo.if", "mhlo.while",
                 "mhlo.case", "mhlo.if")


def _check_block():
  """The block the check goes into, and whether it is a function's top level."""
  block = ir.InsertionPoint.current.block
  while True:
    owner = block.owner
    name = owner.operation.name if owner is not None else ""
    if name not in _CONTROL_FLOW:
      return block, name == "func.func"
    parent = owner.operation.parent
    if parent is None:
      return block, False
    block = owner.operation.block


def _check_entry(ctx):
  """[check op, workspace ids, its block] of the module being lowered, or None."""
  cache = getattr(ctx.module_context, "cached_primitive_lowerings", None)
  return None if cache is None else cache.get(_CHECK_KEY)


def _note_workspace_for_check(ctx, workspace: int) -> None:
  cache = getattr(ctx.module_context, "cached_primitive_lowerings", None)
  if cache is None:
    return
  entry = cache.get(_CHECK_KEY)
  if entry is None:
    block, top_level = _check_block()
    with ir.InsertionPoint.at_block_begin(block):
      op = custom_call(
          "jaxll_check",
          result_types=[ir.RankedTensorType.get([1], ir.IntegerType.get_unsigned(32))],
          operands=[],
          backend_config={"workspaces": mlir.ir_attribute(np.asarray([workspace], np.int64))},
          has_side_effect=True, api_version=4)
    if top_level:
      # outside a manual (shard_map) region a side-effecting op needs a
      # sharding: every device runs its own check
      op.operation.attributes["mhlo.sharding"] = ir.StringAttr.get("{replicated}")
    entry = cache[_CHECK_KEY] = [op, [workspace], block]
  op, ids, _ = entry
  if workspace not in ids:
    ids.append(workspace)
    op.operation.attributes["mhlo.backend_config"] = ir.DictAttr.get(
        {"workspaces": mlir.ir_attribute(np.asarray(ids, np.int64))})


def emit_ordered_call(ctx, target: str, operands, *, workspace: int,
                      operand_output_aliases: dict | None = None, **attributes) -> list:
  """A custom call of FFI target `target` on workspace `workspace`, with the
  operands `operands` (``ctx.avals_in``) and results ``ctx.avals_out``, plus
  the 4-byte order buffer as the last operand and last result: ordered after
  the previous kernel call emitted into the same block (see above), and the
  program's host check told about the workspace. Attributes: ``workspace``
  (the workspace id) and `attributes` (jaxll's own calls add ``uses_pdl=True``:
  the call may start while the kernel ahead of it finishes, where its workspace
  allows; XLA reads it too when it records the call as a kernel node, on jaxlib
  0.12 and newer). `operand_output_aliases` ({operand: result}) makes results
  the buffers of operands, as XLA's custom calls take it. Returns the results
  without the order."""
  _note_workspace_for_check(ctx, workspace)
  state = _order_state(ctx)
  if state is not None:
    state["targets"].add(target)
  order, chain = _order_in(ctx)
  call_ctx = ctx.replace(avals_in=[*ctx.avals_in, _ORDER_AVAL],
                         avals_out=[*ctx.avals_out, _ORDER_AVAL])
  rule = jax.ffi.ffi_lowering(target, operand_output_aliases=operand_output_aliases)
  *results, order_out = rule(call_ctx, *operands, order, workspace=np.int64(workspace),
                             **attributes)
  if chain is not None:
    chain.value = order_out
    chain.last_op = order_out.owner
  if state is not None:
    state["emitted"] += 1
    if chain is not None:
      chain.emitted = state["emitted"]
  return results


