// The group twins of the all-reduce kernels (group_launch.h): the kernel
// library's bodies instantiated with a GroupArgs parameter, and their launch.
// The fused kernels' twins are in group_rmsnorm_kernels.cu (two files build in
// parallel).
#include "kernels/all_reduce.h"
#include "kernels/launch.h"
#include "kernels/oneshot.cuh"
#include "kernels/twoshot.cuh"
#include "kernels/twoshot_atomic.cuh"
#include "kernels/group_args.cuh"
#include "kernels/group_launch.h"

namespace jaxll {
namespace {

template <Proto P, class T, class Op, int NR>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    oneshot_group_kernel(const __grid_constant__ GroupArgs<AllReduceArgs> g) {
  oneshot_all_reduce<P, T, Op, NR>(g.rank[blockIdx.y]);
}
template <Proto P, class T, class Op, int NR>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    twoshot_group_kernel(const __grid_constant__ GroupArgs<AllReduceArgs> g) {
  twoshot_all_reduce<P, T, Op, NR>(g.rank[blockIdx.y]);
}
template <class T>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    twoshot_atomic_group_kernel(const __grid_constant__ GroupArgs<AllReduceArgs> g) {
  twoshot_atomic_all_reduce<T>(g.rank[blockIdx.y]);
}

template <Proto P, class T, class Op, int NR>
struct OneShotTwin {
  static const void* fn() { return reinterpret_cast<const void*>(&oneshot_group_kernel<P, T, Op, NR>); }
};
template <Proto P, class T, class Op, int NR>
struct TwoShotTwin {
  static const void* fn() { return reinterpret_cast<const void*>(&twoshot_group_kernel<P, T, Op, NR>); }
};
template <class T>
void add_atomic_twin(KernelTable& t) {
  t.add(Family::kTwoShotAtomic, Proto::kSentinel, dtype_of<T>(), ReduceOp::kSum, 0,
        reinterpret_cast<const void*>(&twoshot_atomic_group_kernel<T>));
}

const KernelTable& twins() {
  static const KernelTable t = [] {
    KernelTable k;
    register_family<OneShotTwin>(k, Family::kOneShot);
    register_family<TwoShotTwin>(k, Family::kTwoShot);
    add_atomic_twin<float>(k);
    add_atomic_twin<__nv_bfloat16>(k);
    add_atomic_twin<__half>(k);
    return k;
  }();
  return t;
}


}  // namespace

Status launch_all_reduce_group(Algorithm algorithm, DType dtype, ReduceOp op,
                               const RankView* views, int n, const void* const* in,
                               void* const* out, int64_t count, cudaStream_t stream) {
  if (n < 1 || n > kMaxRanks || views[0].nranks != n) return Status::NoPlan();
  GroupArgs<AllReduceArgs> group{};
  PreparedAllReduce first;
  for (int i = 0; i < n; ++i) {
    PreparedAllReduce call;
    const Status s = prepare_all_reduce(twins(), algorithm, dtype, op, views[i], in[i], out[i],
                                        count, &call);
    if (!s.ok()) return s;
    // (one grid for all: every rank's plan and kernel must be rank 0's)
    if (i == 0) first = call;
    if (call.fn != first.fn || call.plan.blocks != first.plan.blocks ||
        call.plan.threads != first.plan.threads || call.args.trigger != first.args.trigger) {
      return Status::NoPlan();
    }
    group.rank[i] = call.args;
  }
  return launch_collective(first.fn, first.plan.blocks, first.plan.threads, first.args.trigger != 0,
                           &group, stream, 1, n);
}

std::vector<const void*> group_kernel_functions() {
  std::vector<const void*> out;
  for (const KernelEntry& e : twins().entries()) out.push_back(e.fn);
  for (const void* fn : group_rmsnorm_kernel_functions()) out.push_back(fn);
  return out;
}

}  // namespace jaxll
