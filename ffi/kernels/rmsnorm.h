// Host interface of the fused all-reduce + residual add + RMSNorm: x, residual,
// normed and new_residual are (tokens, hidden) of one element type, weight
// (hidden,); new_residual = all_reduce(x) + residual, normed =
// rmsnorm(new_residual) * weight over each row.
//
// Three kernels serve it (all_reduce_rmsnorm.cu), each cut the same way:
// rows into segments, a block a segment, as many rows at once as the grid
// bound allows (plan_all_reduce_rmsnorm). The exchange is the caller's choice
// (RmsNormProtocol; jaxll's Python side chooses by measurement):
//   kLL               the one-shot rounds on LL16 (any cut)
//   kSentinel         the one-shot rounds on sentinel scratch (16-byte units,
//                     half LL16's bytes): the decode-shape cut only
//   kTwoShotLL/-Sentinel  reduce-scatter and all-gather of each segment's sums
//                     (one row-wave, at most kRmsNormTwoShotUnits units a thread)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "jaxll/protocol.h"
#include "jaxll/rank_view.h"
#include "kernels/status.h"
#include "kernels/types.h"

namespace jaxll {

// The exchange of a fused call. The values are the FFI attribute's.
enum class RmsNormProtocol : int { kLL = 1, kSentinel = 2, kTwoShotLL = 3, kTwoShotSentinel = 4 };
// Every protocol, in code order.
constexpr RmsNormProtocol kRmsNormProtocols[] = {RmsNormProtocol::kLL, RmsNormProtocol::kSentinel,
                                                 RmsNormProtocol::kTwoShotLL,
                                                 RmsNormProtocol::kTwoShotSentinel};
// "ll", "sentinel", "twoshot_ll", "twoshot_sentinel" (null for an unknown code).
const char* rmsnorm_protocol_name(int code);
// Why protocol `p`, asked for, may refuse a call (its plan has no cut): the one
// text the FFI, the tools and Python's lowering report.
const char* rmsnorm_refusal(RmsNormProtocol p);
// Most units a thread of the two-shot kernel holds.
constexpr int kRmsNormTwoShotUnits = 2;
// Most blocks of a row in a thread-block cluster (the portable cluster size).
constexpr int kClusterSegments = 8;

// Null when the kernels can serve (dtype, hidden) on `view`'s workspace, else
// what they lack.
const char* rmsnorm_unsupported(DType dtype, int64_t hidden, const RankView& view);

// How a call is cut: rows of `segments` blocks of `threads` threads,
// `rows_at_once` rows at a time in `waves` row-waves, the blocks of a row one
// thread-block cluster when `cluster` > 1; `slots`: the row's partial sums go
// through the header's tagged slots (the tag then advances by `waves`); spans
// count units of the plan's protocol (8 bytes LL16, 16 sentinel); `lean`: the
// decode-shape cut (one row-wave, one round a segment, a unit a thread);
// `twoshot`: the two-shot kernel runs it. No plan (blocks 0) where the
// protocol cannot serve the call.
struct RmsNormPlan {
  int64_t segments = 1, seg_span = 0, chunk_units = 0, rows_at_once = 1, blocks = 0, waves = 0;
  int threads = 0, cluster = 1, units = 1;  // (units: a two-shot thread's)
  bool slots = false, pdl = false, lean = false, twoshot = false;
  Proto proto = Proto::kLL;
};
// The plan on the current device (it asks the device for cluster capacity).
RmsNormPlan plan_all_reduce_rmsnorm(DType dtype, const RankView& view, int64_t tokens,
                                    int64_t hidden, RmsNormProtocol protocol);
// The plan's 4-bit code in the call signature's reduction field (ranks whose
// plans differ then report a mismatch instead of exchanging mismatched rows).
uint32_t rmsnorm_plan_code(const RmsNormPlan& plan);

// One rank's fused call: Refused where the protocol cannot serve it, NoKernel
// for an element type or hidden size the kernels do not support.
Status launch_all_reduce_rmsnorm(DType dtype, const RankView& view, const void* x,
                                 const void* residual, const void* weight, void* normed,
                                 void* new_residual, int64_t tokens, int64_t hidden, float eps,
                                 RmsNormProtocol protocol, cudaStream_t stream);

// Every kernel of the fused call.
std::vector<const void*> rmsnorm_kernel_functions();
// The kernel whose occupancy and cluster capacity the planner asks (the three
// kernels share launch bounds and use little static shared memory, so its
// figures hold for all of them).
const void* rmsnorm_reference_kernel(DType dtype);

}  // namespace jaxll
