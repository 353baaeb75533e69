"""GPU tier, several processes: N jax.distributed processes on the local GPU
run jaxll inside jitted shard_map over the global mesh, through workspaces
whose memory is shared by CUDA IPC (tests/mp_scripts/allreduce_checks.py). With
one GPU, all N processes share it (CUDA MPS is started when available).
Marked ``gpu``."""

import os

import pytest

from jaxll.tools import launch
from mp_checks import CHECKS, GPU_ENV, TIMEOUT, TP_BLOCK, describe, verify

pytestmark = pytest.mark.gpu

# XLA's own all-reduce (NCCL) cannot run several ranks on one GPU, so auto must
# not hand large messages to it here
ENV = dict(GPU_ENV, JAXLL_AUTO_MAX_BYTES=str(1 << 40))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_processes_share_the_gpu(n, mps):
  args = ["--steps", "1000"] + (["--latency"] if n in (2, 8) else [])
  workers = launch.run(CHECKS, n, args=args, timeout=TIMEOUT, env=ENV, mps=mps,
                       devices=["0"] * n)
  verify(workers, min_cases=100)
  print(describe(workers, f"N={n} processes on one GPU, MPS={workers[0].mps}"))


@pytest.mark.parametrize("flags", ["--xla_gpu_command_buffer_scheduling_mode=CONCURRENT",
                                   "--xla_gpu_enable_latency_hiding_scheduler=true"])
def test_independent_calls_under_concurrency_flags(flags, mps):
  # The checks' stress section runs 24 independent call sites of one program on
  # one workspace; under these flags XLA may reorder or overlap independent
  # work, so only the order chain (jaxll/ordering.py) keeps every process's
  # calls in one order, one at a time.
  workers = launch.run(CHECKS, 2, args=["--steps", "100", "--stress", "200"], timeout=TIMEOUT,
                       env=dict(ENV, XLA_FLAGS=flags), mps=mps, devices=["0"] * 2)
  verify(workers, min_cases=100)
  print(describe(workers, f"2 processes on one GPU, XLA_FLAGS={flags}"))


@pytest.mark.parametrize("n", [2, 4])
def test_tp_model_through_processes(n, mps):
  # tests/tp_model.py with tp over N processes sharing the GPU: forward,
  # gradient and decode loop, with the region helpers and with route_psums.
  # Every tp call site runs a jaxll kernel, and every shard matches the float64
  # reference (tests/mp_scripts/tp_block.py).
  workers = launch.run(TP_BLOCK, n, timeout=TIMEOUT, env=ENV, mps=mps, devices=["0"] * n)
  for w in workers:
    assert not w.result["errors"], (w.process_id, w.result["errors"])
    assert len(w.result["paths"]) == 6 and all(w.result["paths"].values()), w.result["paths"]
  print(f"\nN={n}: tp paths {workers[0].result['paths']}; "
        f"max error {max(max(w.result['max_error'].values()) for w in workers):.1e}")


def test_free_workspaces_and_build_again_through_processes(mps):
  # jaxll.free_workspaces() at the same point in every process, then the same
  # function lowered again: a new workspace spanning the processes, three
  # rounds, each checked against numpy (tests/mp_scripts/free_check.py)
  script = os.path.join(os.path.dirname(CHECKS), "free_check.py")
  workers = launch.run(script, 2, timeout=TIMEOUT, env=ENV, mps=mps, devices=["0"] * 2)
  for w in workers:
    assert not w.result["errors"], (w.process_id, w.result["errors"])
    assert w.result["paths"] == [["oneshot_ll"]] * 3, w.result["paths"]
  print(f"\nworkspaces per round: {workers[0].result['workspaces']}")


@pytest.mark.parametrize("n", [2, 4])
def test_gather_and_scatter_along_any_dimension_through_processes(n, mps):
  # jaxll.all_gather / psum_scatter along dimensions 0, 1 and last, tiled and
  # untiled, float32 and bfloat16, with their gradients, on every kernel and
  # auto (tests/mp_scripts/gather_scatter_dims_check.py): every call on a
  # kernel; gathers bitwise jax.lax's, scatters bitwise the all-reduce's piece.
  script = os.path.join(os.path.dirname(CHECKS), "gather_scatter_dims_check.py")
  workers = launch.run(script, n, timeout=TIMEOUT, env=ENV, mps=mps, devices=["0"] * n)
  for w in workers:
    assert not w.result["errors"], (w.process_id, w.result["errors"])
    assert w.result["cases"] == 8  # 4 algorithms x 2 dtypes
  print(f"\nN={n}: auto's sites (op, dimension, kernel): "
        f"{workers[0].result['sites']['auto/bfloat16']}")


@pytest.mark.parametrize("n", [2, 4, 8])
def test_fused_all_reduce_rmsnorm_through_processes(n, mps):
  # jaxll.all_reduce_rmsnorm(algorithm="fused") against the composition over
  # the one-shot all-reduce (tests/mp_scripts/rmsnorm_check.py): new_residual
  # bitwise, normed within a rounding or two, runs stable, shapes up to
  # 64 x 16384 bf16 and rows longer than one scratch region.
  script = os.path.join(os.path.dirname(CHECKS), "rmsnorm_check.py")
  workers = launch.run(script, n, timeout=TIMEOUT, env=ENV, mps=mps, devices=["0"] * n)
  for w in workers:
    assert not w.result["errors"], (w.process_id, w.result["errors"])
    assert w.result["cases"] == 6
  print(f"\nN={n}: normed max relative difference {workers[0].result['max_rel']}; named "
        f"exchanges refused {workers[0].result['refused']}")


