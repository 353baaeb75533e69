// All-gather and reduce-scatter on the one-shot path (gather_scatter.cu), with
// the LL16 protocol (Algorithm::kOneShotLL), the sentinel protocol
// (kOneShotSentinel) or the barrier baseline (kOneShotBarrier). `count` is the
// elements of one piece: all-gather takes `count` and writes nranks x `count`
// (rank r's piece at r x count); reduce-scatter takes nranks x `count` and
// writes `count` (this rank's piece of the sum, added in rank order). A piece
// lies in the gathered output (the scattered input) as count / `segment`
// segments of `segment` elements, nranks segments apart (segment = count:
// pieces back to back, a gather or scatter along dimension 0).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "jaxll/rank_view.h"
#include "kernels/status.h"
#include "kernels/types.h"

namespace jaxll {

bool has_gather_scatter_kernel(Collective c, Algorithm algorithm, DType dtype);
// NoKernel: no kernel for the combination; NoPlan: nothing to launch, or
// segments that do not fit (segments_fit).
Status launch_gather_scatter(Collective c, Algorithm algorithm, DType dtype, const RankView& view,
                             const void* in, void* out, int64_t count, int64_t segment,
                             cudaStream_t stream);
// Whether pieces of `count` elements can be cut into segments of `segment`:
// segment divides count. (A segment that is not a whole number of the
// protocol's transfer units moves element by element: Pieces, pieces.cuh.)
bool segments_fit(int64_t count, int64_t segment);
std::vector<const void*> gather_scatter_kernel_functions();

}  // namespace jaxll
