"""jaxll's switches and auto-table settings, checked at import on every platform
(the workspace sizes, JAXLL_SCRATCH_BYTES and JAXLL_TIMEOUT_MS, are read in
workspace.py with env_int, also at import).

Switches accept 1/true/yes/on and 0/false/no/off (any case), or empty for the
default; anything else raises ValueError naming the variable, at import, so a
typo never passes silently (also on CPU, where no kernel would read it).
"""

from __future__ import annotations

import os
import re

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_flag(name: str, default: bool = False) -> bool:
  """The switch `name` (unset: `default`)."""
  value = os.environ.get(name)
  if value is None:
    return default
  v = value.strip().lower()
  if v in _TRUE:
    return True
  if v in _FALSE:
    return False if v else default
  raise ValueError(f"{name} must be one of 1/true/yes/on or 0/false/no/off, got {value!r}")


def _env_integer(name: str, minimum: int, what: str) -> int | None:
  """The integer `name` holds, at least `minimum` (unset or empty: None); else
  ValueError saying it must be `what`."""
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


def env_bytes(name: str) -> int | None:
  """A non-negative integer number of bytes (unset: None)."""
  return _env_integer(name, 0, "an integer number of bytes, not negative")


def env_int(name: str, default: int, minimum: int) -> int:
  """An integer of at least `minimum` (unset or empty: `default`)."""
  n = _env_integer(name, minimum, f"an integer of at least {minimum}")
  return default if n is None else n


def setup_timeout_ms() -> int:
  """JAXLL_SETUP_TIMEOUT_MS: how long a workspace spanning processes waits for
  slow peers at setup (default 300000)."""
  return env_int("JAXLL_SETUP_TIMEOUT_MS", 300000, 1)


def disabled() -> bool:
  """JAXLL_DISABLE: every call goes to XLA's all-reduce."""
  return env_flag("JAXLL_DISABLE")


def on_error() -> str:
  """JAXLL_ON_ERROR: "poison" (default) or "trap" (the kernels read it too, when
  a workspace is built)."""
  value = os.environ.get("JAXLL_ON_ERROR", "")
  if value in ("", "poison"):
    return "poison"
  if value == "trap":
    return "trap"
  raise ValueError(f"JAXLL_ON_ERROR must be 'poison' or 'trap', got {value!r}")


def validate() -> None:
  """Reads every setting once; raises ValueError for a bad one."""
  for flag in ("JAXLL_DISABLE", "JAXLL_LOG_PATHS", "JAXLL_SKIP_VERSION_CHECK"):
    env_flag(flag)
  env_bytes("JAXLL_AUTO_MAX_BYTES")
  setup_timeout_ms()
  for name in ("JAXLL_PDL", "JAXLL_SIGNATURES"):
    value = os.environ.get(name)
    if value not in (None, "", "0", "1"):
      raise ValueError(f"{name} must be 0 or 1, got {value!r}")
  carveout = os.environ.get("JAXLL_SMEM_CARVEOUT", "")
  if carveout != "":  # (the same rule as workspace.cc: digits, an optional minus, -1..100)
    if not (re.fullmatch(r"-?[0-9]+", carveout) and -1 <= int(carveout) <= 100):
      raise ValueError(f"JAXLL_SMEM_CARVEOUT must be an integer from -1 to 100, got {carveout!r}")
  on_error()
  table = os.environ.get("JAXLL_AUTO_TABLE")
  if table:
    from jaxll import algorithms
    algorithms.load_auto_table(table)  # raises for a missing or malformed file