@pytest.mark.parametrize("n,reverse", [(2, False), (4, False), (8, False), (4, True)])
def test_all_gather_and_psum_scatter_through_processes(n, reverse, mps):
  # jaxll.all_gather / psum_scatter with the one-shot kernels (LL16, sentinel, barrier)
  # and with auto (its measured choice among them)
  # against numpy (tests/mp_scripts/gather_scatter_check.py): gathered bits,
  # the scattered piece bitwise the all-reduce's, runs stable; then a stress
  # chain per kernel (and auto): 500 steps of a small and a large gather and
  # scatter back to back in one jitted loop, exact after the last step.
  script = os.path.join(os.path.dirname(CHECKS), "gather_scatter_check.py")
  # (reverse: the mesh lists the processes' devices backwards, so ranks are not
  # process indices and the gathered order must follow the mesh)
  workers = launch.run(script, n, args=["--reverse"] if reverse else [], timeout=TIMEOUT,
                       env=ENV, mps=mps, devices=["0"] * n)
  assert [w.result["rank"] for w in workers] == [n - 1 - p if reverse else p for p in range(n)]
  for w in workers:
    assert not w.result["errors"], (w.process_id, w.result["errors"])
    # 5 cases x 3 kernels, less the sentinel's int32 case, 5 with auto's choice,
    # and the 4 stress chains
    assert w.result["cases"] == 23
  auto = workers[0].result["auto"]
  print(f"\nN={n}: auto's kernels (all_gather, psum_scatter): {auto}")
  # auto's choice covers both kernels here: LL16 for small pieces, sentinel for 1.2 MB
  assert any("oneshot_ll" in v for v in auto.values()), auto
  assert any("oneshot_sentinel" in v for v in auto.values()), auto
  # the stress chain under auto ran both kernels (37-element and 70001-element pieces)
  assert workers[0].result["stress_kernels"]["auto"] == ["oneshot_ll", "oneshot_sentinel"]


@pytest.mark.parametrize("n,reverse", [(2, False), (4, False), (8, False), (4, True)])
def test_ppermute_and_all_to_all_through_processes(n, reverse, mps):
  # jaxll.ppermute (ring, swap, partial) and jaxll.all_to_all with the one-shot
  # kernels and auto against numpy, bit for bit (tests/mp_scripts/exchange_check.py),
  # their gradients and jax.lax's under route through the kernels, and a stress
  # chain per kernel: 500 steps of a shift, two all-to-alls and a shift back
  script = os.path.join(os.path.dirname(CHECKS), "exchange_check.py")
  workers = launch.run(script, n, args=["--reverse"] if reverse else [], timeout=TIMEOUT,
                       env=ENV, mps=mps, devices=["0"] * n)
  assert [w.result["rank"] for w in workers] == [n - 1 - p if reverse else p for p in range(n)]
  for w in workers:
    assert not w.result["errors"], (w.process_id, w.result["errors"])
    # 5 cases x 3 kernels, less the sentinel's int32 case, 5 with auto, 2 gradients,
    # 4 stress chains
    assert w.result["cases"] == 25
  print(f"\nN={n}: paths {workers[0].result['paths']}")


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ragged_all_to_all_through_processes(n, mps):
  # jaxll.ragged_all_to_all through the kernel against numpy, bit for bit
  # (tests/mp_scripts/ragged_check.py), its gradients and jax.lax's under route
  # through the kernels, and a 300-step loop of ragged shifts
  script = os.path.join(os.path.dirname(CHECKS), "ragged_check.py")
  workers = launch.run(script, n, timeout=TIMEOUT, env=ENV, mps=mps, devices=["0"] * n)
  for w in workers:
    assert not w.result["errors"], (w.process_id, w.result["errors"])
    assert w.result["cases"] == 15  # 6 cases x 2 algorithms, 2 gradients, the loop
  print(f"\nN={n}: paths {workers[0].result['paths']}")


@pytest.mark.parametrize("n", [2, 4])
def test_mesh_forms_and_routing_take_kernels_through_processes(n, mps):
  # abstract mesh, jax.set_mesh, unreduced inputs, all_gather(to=), and
  # jax.lax collectives with a gradient under jaxll.route
  # (tests/mp_scripts/mesh_forms_check.py): every call site a kernel, results exact
  script = os.path.join(os.path.dirname(CHECKS), "mesh_forms_check.py")
  workers = launch.run(script, n, timeout=TIMEOUT, env=ENV, mps=mps, devices=["0"] * n)
  for w in workers:
    assert not w.result["errors"], (w.process_id, w.result["errors"])
    assert [name for name, _, _ in w.result["cases"]] == [
        "abstract mesh", "set_mesh", "unreduced inputs", "all_gather to=", "route"]
  print(f"\nN={n}: {workers[0].result['cases']}")
