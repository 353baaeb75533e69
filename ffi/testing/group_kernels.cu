// The group twins of the all-reduce and fused kernels (group_launch.h): the
// kernel library's bodies instantiated with a GroupArgs parameter, and their
// launch.
#include "kernels/all_reduce.h"
#include "kernels/launch.h"
#include "kernels/oneshot.cuh"
#include "kernels/rmsnorm_args.h"
#include "kernels/rmsnorm_decode.cuh"
#include "kernels/rmsnorm_general.cuh"
#include "kernels/rmsnorm_select.h"
#include "kernels/rmsnorm_twoshot.cuh"
#include "kernels/twoshot.cuh"
#include "kernels/twoshot_atomic.cuh"
#include "testing/group_launch.h"

namespace jaxll {
namespace {

// The arguments of every rank of a group: the twin takes them as a
// __grid_constant__ parameter (read in place, never copied); the host fills the
// first nranks entries. The ranks' plans are equal (a plan depends only on the
// call and the workspace's geometry), so blockIdx.x and gridDim.x mean in each
// rank's blocks what they mean in a launch of that rank alone.
template <class Args>
struct GroupArgs {
  Args rank[kMaxRanks];
};
static_assert(sizeof(GroupArgs<AllReduceArgs>) <= kMaxKernelParamBytes,
              "a virtual group's all-reduce arguments exceed a kernel's parameter space");
static_assert(sizeof(GroupArgs<RmsNormArgs>) <= kMaxKernelParamBytes,
              "a virtual group's fused-call arguments exceed a kernel's parameter space");

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

std::vector<const void*> group_kernel_functions() {
  std::vector<const void*> out;
  for (const KernelEntry& e : twins().entries()) out.push_back(e.fn);
  for (const void* fn : RmsNormTwins::all()) out.push_back(fn);
  return out;
}

}  // namespace jaxll
