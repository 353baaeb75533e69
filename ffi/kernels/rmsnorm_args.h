// The fused call's argument block (host and device), and how the host fills it.
#pragma once

#include <cstdint>

#include "kernels/call_args.h"
#include "kernels/rmsnorm.h"

namespace jaxll {

struct RmsNormArgs {
  // view, signature and trigger; the one-shot rounds also read in (= x), count
  // (tokens x hidden) and round_units (= chunk_units)
  AllReduceArgs base;
  const void* x;
  const void* residual;
  const void* weight;
  void* normed;
  void* new_residual;
  int64_t tokens;
  int64_t hidden;
  int64_t row_units;    // units of a row (the protocol's: 8 bytes for LL16, 16 for sentinel)
  int64_t seg_span;     // units of a row one block owns (a row's last segment may have fewer)
  int64_t chunk_units;  // most units of a segment one round moves
  int segments;         // S: blocks per row
  int waves;            // row-waves of the call: ceil(tokens / (gridDim.x / S))
  int clustered;        // 1: the S blocks of a row are one thread-block cluster
  float eps;
};

// One rank's fused call, ready to launch (the kernel is looked up by the plan:
// rmsnorm_select.h).
struct PreparedRmsNorm {
  RmsNormPlan plan;
  RmsNormArgs args{};
};
// Plans one rank's call and fills its arguments: Refused where `protocol`
// cannot serve it, NoKernel for an element type or hidden size the kernels do
// not support, NoPlan for a call of no tokens (nothing to launch).
Status prepare_all_reduce_rmsnorm(DType dtype, const RankView& view, const void* x,
                                  const void* residual, const void* weight, void* normed,
                                  void* new_residual, int64_t tokens, int64_t hidden, float eps,
                                  RmsNormProtocol protocol, PreparedRmsNorm* call);

}  // namespace jaxll
