// The fused all-reduce + residual + RMSNorm kernels (rmsnorm.h): the general
// kernel (rmsnorm_general.cuh), the decode-shape kernel (rmsnorm_decode.cuh)
// and the two-shot kernel (rmsnorm_twoshot.cuh), and their launch.
#include "kernels/launch.h"
#include "kernels/rmsnorm_args.h"
#include "kernels/rmsnorm_decode.cuh"
#include "kernels/rmsnorm_general.cuh"
#include "kernels/rmsnorm_select.h"
#include "kernels/rmsnorm_twoshot.cuh"

namespace jaxll {
namespace {

template <class T>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) rmsnorm_general_kernel(RmsNormArgs a) {
  rmsnorm_general<T>(a);
}

template <class T, int NR, Proto P>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) rmsnorm_decode_kernel(RmsNormArgs a) {
  rmsnorm_decode<T, NR, P>(a);
}

template <class T, int NR, Proto P, int K>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) rmsnorm_twoshot_kernel(RmsNormArgs a) {
  rmsnorm_twoshot<T, NR, P, K>(a);
}

template <class T>
struct General {
  static const void* fn() { return reinterpret_cast<const void*>(&rmsnorm_general_kernel<T>); }
};
template <class T, int NR, Proto P>
struct Decode {
  static const void* fn() { return reinterpret_cast<const void*>(&rmsnorm_decode_kernel<T, NR, P>); }
};
template <class T, int NR, Proto P, int K>
struct TwoShot {
  static const void* fn() {
    return reinterpret_cast<const void*>(&rmsnorm_twoshot_kernel<T, NR, P, K>);
  }
};

using Kernels = RmsNormKernels<General, Decode, TwoShot>;

}  // namespace

const void* rmsnorm_reference_kernel(DType dtype) { return Kernels::general(dtype); }

std::vector<const void*> rmsnorm_kernel_functions() { return Kernels::all(); }

Status launch_all_reduce_rmsnorm(DType dtype, const RankView& view, const void* x,
                                 const void* residual, const void* weight, void* normed,
                                 void* new_residual, int64_t tokens, int64_t hidden, float eps,
                                 RmsNormProtocol protocol, cudaStream_t stream) {
  if (tokens <= 0) return Status::Ok();
  PreparedRmsNorm call;
  const Status s = prepare_all_reduce_rmsnorm(dtype, view, x, residual, weight, normed,
                                              new_residual, tokens, hidden, eps, protocol, &call);
  if (!s.ok()) return s;
  const RmsNormPlan& plan = call.plan;
  return launch_collective(Kernels::of(plan, dtype, view.nranks), plan.blocks, plan.threads,
                           plan.pdl, &call.args, stream, plan.cluster);
}

}  // namespace jaxll
