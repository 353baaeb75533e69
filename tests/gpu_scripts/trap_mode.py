"""JAXLL_ON_ERROR=trap (run with it set): a rank that never arrives makes its
peers record the timeout and trap, which aborts the CUDA context. The call must
raise at the next synchronization, and jaxll.errors() (host memory only) must
still describe what happened. Prints TRAP_MODE OK or TRAP_MODE FAILED."""
import os

import numpy as np

import jaxll
from jaxll.tools import testing as jt

assert jaxll.on_error_mode() == "trap", jaxll.on_error_mode()
cfg = jaxll.WorkspaceConfig(timeout_ms=200)
x = np.ones((3, 1000), np.float32)
raised = ""
try:
  out = jt.virtual_all_reduce(x, config=cfg, _skip_rank=1)
  np.asarray(out)
except Exception as e:  # what the user sees
  raised = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
print("raised:", raised or "nothing", flush=True)
errors = jaxll.errors()
print("errors():", errors[:1], flush=True)
ok = bool(raised) and bool(errors) and "waited more than 200 ms" in errors[0]
print("TRAP_MODE", "OK" if ok else "FAILED", flush=True)
os._exit(0)  # the context is gone: skip JAX's teardown
