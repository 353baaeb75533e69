// The argument block of a group twin (group_launch.h): every rank's arguments,
// taken as a __grid_constant__ parameter (read in place, never copied); the host
// fills the first nranks entries. The ranks' plans are equal (a plan depends only
// on the call and the workspace's geometry), so blockIdx.x and gridDim.x mean in
// each rank's blocks what they mean in a launch of that rank alone.
#pragma once

#include "kernels/all_reduce.h"
#include "kernels/launch.h"
#include "kernels/rmsnorm_args.h"

namespace jaxll {

template <class Args>
struct GroupArgs {
  Args rank[kMaxRanks];
};
static_assert(sizeof(GroupArgs<AllReduceArgs>) <= kMaxKernelParamBytes,
              "a virtual group's all-reduce arguments exceed a kernel's parameter space");
static_assert(sizeof(GroupArgs<RmsNormArgs>) <= kMaxKernelParamBytes,
              "a virtual group's fused-call arguments exceed a kernel's parameter space");

}  // namespace jaxll
