"""Every ``JAXLL_*`` setting of the library, read and checked here and nowhere
else (docs/configuration.md lists them; the native code reads none: the values
it needs reach it in each workspace's configuration).

Every value is checked when jaxll is imported, on every platform: a bad one
raises ValueError naming the variable, so a typo never passes silently (also on
CPU, where no kernel would read it). Each accessor reads the environment when
called, so a value set later in the process takes effect where the docs say
(for the workspace settings: when a workspace is built).

Switches accept 1/true/yes/on and 0/false/no/off (any case), or empty for the
default.
"""

from __future__ import annotations

import dataclasses
import os
import re

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}

DEFAULT_SCRATCH_BYTES = 512 * 1024
DEFAULT_TIMEOUT_MS = 10_000
DEFAULT_SETUP_TIMEOUT_MS = 300_000


def _flag(name: str, default: bool = False) -> bool:
  value = os.environ.get(name)
  if value is None:
    return default
  v = value.strip().lower()
  if v in _TRUE:
    return True
  if v in _FALSE:
    return False if v else default
  raise ValueError(f"{name} must be one of 1/true/yes/on or 0/false/no/off, got {value!r}")


def _integer(name: str, minimum: int, what: str) -> int | None:
  """The integer `name` holds, at least `minimum` (unset or empty: None)."""
  value = os.environ.get(name)
  if value is None or value.strip() == "":
    return None
  try:
    n = int(value)
  except ValueError:
    n = None
  if n is None or n < minimum:
    raise ValueError(f"{name} must be {what}, got {value!r}")
  return n


def _choice(name: str, choices: tuple[str, ...], what: str) -> str:
  """One of `choices` (unset or empty: the first); else ValueError saying it must be `what`."""
  value = os.environ.get(name, "")
  if value == "":
    return choices[0]
  if value not in choices:
    raise ValueError(f"{name} must be {what}, got {value!r}")
  return value


# --- The calls ------------------------------------------------------------------

def disabled() -> bool:
  """JAXLL_DISABLE: every call goes to XLA's collective."""
  return _flag("JAXLL_DISABLE")


def deterministic() -> bool:
  """JAXLL_DETERMINISTIC: every call is deterministic=True unless it says otherwise."""
  return _flag("JAXLL_DETERMINISTIC")


def log_paths() -> bool:
  """JAXLL_LOG_PATHS: each call site's decision is logged on the ``jaxll`` logger."""
  return _flag("JAXLL_LOG_PATHS")


def auto_max_bytes() -> int | None:
  """JAXLL_AUTO_MAX_BYTES: the crossover to XLA for every group size, bytes per
  rank (unset: the tuning table's)."""
  return _integer("JAXLL_AUTO_MAX_BYTES", 0, "an integer number of bytes, not negative")


def auto_table_path() -> str | None:
  """JAXLL_AUTO_TABLE: a JSON file replacing the all-reduce tuning table."""
  return os.environ.get("JAXLL_AUTO_TABLE") or None


def record_stage() -> bool:
  """JAXLL_RECORD_STAGE: where the loaded runtime layer has XLA FFI's record stage
  (the record layer, with jaxlib 0.12.1 or newer: jaxll.runtime_info()), each
  jaxll call becomes a kernel node of XLA's command buffers (default on); 0: XLA
  captures its launch into a child graph, as with older jaxlibs. Read when jaxll
  is imported."""
  return _flag("JAXLL_RECORD_STAGE", True)


def skip_version_check() -> bool:
  """JAXLL_SKIP_VERSION_CHECK: load the base runtime layer even where the installed
  jaxlib takes no layer of this build (native.load_problem)."""
  return _flag("JAXLL_SKIP_VERSION_CHECK")


# --- The workspaces ---------------------------------------------------------------

def scratch_bytes() -> int:
  """JAXLL_SCRATCH_BYTES: what one one-shot round moves per rank (default 512 KiB)."""
  n = _integer("JAXLL_SCRATCH_BYTES", 8, "an integer of at least 8")
  return DEFAULT_SCRATCH_BYTES if n is None else n


def timeout_ms() -> int:
  """JAXLL_TIMEOUT_MS: how long a kernel waits for a peer (default 10000)."""
  n = _integer("JAXLL_TIMEOUT_MS", 1, "an integer of at least 1")
  return DEFAULT_TIMEOUT_MS if n is None else n


def setup_timeout_ms() -> int:
  """JAXLL_SETUP_TIMEOUT_MS: how long a workspace spanning processes waits for
  slow peers at setup (default 300000)."""
  n = _integer("JAXLL_SETUP_TIMEOUT_MS", 1, "an integer of at least 1")
  return DEFAULT_SETUP_TIMEOUT_MS if n is None else n


def on_error() -> str:
  """JAXLL_ON_ERROR: "poison" (default) or "trap"."""
  return _choice("JAXLL_ON_ERROR", ("poison", "trap"), "'poison' or 'trap'")


@dataclasses.dataclass(frozen=True)
class KernelSettings:
  """What a workspace's kernels do, as the native workspace takes it."""
  pdl: bool         # may launch with programmatic dependent launch
  signatures: bool  # check every call's signature against the peers'
  trap: bool        # trap after recording an error (JAXLL_ON_ERROR=trap)
  carveout: int     # shared-memory carveout of every kernel (-1: the driver's choice)


def kernel_settings(shared_gpu: bool = False) -> KernelSettings:
  """The kernels' settings for a workspace built now; `shared_gpu`: ranks of
  several processes share a GPU of it.

  JAXLL_PDL: 1 launches with programmatic dependent launch everywhere it exists,
  0 nowhere; unset, everywhere but where processes share a GPU (under CUDA MPS a
  rank was seen running a later call while blocks of its earlier call had not
  started, and both ranks timed out). JAXLL_SIGNATURES: 0 turns the call
  signature check off (default 1). JAXLL_SMEM_CARVEOUT: percent of the most
  shared memory, -1 to 100 (default 0, the most L1)."""
  pdl = _choice("JAXLL_PDL", ("", "0", "1"), "0 or 1")
  carveout = os.environ.get("JAXLL_SMEM_CARVEOUT", "")
  if carveout != "" and not (re.fullmatch(r"-?[0-9]+", carveout) and -1 <= int(carveout) <= 100):
    raise ValueError(f"JAXLL_SMEM_CARVEOUT must be an integer from -1 to 100, got {carveout!r}")
  return KernelSettings(pdl=pdl == "1" or (pdl == "" and not shared_gpu),
                        signatures=_choice("JAXLL_SIGNATURES", ("", "1", "0"), "0 or 1") != "0",
                        trap=on_error() == "trap",
                        carveout=int(carveout) if carveout else 0)


def validate() -> None:
  """Reads every setting once; raises ValueError for a bad one."""
  disabled()
  deterministic()
  log_paths()
  record_stage()
  skip_version_check()
  auto_max_bytes()
  scratch_bytes()
  timeout_ms()
  setup_timeout_ms()
  kernel_settings()
