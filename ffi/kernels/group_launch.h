// Every rank of a virtual group in one launch: rank r's blocks are those with
// blockIdx.y == r, each running the same kernel body with rank r's arguments
// (the kernels' "group twins": the same bodies with every rank's arguments,
// compiled into the kernel library beside the kernels, which alone can launch
// them). The testing tools' virtual ranks use them: instead of a fork onto the
// ranks' streams, N kernels and a join, one kernel node a call, what a step on
// separate GPUs has. Its ranks start together. The runtime never launches them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "jaxll/rank_view.h"
#include "kernels/rmsnorm.h"
#include "kernels/status.h"
#include "kernels/types.h"

namespace jaxll {

// One all-reduce on every rank of a virtual group (views[i] is rank i's, n ==
// views[i].nranks), with the kernel, plan and signature launch_all_reduce
// would give each; NoPlan where the ranks' plans differ.
Status launch_all_reduce_group(Algorithm algorithm, DType dtype, ReduceOp op,
                               const RankView* views, int n, const void* const* in,
                               void* const* out, int64_t count, cudaStream_t stream);

// One rank's operands of the fused call.
struct RmsNormOperands {
  const void* x;
  const void* residual;
  const void* weight;
  void* normed;
  void* new_residual;
};
// The fused call on every rank of a virtual group (as launch_all_reduce_group).
Status launch_all_reduce_rmsnorm_group(DType dtype, const RankView* views, int n,
                                       const RmsNormOperands* ops, int64_t tokens, int64_t hidden,
                                       float eps, RmsNormProtocol protocol, cudaStream_t stream);

// The group twins, for loading with the workspace and for the grid bound:
// all of them, and the fused kernels' alone.
std::vector<const void*> group_kernel_functions();
std::vector<const void*> group_rmsnorm_kernel_functions();

}  // namespace jaxll
