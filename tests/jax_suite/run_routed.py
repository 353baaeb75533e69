"""JAX's own shard_map tests, run as they are and with every shard_map'd function routed
through ``jaxll.route``, compared test by test.

  python tests/jax_suite/run_routed.py --test-file /path/to/jax/tests/shard_map_test.py \
      [--python /venv/bin/python] [--jaxll-path DIR] [--out DIR] [--timeout S] [-k EXPR]

The test file must be the one of the jax that ``--python`` imports (JAX's sdist does not
ship its tests: take it from JAX's repository at the release's tag, see README.md).
``--jax-git DIR --ref TAG`` reads it from a clone instead (``git show TAG:tests/...``).

Each pass runs ``python -m pytest -p route_plugin`` on a copy of the file in ``--out``,
on CPU, with junit XML; the routed pass sets ``JAXLL_ROUTE_JAX_TESTS=1``
(route_plugin.py). A test that passes as it is and not routed is a difference:
expected when the test reads primitive names in a jaxpr or in lowered text, or counts
JAX's traces, which routing changes (the tests listed in ``EXPECTED``, each with its
reason), else a real failure. Exit status: 0 when no real failure, 1 on one, 2 when a
pass did not finish or the routed pass met no jaxll collective.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))

# Tests (by name, parameters stripped) whose routed outcome differs by design: they
# assert on the names of the primitives in a jaxpr, or on lowered text, which routing
# changes (psum -> jaxll_all_reduce, ...) while the values stay JAX's, or count JAX's
# traces, of which route adds one. Reason per test.
EXPECTED: dict[str, str] = {
    "test_rewrite_scan":
        "asserts the scan body's first primitive is named psum_invariant; routed it is "
        "jaxll_all_reduce (pvary after it, as asserted)",
    "test_shmap_unreduced_fsdp_grad":
        "asserts 'unreduced_reduce_scatter' in str(jaxpr) of the gradient; routed the "
        "transposed all_gather(to='reduced') is jaxll_psum_scatter (unreduced); values "
        "and output shardings, asserted before, pass",
    "test_different_devices_shmap_abstract_mesh_cache_hit":
        "counts jit tracing cache misses (expects 2: jit, shard_map); jaxll.route traces "
        "the body once more per trace of its caller (jax.make_jaxpr counts as a jit "
        "trace): 3; lowerings (1) and compilations (2) as asserted",
}


# The plugin's counters that say a test met a jaxll collective
_JAXLL_COUNTS = ("collectives_in_routed_jaxprs", "collectives_bound", "call_sites_lowered")


def _strip_params(name: str) -> str:
  return re.sub(r"\[.*\]$", "", name)


def _parse_junit(path: str) -> dict:
  """{test id: (outcome, message)}: outcome one of passed, failed, error, skipped."""
  results = {}
  for case in ET.parse(path).getroot().iter("testcase"):
    test = f"{case.get('classname')}::{case.get('name')}"
    outcome, message = "passed", ""
    for child in case:
      if child.tag in ("failure", "error", "skipped"):
        outcome = {"failure": "failed"}.get(child.tag, child.tag)
        message = (child.get("message") or "") + "\n" + (child.text or "")
        break
    results[test] = (outcome, message.strip())
  return results


def _run_pass(args, name: str, routed: bool, test_file: str) -> dict:
  junit = os.path.join(args.out, f"{name}.xml")
  counts = os.path.join(args.out, f"{name}_counts.json")
  log = os.path.join(args.out, f"{name}.log")
  for p in (junit, counts):
    if os.path.exists(p):
      os.remove(p)
  path = [HERE] + ([args.jaxll_path] if args.jaxll_path else [])
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAXLL_ROUTE_JAX_TESTS="1" if routed else "0",
             JAXLL_ROUTE_JAX_TESTS_REPORT=counts,
             PYTHONPATH=os.pathsep.join(path + [os.environ.get("PYTHONPATH", "")]).rstrip(
                 os.pathsep))
  cmd = [args.python, "-m", "pytest", "-p", "no:cacheprovider", "-p", "route_plugin", "-q",
         "-rA", f"--junitxml={junit}", os.path.basename(test_file)]
  if args.k:
    cmd += ["-k", args.k]
  print(f"[{name}] {' '.join(cmd)}  (log: {log})", flush=True)
  start = time.time()
  with open(log, "w") as f:
    try:
      rc = subprocess.run(cmd, cwd=args.out, env=env, stdout=f, stderr=subprocess.STDOUT,
                          timeout=args.timeout, preexec_fn=lambda: os.nice(args.nice)).returncode
    except subprocess.TimeoutExpired:
      rc = None
  seconds = time.time() - start
  if rc is None or not os.path.exists(junit):
    return {"name": name, "finished": False, "rc": rc, "seconds": seconds, "log": log}
  return {"name": name, "finished": True, "rc": rc, "seconds": seconds, "log": log,
          "results": _parse_junit(junit),
          "counts": json.load(open(counts)) if os.path.exists(counts) else None}


def _tally(results: dict) -> dict:
  return dict(collections.Counter(o for o, _ in results.values()))


def _first_line(message: str, limit: int = 300) -> str:
  lines = [l for l in message.splitlines() if l.strip()]
  line = next((l for l in lines if re.match(r"^E\s", l)), lines[0] if lines else "")
  return line.strip()[:limit]


def compare(plain: dict, routed: dict) -> list[dict]:
  """Tests that pass as they are and not routed (or are missing routed)."""
  out = []
  for test, (outcome, _) in sorted(plain.items()):
    if outcome != "passed":
      continue
    got, message = routed.get(test, ("missing", ""))
    if got == "passed":
      continue
    reason = EXPECTED.get(_strip_params(test.split("::")[-1]))
    out.append({"test": test, "routed": got, "category": "expected" if reason else "real",
                "reason": reason or "", "error": _first_line(message), "message": message})
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--test-file", help="JAX's tests/shard_map_test.py for the installed jax")
  p.add_argument("--jax-git", help="a git directory of JAX's repository (with --ref)")
  p.add_argument("--ref", help="the tag or commit to read tests/shard_map_test.py at")
  p.add_argument("--python", default=sys.executable, help="the Python whose jax is tested")
  p.add_argument("--jaxll-path", help="a directory to put first on PYTHONPATH (a jaxll "
                 "install made with pip install --target)")
  p.add_argument("--out", default="/tmp/jaxll-jax-suite", help="work folder: the test "
                 "file's copy, logs, junit XML, counts, summary.json")
  p.add_argument("--timeout", type=float, default=3600, help="seconds per pass")
  p.add_argument("--nice", type=int, default=10, help="niceness of the pytest processes")
  p.add_argument("--passes", choices=("both", "routed"), default="both",
                 help="routed: reuse the unpatched pass's junit XML in --out")
  p.add_argument("-k", help="pytest -k expression (both passes)")
  args = p.parse_args(argv)

  os.makedirs(args.out, exist_ok=True)
  test_file = os.path.join(args.out, "shard_map_test.py")
  if args.jax_git:
    text = subprocess.run(["git", "--git-dir", args.jax_git, "show",
                           f"{args.ref}:tests/shard_map_test.py"], check=True,
                          capture_output=True, text=True).stdout
  elif args.test_file:
    text = open(args.test_file).read()
  else:
    p.error("give --test-file, or --jax-git and --ref")
  with open(test_file, "w") as f:
    f.write(text)
  with open(os.path.join(args.out, "pytest.ini"), "w") as f:
    f.write("[pytest]\n")  # (the rootdir: no configuration of a folder above applies)

  version = subprocess.run(
      [args.python, "-c", "import sys, jax, jaxlib; print(jax.__version__, jaxlib.__version__,"
       " sys.version.split()[0])"], capture_output=True, text=True,
      env=dict(os.environ, JAX_PLATFORMS="cpu")).stdout.split()
  print(f"jax {version[0]}, jaxlib {version[1]}, Python {version[2]}; {args.test_file or args.ref}",
        flush=True)

  if args.passes == "both":
    plain = _run_pass(args, "unpatched", False, test_file)
  else:
    junit = os.path.join(args.out, "unpatched.xml")
    plain = {"name": "unpatched", "finished": os.path.exists(junit), "seconds": 0,
             "results": _parse_junit(junit) if os.path.exists(junit) else {}}
  routed = _run_pass(args, "routed", True, test_file)
  for r in (plain, routed):
    if not r["finished"]:
      print(f"[{r['name']}] did not finish (rc {r.get('rc')}, {r['seconds']:.0f} s); "
            f"see {r.get('log')}")
      return 2

  diffs = compare(plain["results"], routed["results"])
  fixed = sorted(t for t, (o, _) in routed["results"].items()
                 if o == "passed" and plain["results"].get(t, ("",))[0] not in ("passed",))
  totals = (routed["counts"] or {}).get("totals", {})
  per_test = (routed["counts"] or {}).get("tests", {})
  touched = [t for t in routed["results"]
             if any(per_test.get(t, {}).get(k) for k in _JAXLL_COUNTS)]
  touched_passed = [t for t in touched if routed["results"][t][0] == "passed"]

  print(f"\njax {version[0]} ({version[2]}): {len(plain['results'])} tests")
  for r in (plain, routed):
    print(f"  {r['name']:>9}: {_tally(r['results'])}  ({r['seconds']:.0f} s)")
  print(f"  routed pass: {totals.get('functions_routed', 0)} functions routed, "
        f"{totals.get('collectives_in_routed_jaxprs', 0)} jaxll collectives in the jaxprs "
        f"evaluated, {totals.get('collectives_bound', 0)} bound, "
        f"{totals.get('call_sites_lowered', 0)} jaxll call sites lowered "
        f"{(routed['counts'] or {}).get('call_sites_by_op', {})}; "
        f"{len(touched)} tests met a jaxll collective, {len(touched_passed)} of them passed")
  real = [d for d in diffs if d["category"] == "real"]
  print(f"  differences: {len(diffs)} ({len(diffs) - len(real)} expected, {len(real)} real)")
  for d in diffs:
    print(f"  [{d['category']}] {d['test']}: {d['routed']}: "
          f"{d['reason'] or d['error']}")
  if fixed:
    print(f"  passing routed only: {fixed}")
  with open(os.path.join(args.out, "summary.json"), "w") as f:
    json.dump({"jax": version[0], "jaxlib": version[1], "python": version[2],
               "source": args.test_file or f"{args.jax_git}@{args.ref}",
               "unpatched": _tally(plain["results"]), "routed": _tally(routed["results"]),
               "counts": totals, "tests_meeting_jaxll": len(touched),
               "tests_meeting_jaxll_passed": len(touched_passed),
               "differences": diffs, "passing_routed_only": fixed}, f, indent=1)
  if not any(totals.get(k) for k in _JAXLL_COUNTS):
    print("the routed pass met no jaxll collective: it tested nothing")
    return 2
  return 1 if real else 0


if __name__ == "__main__":
  sys.exit(main())
