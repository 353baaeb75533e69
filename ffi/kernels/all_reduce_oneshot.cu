// The one-shot all-reduce kernels (oneshot.cuh) and their table entries.
#include "kernels/kernel_table.h"
#include "kernels/oneshot.cuh"

namespace jaxll {
namespace {

template <Proto P, class T, class Op, int NR>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) oneshot_kernel(AllReduceArgs a) {
  oneshot_all_reduce<P, T, Op, NR>(a);
}

template <Proto P, class T, class Op, int NR>
struct OneShotKernel {
  static const void* fn() { return reinterpret_cast<const void*>(&oneshot_kernel<P, T, Op, NR>); }
};

}  // namespace

void register_oneshot_kernels(KernelTable& t) { register_family<OneShotKernel>(t, Family::kOneShot); }

}  // namespace jaxll
