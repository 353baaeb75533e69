// Host interface of the all-reduce kernels: how a call is cut, which kernel
// serves it, and its launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "jaxll/rank_view.h"
#include "kernels/call_args.h"
#include "kernels/kernel_table.h"
#include "kernels/status.h"
#include "kernels/types.h"

namespace jaxll {

struct LaunchPlan {
  int blocks = 0;  // 0: the call cannot run
  int threads = 0;
  int64_t units = 0;        // transfer units of the message
  int64_t span = 0;         // units per block
  int64_t round_units = 0;  // most units per block and round
  int64_t rounds = 0;       // rounds of every block but the last (the most of any block)
  int64_t last_rounds = 0;  // rounds of the last block
};

// Grid and round structure of an all-reduce of `count` elements of
// `elem_bytes` bytes over `nranks` ranks, for a workspace of geometry `geo`
// whose grids are bounded by `max_blocks`. Depends only on its arguments, so
// every rank computes the same plan. (The gather and scatter kernels take the
// one-shot plan of one piece.)
LaunchPlan plan_all_reduce(Algorithm algorithm, int64_t count, int elem_bytes, int nranks,
                           const ScratchGeometry& geo, int max_blocks, bool signatures = true);

// The production kernels of the all-reduce.
const KernelTable& all_reduce_kernels();
// True when `algorithm` has a kernel for (dtype, op).
bool has_kernel(Algorithm algorithm, DType dtype, ReduceOp op);

// One rank's all-reduce, ready to launch: the kernel (from `table`), its plan
// and its arguments.
struct PreparedAllReduce {
  const void* fn = nullptr;
  LaunchPlan plan;
  AllReduceArgs args{};
};
// Prepares one rank's all-reduce of `count` elements from `in` to `out` (may
// alias) on `view`'s workspace with a kernel of `table` (all_reduce_kernels(),
// or a table of the same kernels' twins). NoKernel: no kernel for the
// combination; NoPlan: nothing to launch.
Status prepare_all_reduce(const KernelTable& table, Algorithm algorithm, DType dtype, ReduceOp op,
                          const RankView& view, const void* in, void* out, int64_t count,
                          PreparedAllReduce* out_call);

// Launches one rank's all-reduce on `stream`.
Status launch_all_reduce(Algorithm algorithm, DType dtype, ReduceOp op, const RankView& view,
                         const void* in, void* out, int64_t count, cudaStream_t stream);

}  // namespace jaxll
