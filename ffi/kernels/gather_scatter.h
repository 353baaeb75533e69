// All-gather and reduce-scatter on the one-shot path (gather_scatter.cu), with
// the LL16 protocol (Algorithm::kOneShotLL), the sentinel protocol
// (kOneShotSentinel) or the barrier baseline (kOneShotBarrier). `count` is the
// elements of one piece: all-gather takes `count` and writes nranks x `count`
// (rank r's piece at r x count); reduce-scatter takes nranks x `count` and
// writes `count` (this rank's piece of the sum, added in rank order).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "jaxll/rank_view.h"
#include "kernels/status.h"
#include "kernels/types.h"

namespace jaxll {

bool has_gather_scatter_kernel(Collective c, Algorithm algorithm, DType dtype);
// NoKernel: no kernel for the combination; NoPlan: nothing to launch.
Status launch_gather_scatter(Collective c, Algorithm algorithm, DType dtype, const RankView& view,
                             const void* in, void* out, int64_t count, cudaStream_t stream);
std::vector<const void*> gather_scatter_kernel_functions();

}  // namespace jaxll
