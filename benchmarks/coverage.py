"""Which path every jaxll collective call site of a program takes here: a table
of jaxll.explain's call sites (op, mesh axes, gathered or scattered dimension,
bytes, dtype, per-device shape, the kernel or "xla", and why), then how many
sites there are and how many are on a kernel.

Programs (--program):
  train       examples/fsdp_tp_train.py's training step through jaxll.route: FSDP
              gathers along several dimensions and their gradient scatters,
              sequence-parallel gathers and scatters, psums, in a scan under
              jax.checkpoint, forward and backward
  tp_decode   examples/tp_decode.py's decode step with jaxll.all_reduce (--fused:
              with jaxll.all_reduce_rmsnorm)

Any other flag goes to the program's own parser (sizes, --dtype, --fsdp/--tp,
--shape, ...), as do --processes N (N local jax.distributed processes through
jaxll.tools.launch, sharing GPU 0 where there are fewer GPUs; process 0's table is
printed) and --json OUT. Devices as in the examples: all local GPUs, or 8 CPU
devices where there is none (there every path is "xla": "lowering for cpu").
Nothing runs: the program is only lowered, in every process (a kernel's
workspace is built at lowering, by all processes together).

  python benchmarks/coverage.py --program train
  python benchmarks/coverage.py --program tp_decode --shape 8b --layers 2 --batch 8
  python benchmarks/coverage.py --program train --processes 2 --require-kernels

--require-kernels exits with status 1 when any site is not on a kernel.
"""

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))

import example_utils as eu  # noqa: E402

PROGRAMS = ("train", "tp_decode")


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=False)
  p.add_argument("--program", choices=PROGRAMS, default="train")
  p.add_argument("--require-kernels", action="store_true",
                 help="exit with status 1 when a call site is not on a kernel")
  p.add_argument("-h", "--help", action="store_true")
  ours, rest = p.parse_known_args(argv)
  if ours.help:
    print(__doc__)
    raise SystemExit(0)
  opts = _program(ours.program).parse(rest)
  opts.program, opts.require_kernels = ours.program, ours.require_kernels
  return opts


def _program(name):
  if name == "train":
    import fsdp_tp_train
    return fsdp_tp_train
  import tp_decode
  return tp_decode


def build(opts, devices):
  """(jitted program, its arguments, a description) for opts.program."""
  import functools

  import numpy as np

  import jaxll
  if opts.program == "train":
    import fsdp_tp_train as ft
    model = ft.Model(opts, devices)
    step = model.make_step(routed=True)
    args = (*model.init_state(), *model.init_batch())
    m = model.dims
    mesh = " x ".join(f"{a}={model.mesh.shape[a]}" for a in model.mesh.axis_names)
    what = (f"fsdp_tp_train step through jaxll.route: mesh {mesh}, {m['layers']} layers "
            f"(scan, remat), hidden {m['hidden']}, {m['heads']} heads of {m['head_dim']}, "
            f"ffn {m['ffn']}, vocab {m['vocab']}, batch {m['batch']} x seq {m['seq']}, "
            f"{opts.dtype}, {opts.optimizer}")
    return step, args, what
  import tp_decode as td
  model = td.Decoder(opts, devices)
  # (tp_decode's jaxll run; a partial, so that each site is named by tp_decode's line)
  step = model.make_step(functools.partial(jaxll.all_reduce, axis_name="tp"), fused=opts.fused)
  token = model.replicated(np.zeros((opts.batch,), np.int32))
  args = (model.params, *model.new_cache(), token, model.replicated(np.int32(0)))
  what = (f"tp_decode step with jaxll.{'all_reduce_rmsnorm' if opts.fused else 'all_reduce'}: "
          f"tp={len(devices)}, {opts.shape} shape, {opts.layers} layers (scan), batch "
          f"{opts.batch}, context {opts.context}, {opts.dtype}")
  return step, args, what


def run(opts):
  import jax

  import jaxll
  devices = jax.devices()
  step, args, what = build(opts, devices)
  sites = jaxll.explain(step, *args)
  rows = [dataclasses.asdict(s) for s in sites]
  on_kernel = sum(1 for s in sites if on_a_kernel(s.algorithm))
  return {"program": opts.program, "describes": what, "ran_on": eu.describe(opts, devices),
          "platform": devices[0].platform, "jax": jax.__version__, "sites": rows,
          "summary": {"sites": len(rows), "on_kernel": on_kernel,
                      "by_op": _count(rows, "op"), "by_path": _count(rows, "algorithm")}}


def on_a_kernel(path: str) -> bool:
  """Whether a site's path is one of jaxll's kernels ("composed": a fused call
  done as jaxll.all_reduce, listed apart, then XLA's ops)."""
  return path not in ("xla", "composed")


def _count(rows, key):
  out = {}
  for r in rows:
    out[r[key]] = out.get(r[key], 0) + 1
  return out


def _site(text):
  """The site's chain of user frames, a caller in the same file shown by its
  line alone: "train.py:156 (gather) <- :193 (layer)"."""
  frames = text.split(" <- ")
  out = [frames[0]]
  for f in frames[1:]:
    name = f.split(":", 1)[0]
    out.append(f[len(name):] if name == frames[0].split(":", 1)[0] else f)
  return " <- ".join(out)


def print_report(r):
  print(f"coverage of {r['describes']}")
  print(f"ran on {r['ran_on']} (jax {r['jax']})")
  head = ("#", "site", "op", "axes", "dim", "group", "bytes", "dtype", "shape", "path")
  rows = [(str(i), _site(s["site"]), s["op"], s["axes"],
           "-" if s["dimension"] < 0 else str(s["dimension"]), str(s["group_size"]),
           str(s["nbytes"]), s["dtype"], s["shape"].replace(" ", ""), s["algorithm"])
          for i, s in enumerate(r["sites"])]
  widths = [max(len(x) for x in col) for col in zip(head, *rows)]
  fmt = "  ".join(f"{{:{'>' if h in ('#', 'dim', 'group', 'bytes') else '<'}{w}}}"
                  for h, w in zip(head, widths))
  print(fmt.format(*head))
  for row, s in zip(rows, r["sites"]):
    print(fmt.format(*row) + "  " + s["reason"])
  s = r["summary"]
  ops = ", ".join(f"{k} {v}" for k, v in sorted(s["by_op"].items()))
  rest = ", ".join(f"{v} {k}" for k, v in sorted(s["by_path"].items()) if not on_a_kernel(k))
  print(f"{s['sites']} call sites ({ops}); {s['on_kernel']} on a kernel"
        + (f", {rest}" if rest else ""))


def main(argv=None):
  opts = parse(argv)
  report = eu.main(opts, run, print_report, __file__)
  if (opts.require_kernels and not opts.worker
      and report["summary"]["on_kernel"] < report["summary"]["sites"]):
    print(f"--require-kernels: {report['summary']['sites'] - report['summary']['on_kernel']} "
          "call sites are not on a kernel", file=sys.stderr)
    raise SystemExit(1)
  return report


if __name__ == "__main__":
  main()
