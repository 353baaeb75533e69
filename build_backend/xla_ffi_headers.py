"""The XLA FFI headers jaxll's runtime compiles against: one set per runtime
layer (CMakeLists.txt builds a layer over each).

Without build isolation the build compiles against the jaxlib it finds, one
layer. With it (pip's default, where no jaxlib is installed in the build
environment) two layers serve every supported jax:

- the base layer, against the headers of the oldest supported jaxlib with wheels
  for this Python (0.10.0; 0.11.1 on Python 3.14): it loads in every supported
  jaxlib;
- the record layer, against jaxlib 0.12.1's (Python 3.12 and newer, where jax
  0.12 installs): it has XLA FFI's record stage and loads in jaxlib 0.12.1 and
  newer.

Their headers come from jaxlib's wheels, fetched with pip (`pip download`, the
index and proxy settings of pip's configuration and PIP_* variables) into the
build directory; only include/xla/ffi is kept. `python xla_ffi_headers.py DIR`
prints a line per layer, base first: `<jaxlib version>|<include dir>`, and on
standard error why a layer is missing. JAXLL_XLA_FFI=installed takes the
installed jaxlib alone, `none` builds no record layer (the base layer only)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile

RECORD_JAXLIB = "0.12.1"  # the first jaxlib whose record stage jaxll's layer uses
MODES = ("auto", "installed", "none")


def base_jaxlib() -> str:
  return "0.10.0" if sys.version_info < (3, 14) else "0.11.1"


def wanted() -> list[str]:
  """The jaxlib versions whose headers an isolated build compiles against."""
  versions = [base_jaxlib()]
  if sys.version_info >= (3, 12) and mode() != "none":
    versions.append(RECORD_JAXLIB)
  return versions


def mode() -> str:
  value = os.environ.get("JAXLL_XLA_FFI", "auto").strip().lower() or "auto"
  if value not in MODES:
    raise SystemExit(f"JAXLL_XLA_FFI={value!r}: expected one of {', '.join(MODES)}")
  return value


def installed() -> tuple[str, str] | None:
  """(version, include dir) of the jaxlib in this environment, if any."""
  if importlib.util.find_spec("jaxlib") is None:
    return None
  import jaxlib
  return jaxlib.__version__, os.path.join(os.path.dirname(jaxlib.__file__), "include")


def fetch(version: str, root: str) -> str:
  """The include dir of jaxlib `version`'s XLA FFI headers under `root`,
  fetching its wheel with pip first where they are not there yet. Raises
  RuntimeError with pip's last lines when it cannot."""
  include = os.path.join(root, version, "include")
  done = os.path.join(root, version, "complete")
  if os.path.exists(done):
    return include
  wheels = os.path.join(root, "wheels")
  os.makedirs(wheels, exist_ok=True)
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "--disable-pip-version-check", "--progress-bar", "off", "-d", wheels,
         f"jaxlib=={version}"]
  run = subprocess.run(cmd, capture_output=True, text=True)
  if run.returncode != 0:
    said = (run.stderr or run.stdout).strip().splitlines()
    raise RuntimeError(f"`pip download jaxlib=={version}` failed: " +
                       " / ".join(line.strip() for line in said[-3:]))
  found = [f for f in os.listdir(wheels)
           if f.startswith(f"jaxlib-{version}-") and f.endswith(".whl")]
  if not found:
    raise RuntimeError(f"pip left no jaxlib {version} wheel in {wheels}")
  with zipfile.ZipFile(os.path.join(wheels, found[0])) as z:
    for name in z.namelist():
      if name.startswith("jaxlib/include/xla/ffi/") and not name.endswith("/"):
        target = os.path.join(include, name[len("jaxlib/include/"):])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(name) as src, open(target, "wb") as dst:
          dst.write(src.read())
  if not os.path.isfile(os.path.join(include, "xla", "ffi", "api", "c_api.h")):
    raise RuntimeError(f"jaxlib {version}'s wheel holds no XLA FFI headers")
  os.remove(os.path.join(wheels, found[0]))  # (only the headers are kept)
  open(done, "w").close()
  return include


def layers(root: str) -> list[tuple[str, str]]:
  """(jaxlib version, include dir) of each layer to build, base first."""
  have = installed()
  if have is not None or mode() == "installed":
    if have is None:
      raise SystemExit("JAXLL_XLA_FFI=installed, but no jaxlib is installed here")
    return [have]
  out = []
  for version in wanted():
    try:
      out.append((version, fetch(version, root)))
    except RuntimeError as e:
      role = "base" if not out else "record-stage"
      print(f"no {role} layer: jaxlib {version}'s XLA FFI headers could not be fetched: {e}",
            file=sys.stderr)
      if not out:
        break  # (without the base layer there is no runtime: the build says so)
  return out


if __name__ == "__main__":
  if len(sys.argv) != 2:
    raise SystemExit("usage: xla_ffi_headers.py DIR")
  for version, include in layers(sys.argv[1]):
    print(f"{version}|{include}")
