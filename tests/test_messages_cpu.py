"""What errors and reasons say, on 8 CPU devices: a collective that autodiff or
check_vma wrote is named by what it is and the user's line it comes from (the
gradient of an all_gather, the reduction of a replicated weight's gradient),
written with jaxll's functions or with jax.lax's through jaxll.route; explain
gives back the reasons recent_call_sites() recorded, character for character;
no reason starts with "auto:"."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxll
from jaxll import choice, placement
from jaxll.placement import AlgorithmUnavailableError

_HERE = os.path.basename(__file__)


def _site(marker: str) -> str:
  """"test_messages_cpu.py:LINE" of the line of this file ending in `# marker`."""
  with open(__file__) as f:
    (line,) = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# {marker}")]
  return f"{_HERE}:{line}"


def _put(mesh, x, spec=P("tp")):
  return jax.device_put(x, NamedSharding(mesh, spec))


# --- The programs: each differentiates a shard_map from outside --------------------

def gather_loss(x):
  y = jaxll.all_gather(x, "tp", tiled=True, deterministic=True)  # jaxll gather
  return jnp.sum(y ** 2)[None]


def lax_gather_loss(x):
  y = jax.lax.all_gather(x, "tp", tiled=True)  # lax gather
  return jnp.sum(y ** 2)[None]


def mlp(w, x):
  h = x * w  # replicated meets varying
  return jax.lax.psum(jnp.sum(h ** 2), "tp")


def _gather_grad(mesh, loss):
  f = jax.shard_map(loss, mesh=mesh, in_specs=P("tp"), out_specs=P("tp"))
  return jax.grad(lambda x: jnp.sum(f(x)))


def _mlp_grad(mesh):
  return jax.grad(jax.shard_map(mlp, mesh=mesh, in_specs=(P(), P("tp")), out_specs=P()))


# --- Deterministic mode's errors --------------------------------------------------------

def test_gather_gradient_error_names_the_gather(mesh1):
  x = _put(mesh1, jnp.ones(8 * 4))
  with pytest.raises(AlgorithmUnavailableError) as e:
    jax.jit(_gather_grad(mesh1, gather_loss)).lower(x)
  message = str(e.value)
  assert message.startswith(
      f"jaxll.psum_scatter(deterministic=True) cannot serve the call at "
      f"{_site('jaxll gather')} (gather_loss) ("), message
  assert ("), autodiff's transpose of the jaxll.all_gather written there: lowering for cpu"
          in message), message


def test_routed_gather_gradient_error_names_the_gather(mesh1):
  x = _put(mesh1, jnp.ones(8 * 4))
  step = jaxll.route(_gather_grad(mesh1, lax_gather_loss), deterministic=True)
  with pytest.raises(AlgorithmUnavailableError) as e:
    jax.jit(step).lower(x)
  message = str(e.value)
  assert message.startswith(
      f"jaxll.psum_scatter(deterministic=True) cannot serve the call at "
      f"{_site('lax gather')} (lax_gather_loss) ("), message
  assert "), autodiff's transpose of the jax.lax.all_gather written there: " in message, message


def test_replicated_weight_gradient_error_names_where_it_met_the_varying_value(mesh1):
  w, x = jnp.ones(16), _put(mesh1, jnp.ones(8 * 16))
  step = jaxll.route(_mlp_grad(mesh1), deterministic=True)
  with pytest.raises(AlgorithmUnavailableError) as e:
    jax.jit(step).lower(w, x)
  message = str(e.value)
  assert message.startswith(
      f"jaxll.all_reduce(deterministic=True) cannot serve the call at "
      f"{_site('replicated meets varying')} (mlp) ("), message
  assert ("), autodiff's reduction of the gradient of a value replicated over 'tp' "
          "(check_vma's implicit pvary where it meets a varying value there): "
          in message), message
  assert "psum" not in message, message  # (the user's psum is elsewhere)


# --- explain's reasons --------------------------------------------------------------------

def _reasons(sites, site: str, op: str | None = None) -> list[str]:
  """The reasons of the call sites of `op` (any) at `site` ("file:LINE (function)")."""
  return [s.reason for s in sites
          if s.site.split(" <- ")[0] == site and op in (None, s.op)]


def test_explain_says_what_autodiff_wrote(mesh1):
  w, x = jnp.ones(16), _put(mesh1, jnp.ones(8 * 16))
  sites = jaxll.explain(jaxll.route(_mlp_grad(mesh1)), w, x)
  assert _reasons(sites, f"{_site('replicated meets varying')} (mlp)") == [
      "lowering for cpu; jaxll kernels run on CUDA GPUs; this call is autodiff's reduction "
      "of the gradient of a value replicated over 'tp' (check_vma's implicit pvary where "
      "it meets a varying value there)"], sites

  sites = jaxll.explain(jaxll.route(_gather_grad(mesh1, lax_gather_loss)),
                        _put(mesh1, jnp.ones(8 * 4)))
  site = f"{_site('lax gather')} (lax_gather_loss)"
  assert _reasons(sites, site, "all_gather") == [
      "lowering for cpu; jaxll kernels run on CUDA GPUs"], sites
  assert _reasons(sites, site, "psum_scatter") == [
      "lowering for cpu; jaxll kernels run on CUDA GPUs; this call is autodiff's transpose "
      "of the jax.lax.all_gather written there"], sites


def psum_scatter_loss(x):
  return jnp.sum(jaxll.psum_scatter(x, "tp", tiled=True) ** 2)[None]  # scatter


def unchecked_mlp(w, x):
  return jaxll.all_reduce(jnp.sum((x * w) ** 2), "tp")  # unchecked sum


def cast_mlp(w, x):
  return jnp.sum((jax.lax.pcast(w, "tp", to="varying") * x) ** 2)[None]  # cast


def psum_of_weight(w, x):
  return jnp.sum((jax.lax.psum(w, "tp") * x) ** 2)[None]  # psum of replicated


def test_explain_names_each_kind_of_written_collective(mesh1):
  w, x = jnp.ones(16), _put(mesh1, jnp.ones(8 * 16))

  def grad_of(body, check_vma=True):
    f = jax.shard_map(body, mesh=mesh1, in_specs=(P(), P("tp")),
                      out_specs=P("tp") if check_vma else P(), check_vma=check_vma)
    return jax.grad(lambda w, x: jnp.sum(f(w, x)))

  f = jax.shard_map(psum_scatter_loss, mesh=mesh1, in_specs=P("tp"), out_specs=P("tp"))
  sites = jaxll.explain(jax.grad(lambda v: jnp.sum(f(v))), x)
  site = f"{_site('scatter')} (psum_scatter_loss)"
  assert ["this call is" in r for r in _reasons(sites, site, "psum_scatter")] == [False]
  assert [r.split("; this call is ")[-1] for r in _reasons(sites, site, "all_gather")] == [
      "autodiff's transpose of the jaxll.psum_scatter written there"], sites

  # without check_vma, a sum's transpose is a sum
  sites = jaxll.explain(grad_of(unchecked_mlp, False), w, x)
  assert [r.split("; this call is ")[-1] for r in
          _reasons(sites, f"{_site('unchecked sum')} (unchecked_mlp)")] == [
      "autodiff's transpose of the jaxll.all_reduce written there"], sites

  sites = jaxll.explain(jaxll.route(grad_of(cast_mlp)), w, x)
  assert [r.split("; this call is ")[-1] for r in _reasons(sites, f"{_site('cast')} (cast_mlp)")] \
      == ["autodiff's reduction of the gradient of a value replicated over 'tp' (the "
          "transpose of the jax.lax.pcast written there)"], sites

  # the user's psum of w says nothing more; it inserts a pvary on its replicated
  # operand, whose transpose reduces w's gradient; its product with x, another
  # (check_vma's)
  sites = jaxll.explain(jaxll.route(grad_of(psum_of_weight)), w, x)
  written = sorted(r.split("; this call is ")[-1] for r in
                   _reasons(sites, f"{_site('psum of replicated')} (psum_of_weight)"))
  assert written == [
      "autodiff's reduction of the gradient of a value replicated over 'tp' (check_vma's "
      "implicit pvary where it meets a varying value there)",
      "autodiff's reduction of the gradient of a value replicated over 'tp' (the pvary "
      "jax.lax.psum inserts on a replicated operand there)",
      "lowering for cpu; jaxll kernels run on CUDA GPUs"], written


def test_explain_gives_the_recorded_reasons(mesh1):
  # every op, reasons with ";", "=", quotes and parentheses: explain decodes
  # the lowered text to the very CallSites the lowering recorded
  x = _put(mesh1, jnp.ones((8 * 2, 64)))
  r, w = jnp.ones((2, 64)), jnp.ones((64,))

  def block(x, r, w):
    normed, _ = jaxll.all_reduce_rmsnorm(x, r, w, "tp")
    gathered = jaxll.all_gather(normed, "tp", tiled=True)
    return jaxll.psum_scatter(gathered * 2, "tp", tiled=True, algorithm="xla")

  def other(x, r, w):  # (not differentiated: its max, and the fused call itself)
    return (jaxll.all_reduce(x, "tp", op="max"), jaxll.all_gather(x, "tp", algorithm="xla"),
            jaxll.all_reduce_rmsnorm(x, r, w, "tp"))

  f = jax.shard_map(block, mesh=mesh1, in_specs=(P("tp"), P(), P()), out_specs=P("tp"))
  g = jax.shard_map(other, mesh=mesh1, in_specs=(P("tp"), P(), P()),
                    out_specs=(P(), P("tp"), (P(), P())))
  step = lambda x, r, w: (jax.grad(lambda *a: jnp.sum(f(*a)), argnums=(0, 1, 2))(x, r, w),
                          g(x, r, w))
  explained = jaxll.explain(step, x, r, w)
  recorded = jaxll.recent_call_sites()[-len(explained):]
  key = lambda s: (s.site, s.op, s.reason)
  assert sorted(explained, key=key) == sorted(recorded, key=key)
  assert {s.op for s in explained} == {"sum", "max", "sum+rmsnorm", "all_gather",
                                       "psum_scatter"}, explained
  reasons = " ".join(s.reason for s in explained)
  assert ";" in reasons and "algorithm='xla' requested" in reasons and "this call is" in reasons


# --- One form: no "auto:" -------------------------------------------------------------------

def test_no_reason_starts_with_auto(mesh1, monkeypatch):
  reasons = []
  f32, bf16, i32 = np.dtype(np.float32), np.dtype(jnp.bfloat16), np.dtype(np.int32)
  for n in (1, 2, 8):
    for nbytes in (64, 4096, 1 << 16, 1 << 22, 1 << 26):
      for dtype in (f32, bf16, i32):
        for deterministic in (False, True):
          reasons.append(choice.choose_auto(n, nbytes, dtype, "sum", deterministic)[1])
          for op in ("all_gather", "psum_scatter"):
            reasons.append(choice.gather_scatter_auto(op, n, nbytes, dtype, deterministic)[1])

  # every op on CPU, and lowered for CUDA with the workspace lookup forced (a
  # kernel's reasons: no GPU needed)
  x = _put(mesh1, jnp.ones((8 * 2, 64)))
  r, w = jnp.ones((2, 64)), jnp.ones((64,))

  def block(x, r, w):
    normed, _ = jaxll.all_reduce_rmsnorm(x, r, w, "tp")
    return jaxll.psum_scatter(jaxll.all_gather(normed, "tp", tiled=True), "tp", tiled=True)

  f = jax.jit(jax.shard_map(block, mesh=mesh1, in_specs=(P("tp"), P(), P()), out_specs=P("tp")))
  reasons += [s.reason for s in jaxll.explain(f, x, r, w)]
  monkeypatch.setattr(placement, "unserved", lambda ctx, axes: (8, ""))
  monkeypatch.setattr(placement, "workspace_for", lambda ctx, axes: (7, 8, ""))
  before = len(jaxll.recent_call_sites())
  gs = jax.jit(jax.shard_map(lambda v: jaxll.psum_scatter(jaxll.all_gather(v, "tp", tiled=True),
                                                          "tp", tiled=True),
                             mesh=mesh1, in_specs=P("tp"), out_specs=P("tp")))
  gs.trace(x).lower(lowering_platforms=("cuda",))
  kernels = jaxll.recent_call_sites()[before:]
  assert {s.algorithm for s in kernels} <= {"oneshot_ll", "oneshot_sentinel"}, kernels
  reasons += [s.reason for s in kernels]
  assert all(reasons) and not [r for r in reasons if r.startswith("auto:")], [
      r for r in reasons if r.startswith("auto")]
  assert any(r.startswith("gather_scatter table: ") for r in reasons), reasons
