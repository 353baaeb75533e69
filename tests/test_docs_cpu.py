"""The documentation runs as written: every python block of README.md and of
each page under docs/, executed in order in one interpreter per page on 8 CPU
devices (later blocks continue earlier ones), except blocks marked
"not run by the docs test" (with the reason); and every relative link points
at a file that exists."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                               if f.endswith(".md"))
BLOCK = re.compile(r"(<!-- not run by the docs test: [^>]*-->\n)?```python\n(.*?)```", re.S)


def _blocks(page):
  return BLOCK.findall(open(os.path.join(ROOT, page)).read())


def _run(code, **env):
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=8", **env}
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                        timeout=300, env=env)


@pytest.mark.parametrize("page", PAGES)
def test_python_blocks_run_as_written(page):
  run = [code for marker, code in _blocks(page) if not marker]
  if not run:
    pytest.skip(f"{page} has no python block to run")
  r = _run("\n".join(run))
  assert r.returncode == 0, f"{page}:\n{r.stderr[-3000:]}"


def test_readme_examples_say_what_ran_where():
  # the README's blocks print explain's decisions: on CPU every site is XLA's
  r = _run("\n".join(code for marker, code in _blocks("README.md") if not marker))
  assert r.returncode == 0, r.stderr[-3000:]
  assert "xla" in r.stdout and "lowering for cpu" in r.stdout, r.stdout


def test_readme_blocks_run_alone():
  # a reader copies one block: it runs by itself, on the 8 CPU devices it asks for
  blocks = [code for marker, code in _blocks("README.md") if not marker]
  assert len(blocks) >= 2
  for code in blocks:
    r = _run(code + "\nassert jax.device_count() == 8\n", XLA_FLAGS="")
    assert r.returncode == 0, f"{code[:200]}\n{r.stderr[-3000:]}"


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_point_at_files(page):
  text = open(os.path.join(ROOT, page)).read()
  here = os.path.dirname(os.path.join(ROOT, page))
  for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
    if "://" in target or target.startswith("mailto:"):
      continue
    assert os.path.exists(os.path.normpath(os.path.join(here, target))), (page, target)


def test_marked_blocks_say_why():
  for page in PAGES:
    for marker, _ in _blocks(page):
      if marker:
        assert len(marker) > len("<!-- not run by the docs test: -->\n") + 5, (page, marker)
