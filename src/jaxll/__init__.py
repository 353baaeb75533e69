"""jaxll: low-latency GPU collectives for JAX.

``jaxll.all_reduce(x, axis_name)`` is a drop-in for ``jax.lax.psum`` inside
``jax.shard_map``. On CUDA GPUs that can reach each other it runs jaxll's
barrier-free kernels as an XLA FFI custom call over symmetric workspaces built
once per mesh; elsewhere it lowers to XLA's own all-reduce.
"""

from jaxll import settings as _settings

_settings.validate()  # a bad JAXLL_* value fails here, on every platform
from jaxll.native import kernels_available  # (loads the runtime, checks jaxlib, registers targets)
from jaxll.native import RuntimeInfo, runtime_info
from jaxll import choice as _choice

_choice.check_tables()  # a missing or malformed tuning table fails here
from jaxll.algorithms import ALGORITHMS
from jaxll.all_reduce import all_reduce
from jaxll.call_sites import CallSite, explain, recent_call_sites
from jaxll.rmsnorm import all_reduce_rmsnorm
from jaxll.gather_scatter import all_gather, psum_scatter
from jaxll.exchange import all_to_all, ppermute
from jaxll.ragged import ragged_all_to_all
from jaxll import extension
from jaxll.extension import get_cmake_dir, get_include
from jaxll.placement import AlgorithmUnavailableError
from jaxll.regions import copy_to_parallel_region, reduce_from_parallel_region
from jaxll.route import route, route_psums
from jaxll.workspace import (
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    RaggedSizeError,
    Workspace,
    WorkspaceConfig,
    check_errors,
    errors,
    free_workspaces,
    get_config,
    on_error_mode,
    reset,
    set_config,
    workspaces,
)

__version__ = "0.1.0"

__all__ = [
    "ALGORITHMS",
    "AlgorithmUnavailableError",
    "CallSite",
    "CollectiveError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "RaggedSizeError",
    "RuntimeInfo",
    "Workspace",
    "WorkspaceConfig",
    "all_gather",
    "all_reduce",
    "all_reduce_rmsnorm",
    "all_to_all",
    "check_errors",
    "copy_to_parallel_region",
    "errors",
    "explain",
    "extension",
    "free_workspaces",
    "get_cmake_dir",
    "get_config",
    "get_include",
    "psum_scatter",
    "kernels_available",
    "on_error_mode",
    "ppermute",
    "ragged_all_to_all",
    "recent_call_sites",
    "reduce_from_parallel_region",
    "reset",
    "route",
    "route_psums",
    "runtime_info",
    "set_config",
    "workspaces",
]
