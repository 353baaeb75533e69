// The two-shot all-reduce kernels (twoshot.cuh) and their table entries.
#include "kernels/kernel_table.h"
#include "kernels/twoshot.cuh"

namespace jaxll {
namespace {

template <Proto P, class T, class Op, int NR>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) twoshot_kernel(AllReduceArgs a) {
  twoshot_all_reduce<P, T, Op, NR>(a);
}

template <Proto P, class T, class Op, int NR>
struct TwoShotKernel {
  static const void* fn() { return reinterpret_cast<const void*>(&twoshot_kernel<P, T, Op, NR>); }
};

}  // namespace

void register_twoshot_kernels(KernelTable& t) { register_family<TwoShotKernel>(t, Family::kTwoShot); }

}  // namespace jaxll
