// The LL128-atomic all-reduce kernels (twoshot_atomic.cuh) and their table entries.
#include "kernels/kernel_table.h"
#include "kernels/twoshot_atomic.cuh"

namespace jaxll {
namespace {

template <class T>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) twoshot_atomic_kernel(AllReduceArgs a) {
  twoshot_atomic_all_reduce<T>(a);
}

template <class T>
void add(KernelTable& t) {
  t.add(Family::kTwoShotAtomic, Proto::kSentinel, dtype_of<T>(), ReduceOp::kSum, 0,
        reinterpret_cast<const void*>(&twoshot_atomic_kernel<T>));
}

}  // namespace

void register_atomic_kernels(KernelTable& t) {
  add<float>(t);
  add<__nv_bfloat16>(t);
  add<__half>(t);
}

}  // namespace jaxll
