// The group twins of the fused all-reduce + residual + RMSNorm kernels
// (group_launch.h), and their launch.
#include "kernels/launch.h"
#include "kernels/rmsnorm_args.h"
#include "kernels/rmsnorm_decode.cuh"
#include "kernels/rmsnorm_general.cuh"
#include "kernels/rmsnorm_select.h"
#include "kernels/rmsnorm_twoshot.cuh"
#include "kernels/group_args.cuh"
#include "kernels/group_launch.h"

namespace jaxll {
namespace {

template <class T>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    rmsnorm_general_group_kernel(const __grid_constant__ GroupArgs<RmsNormArgs> g) {
  rmsnorm_general<T>(g.rank[blockIdx.y]);
}
template <class T, int NR, Proto P>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    rmsnorm_decode_group_kernel(const __grid_constant__ GroupArgs<RmsNormArgs> g) {
  rmsnorm_decode<T, NR, P>(g.rank[blockIdx.y]);
}
template <class T, int NR, Proto P, int K>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    rmsnorm_twoshot_group_kernel(const __grid_constant__ GroupArgs<RmsNormArgs> g) {
  rmsnorm_twoshot<T, NR, P, K>(g.rank[blockIdx.y]);
}

template <class T>
struct GeneralTwin {
  static const void* fn() { return reinterpret_cast<const void*>(&rmsnorm_general_group_kernel<T>); }
};
template <class T, int NR, Proto P>
struct DecodeTwin {
  static const void* fn() { return reinterpret_cast<const void*>(&rmsnorm_decode_group_kernel<T, NR, P>); }
};
template <class T, int NR, Proto P, int K>
struct TwoShotNormTwin {
  static const void* fn() {
    return reinterpret_cast<const void*>(&rmsnorm_twoshot_group_kernel<T, NR, P, K>);
  }
};

using RmsNormTwins = RmsNormKernels<GeneralTwin, DecodeTwin, TwoShotNormTwin>;

}  // namespace

Status launch_all_reduce_rmsnorm_group(DType dtype, const RankView* views, int n,
                                       const RmsNormOperands* ops, int64_t tokens, int64_t hidden,
                                       float eps, RmsNormProtocol protocol, cudaStream_t stream) {
  if (n < 1 || n > kMaxRanks || views[0].nranks != n) return Status::NoPlan();
  if (tokens <= 0) return Status::Ok();
  GroupArgs<RmsNormArgs> group{};
  RmsNormPlan plan;
  for (int i = 0; i < n; ++i) {
    PreparedRmsNorm call;
    const Status s = prepare_all_reduce_rmsnorm(dtype, views[i], ops[i].x, ops[i].residual,
                                                ops[i].weight, ops[i].normed, ops[i].new_residual,
                                                tokens, hidden, eps, protocol, &call);
    if (!s.ok()) return s;
    const RmsNormPlan& p = call.plan;
    // (one grid for all: every rank's plan must be rank 0's)
    if (i > 0 && (p.blocks != plan.blocks || p.threads != plan.threads || p.cluster != plan.cluster ||
                  p.pdl != plan.pdl || p.lean != plan.lean || p.twoshot != plan.twoshot ||
                  p.proto != plan.proto || p.units != plan.units)) {
      return Status::NoPlan();
    }
    plan = p;
    group.rank[i] = call.args;
  }
  return launch_collective(RmsNormTwins::of(plan, dtype, n), plan.blocks, plan.threads, plan.pdl,
                           &group, stream, plan.cluster, n);
}

std::vector<const void*> group_rmsnorm_kernel_functions() { return RmsNormTwins::all(); }

}  // namespace jaxll
