"""What the launcher-driven end-to-end checks must show
(tests/mp_scripts/allreduce_checks.py reports; these helpers judge)."""

import os

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKS = os.path.join(HERE, "mp_scripts", "allreduce_checks.py")
TP_BLOCK = os.path.join(HERE, "mp_scripts", "tp_block.py")
# environment of the GPU runs' workers (NVLink multicast stays off)
GPU_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "NCCL_NVLS_ENABLE": "0",
           "JAXLL_TIMEOUT_MS": "20000", "JAXLL_SETUP_TIMEOUT_MS": "120000", "XLA_FLAGS": ""}
# seconds one run may take before its workers are killed and the test fails
TIMEOUT = float(os.environ.get("JAXLL_MP_TEST_TIMEOUT", "500"))


def verify(workers, min_cases: int) -> None:
  """Every process passed every case, and the ranks of each group (a case name
  identifies its group) hold the same bits in every process."""
  errors = [f"process {w.process_id}: {e}" for w in workers for e in w.result["errors"]]
  assert not errors, errors[:20]
  assert len(workers[0].result["cases"]) >= min_cases, len(workers[0].result["cases"])
  by_name = {}
  for w in workers:
    for name, case in w.result["cases"].items():
      assert case["ok"], (w.process_id, name)
      by_name.setdefault(name, set()).add(case["hash"])
  split = [name for name, hashes in by_name.items() if len(hashes) > 1]
  assert not split, split[:5]


def describe(workers, title: str) -> str:
  """One line per run for the test log: time per section, latency if measured."""
  r = workers[0].result
  line = f"\n{title}: sections (s) {r['seconds']}"
  if "stress_calls" in r:
    line += f"; stress {r['stress_calls']} calls"
  if "latency_us" in r:
    lat = {a: sorted(round(w.result["latency_us"][a], 2) for w in workers) for a in r["latency_us"]}
    line += (f"\n  jitted chain of 50, us per call at 4 KiB (per process, sorted): {lat}; "
             f"paths {r['latency_path']}")
  return line


# --- The determinism contract: inputs both the processes and the test build ---------

DETERMINISM_SCRIPT = os.path.join(HERE, "mp_scripts", "determinism_check.py")
# all-reduce message lengths (float32 elements per rank): one call, one round
# of the default scratch, several rounds, past the auto crossover to XLA
DETERMINISM_COUNTS = (1024, 65536, 300 * 1024)
# fused calls: (hidden, dtype), rows of 8-byte multiples that are not 16-byte
# multiples included; and the token counts
DETERMINISM_ROWS = ((4096, "bfloat16"), (1028, "bfloat16"), (2048, "float32"))
DETERMINISM_TOKENS = (1, 8, 64, 256)


def determinism_inputs(shape, dtype, seed: int):
  """Values of every magnitude from 2^-20 to 2^20 (2^-10 to 2^10 for float16)
  so that sums round, a few exact zeros and negative zeros, as `dtype` (a
  numpy dtype's name, or "bfloat16")."""
  import ml_dtypes
  import numpy as np
  rng = np.random.default_rng(seed)
  top = 10 if dtype == "float16" else 20
  v = rng.standard_normal(shape) * np.exp2(rng.integers(-top, top + 1, shape))
  v[rng.random(shape) < 0.01] = 0.0
  v[rng.random(shape) < 0.01] = -0.0
  return v.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype))
