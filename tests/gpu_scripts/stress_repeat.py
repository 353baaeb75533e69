"""Runs the N=8 mixed-algorithm stress of test_gpu_virtual.py
(test_stress_hundred_thousand_calls_mixing_algorithms) several times per
setting, each run in a fresh process (settings are read when a workspace is
built), and prints one line per run: the setting, the error if any (its first
line says which wait gave up: "... for rank R" on the data path, "... for rank R
to start its call" on the call signatures) and the time. For chasing the
intermittent N=8 timeout (docs/faults.md).

  python tests/gpu_scripts/stress_repeat.py [RUNS_PER_SETTING] [SECONDS] [SETTINGS]

SETTINGS is a comma-separated subset of the names below (default: all). A
failed run also prints, for every rank, the error it recorded and the call
(index, algorithm, element count, round, grid) that error is about.
"""
import json
import os
import subprocess
import sys
import time

CHILD = r'''
import json, sys, time, numpy as np, jaxll
from jaxll.tools import testing as jt, algorithms
from jaxll.native import ext
calls = int(sys.argv[1])
rng = np.random.default_rng(5)
small = rng.integers(1, 2048, size=calls - calls // 10)
large = rng.integers(2048, 200_000, size=calls // 10)
counts = [int(c) for c in rng.permutation(np.concatenate([small, large]))]
names = list(algorithms.KERNELS)
cfg = jaxll.WorkspaceConfig(timeout_ms=3000)
t = time.time()
res = jt.stress(8, counts, algorithm=names, seed=5, max_delay_us=10, config=cfg)
out = {"error": res["error"][:300], "mismatches": res["mismatches"],
       "seconds": round(time.time() - t, 1)}
if res["error"]:
  # Which call each rank's error is about: replay the per-block epochs of the
  # call sequence with the host's launch plan.
  info = ext.workspace_info(jt.virtual_workspace(8, config=cfg).id)
  where = {}
  epochs = {}
  for c, count in enumerate(counts):
    name = names[c % len(names)]
    p = ext.plan_all_reduce(algorithms.SPECS[name].code, count, 4, 8, info["region_bytes"],
                            info["max_blocks"])
    for b in range(p["blocks"]):
      rounds = p["rounds"] if b + 1 < p["blocks"] else p["last_rounds"]
      first = epochs.get(b, 0) + 1
      for e in range(first, first + rounds):
        where[(b, e & 0xFFFFFFFF)] = (c, name, count, e - first, p["blocks"], rounds)
      epochs[b] = first + rounds - 1
  out["ranks"] = []
  for r, word in enumerate(res["rank_errors"]):
    if not word:
      out["ranks"].append([r, "no error"])
      continue
    kind, rank, peer, block, epoch = ext.decode_error(word)
    out["ranks"].append([r, {"kind": kind, "peer": peer, "block": block, "epoch": epoch,
                             "call": where.get((block, epoch))}])
print(json.dumps(out))
'''
SETTINGS = [("default", {}), ("JAXLL_SIGNATURES=0", {"JAXLL_SIGNATURES": "0"}),
            ("JAXLL_PDL=0", {"JAXLL_PDL": "0"}),
            # the driver's own shared-memory configuration per kernel (before uniform-carveout)
            ("JAXLL_SMEM_CARVEOUT=-1", {"JAXLL_SMEM_CARVEOUT": "-1"})]


def main():
  runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
  deadline = time.time() + (float(sys.argv[2]) if len(sys.argv) > 2 else 1e9)
  chosen = sys.argv[3].split(",") if len(sys.argv) > 3 else [n for n, _ in SETTINGS]
  env = dict(os.environ, CUDA_DEVICE_MAX_CONNECTIONS="32")
  for i in range(runs):
    for name, extra in SETTINGS:
      if name not in chosen:
        continue
      if time.time() > deadline:
        print("out of time", flush=True)
        return
      r = subprocess.run([sys.executable, "-c", CHILD, "100000"], capture_output=True,
                         text=True, env=dict(env, **extra), timeout=300, cwd="/")
      lines = r.stdout.strip().splitlines()
      print(name, lines[-1] if lines else r.stderr[-400:], flush=True)


if __name__ == "__main__":
  main()
