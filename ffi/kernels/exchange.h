// ppermute and all-to-all on the one-shot path (exchange.cu), with the LL16
// protocol (Algorithm::kOneShotLL), the sentinel protocol (kOneShotSentinel) or
// the barrier baseline (kOneShotBarrier). Both move bits and never look at
// them, but for the sentinel protocol's pattern: a peer's element whose bits
// are all ones arrives as the canonical NaN, as in the sentinel all-gather.
//
//   ppermute    `count` elements of this rank's input go to rank `dst` (-1: to
//               nobody), and its output receives rank `src`'s input (-1: from
//               nobody, the output is zeros). dst == src == rank copies.
//   all-to-all  nranks pieces of `count` elements: piece j of this rank's input
//               goes to rank j, and piece j of its output comes from rank j.
//               The input's pieces lie as count / `in_segment` segments of
//               `in_segment` elements, nranks segments apart, the output's
//               likewise with `out_segment` (segment = count: pieces back to
//               back; gather_scatter.h): any split and concat dimensions, with
//               no copy.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "jaxll/rank_view.h"
#include "kernels/status.h"
#include "kernels/types.h"

namespace jaxll {

// Collective::kPermute or kAllToAll.
bool has_exchange_kernel(Collective c, Algorithm algorithm, DType dtype);

// NoKernel: no kernel for the combination; NoPlan: nothing to launch. `tag`
// (0..15) stands for the whole permutation in the call's signature, so ranks
// that permute differently are told apart (but for a tag collision).
Status launch_ppermute(Algorithm algorithm, DType dtype, const RankView& view, const void* in,
                       void* out, int64_t count, int dst, int src, uint32_t tag,
                       cudaStream_t stream);
// NoPlan also for segments that do not fit (segments_fit, gather_scatter.h).
Status launch_all_to_all(Algorithm algorithm, DType dtype, const RankView& view, const void* in,
                         void* out, int64_t count, int64_t in_segment, int64_t out_segment,
                         cudaStream_t stream);

// The signature tag of a permutation given as each rank's destination
// (dests[r], -1: none): 0 for none at all, else 1..15.
uint32_t permutation_tag(const int64_t* dests, int nranks);

std::vector<const void*> exchange_kernel_functions();

}  // namespace jaxll
