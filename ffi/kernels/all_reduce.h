// Host interface of the all-reduce kernels: what the runtime may launch and how.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "jaxll/protocol.h"
#include "jaxll/rank_view.h"

namespace jaxll {

// Element types with a kernel (names and codes: dtype_codes() below).
enum class DType : int { kF32 = 0, kBF16 = 1, kF16 = 2, kI32 = 3 };
// Reduction operators (names and codes: op_codes() below).
enum class ReduceOp : int { kSum = 0, kMax = 1, kMin = 2 };
// Kernel algorithms (names and codes: algorithm_codes() below; 0 is XLA's own all-reduce).
enum class Algorithm : int {
  kOneShotLL = 1,
  kOneShotSentinel = 2,
  kTwoShotLL = 3,
  kTwoShotSentinel = 4,
  kTwoShotLL128Atomic = 5,
  kOneShotBarrier = 6,
  kTwoShotBarrier = 7,
};
constexpr int kLastAlgorithm = 7;

int dtype_bytes(DType t);

struct LaunchPlan {
  int blocks = 0;  // 0: the call cannot run (see plan_all_reduce)
  int threads = 0;
  int64_t units = 0;        // transfer units of the message
  int64_t span = 0;         // units per block
  int64_t round_units = 0;  // most units per block and round
  int64_t rounds = 0;       // rounds of every block but the last (the most of any block)
  int64_t last_rounds = 0;  // rounds of the last block
};

// Grid and round structure of an all-reduce of `count` elements of
// `elem_bytes` bytes over `nranks` ranks, for a workspace of geometry `geo`
// whose grids are bounded by `max_blocks`. Depends only on its arguments, so
// every rank computes the same plan.
LaunchPlan plan_all_reduce(Algorithm algorithm, int64_t count, int elem_bytes, int nranks,
                           const ScratchGeometry& geo, int max_blocks, bool signatures = true);

// The one table of the codes of algorithms, element types and reduction
// operators, by name (the Python side reads it: _jaxll.codes()). Algorithm
// code 0, "xla", is XLA's own all-reduce and has no kernel.
struct CodeName {
  const char* name;
  int code;
};
const std::vector<CodeName>& algorithm_codes();
const std::vector<CodeName>& dtype_codes();
const std::vector<CodeName>& op_codes();

// The signature every rank's call must carry (jaxll/error_word.h).
uint64_t call_signature(Algorithm algorithm, DType dtype, ReduceOp op, int64_t count);
// "all_reduce of 1024 float32 elements, op sum, algorithm oneshot_ll".
std::string describe_signature(uint64_t signature);

// True when `algorithm` has a kernel for (dtype, op).
bool has_kernel(Algorithm algorithm, DType dtype, ReduceOp op);

// Launches one all-reduce of `count` elements from `in` to `out` (may alias) for
// the rank described by `view`, on `stream`. cudaErrorInvalidValue when there is
// no kernel for the combination or the plan is empty.
cudaError_t launch_all_reduce(Algorithm algorithm, DType dtype, ReduceOp op, const RankView& view,
                              const void* in, void* out, int64_t count, cudaStream_t stream);

// One all-reduce on every rank of a virtual group (N ranks of one workspace on
// one GPU: views[i] is rank i's, n == views[i].nranks) as one launch on
// `stream`: rank i's blocks (blockIdx.y == i) run rank i's call from in[i] to
// out[i], with the kernel, plan and signature launch_all_reduce would give it.
// Instead of a fork onto the ranks' streams and a join back (a graph node per
// rank and two per event), one kernel node. cudaErrorInvalidValue as
// launch_all_reduce, or where the ranks' plans differ.
cudaError_t launch_all_reduce_group(Algorithm algorithm, DType dtype, ReduceOp op,
                                    const RankView* views, int n, const void* const* in,
                                    void* const* out, int64_t count, cudaStream_t stream);

// Every __global__ function of the library but the group twins, so that a
// workspace can load them all on a device before first use and bound grids by
// their occupancy.
std::vector<const void*> all_kernel_functions();
// The group twins (launch_all_reduce_group, launch_all_reduce_rmsnorm_group):
// loaded, and counted in the grid bound, for virtual-rank workspaces only.
std::vector<const void*> group_kernel_functions();

// All-reduce + residual + RMSNorm (all_reduce_rmsnorm.cu): x, residual, normed
// and new_residual are (tokens, hidden) of `dtype`, weight (hidden,). Null when
// the kernel can serve (dtype, hidden) on `view`'s workspace, else what it lacks.
const char* rmsnorm_unsupported(DType dtype, int64_t hidden, const RankView& view);
// The exchange the fused kernel moves x with: LL16 (any cut), sentinel (the
// decode-shape kernel only: one round, a 16-byte unit a thread, a row's bytes a
// multiple of 16; half LL16's bytes), or auto: sentinel where it can serve a
// call of at least kFusedSentinelFromBytes of x per rank or with rows of at
// least kFusedSentinelFromRowBytes, or any call in groups of
// kFusedSentinelAnySizeRanks, else LL16. Measured on one H200 (kernel
// times in CUDA graphs, virtual ranks N = 2, 4, 8; benchmarks/README.md):
// below 64 KiB LL16 is up to 0.7 us faster at N = 4 and 8 (the sentinel
// kernel's blocks carry twice the bytes, so fewer blocks share the call), but
// at N = 2 sentinel is faster at 1-2 rows of 8192 bf16 since the cluster's
// row total went to st.async (session 16: 2.56 vs 2.84 us) and equal at 4, from
// 64 KiB the two are within 3% or sentinel is faster (16 x 8192 bf16: 6.22 ->
// 4.39 us at N = 2, 29.9 -> 20.3 us at N = 8), and rows of 16384 bf16 are
// faster on sentinel from 1 token. kTwoShotLL / kTwoShotSentinel name the
// two-shot kernel (reduce-scatter and all-gather of the sums inside each row
// segment; one row-wave, at most kRmsNormTwoShotUnits units a thread). Auto
// takes it on sentinel, where it serves, (a) in groups of at least
// kFusedTwoShotFromRanks for calls of at least kFusedTwoShotFromBytes of x
// per rank (N=8 virtual ranks, 8192 bf16: 16 tokens 10.3 vs 17.3 us one-shot
// sentinel; 8 tokens 8.31 vs 8.48 us, and with 8 processes the two-shot step
// was faster in three runs since the signature-lane fix of session 13: 13.95,
// 13.88, 14.16 vs 14.26-14.37, 14.97 us; 4 tokens 6.3 vs 5.9 us one-shot),
// and (b) for calls of at least
// kFusedSentinelFromBytes that neither decode-shape cut serves, instead of the
// general LL16 kernel (64 tokens: 9.9 vs 12.7 us at N=2, 15.0 vs 34.6 at N=4;
// 32 tokens at N=8: 17.1 vs 56 us). The values are the FFI attribute's
// (jaxll.algorithms.RMSNORM_PROTOCOL_CODES).
enum class RmsNormProtocol : int {
  kAuto = 0, kLL = 1, kSentinel = 2, kTwoShotLL = 3, kTwoShotSentinel = 4
};
constexpr int kRmsNormProtocolCount = 5;
// "auto", "ll", "sentinel", "twoshot_ll", "twoshot_sentinel" (null for an unknown code).
const char* rmsnorm_protocol_name(int code);
constexpr int64_t kFusedSentinelFromBytes = 64 * 1024;
constexpr int64_t kFusedSentinelFromRowBytes = 32 * 1024;
constexpr int kFusedSentinelAnySizeRanks = 2;
constexpr int kFusedTwoShotFromRanks = 8;
constexpr int64_t kFusedTwoShotFromBytes = 128 * 1024;
constexpr int kRmsNormTwoShotUnits = 2;
// Why protocol `p`, asked for, cannot serve a call that
// launch_all_reduce_rmsnorm refuses with cudaErrorNotSupported (its plan has
// no blocks): the one text that the FFI, the testing tools and Python's
// lowering (through the module) report. Auto and LL16 serve every call the
// kernel supports; their text says so.
const char* rmsnorm_refusal(RmsNormProtocol p);
// cudaErrorNotSupported when the protocol named cannot serve the call.
cudaError_t launch_all_reduce_rmsnorm(DType dtype, const RankView& view, const void* x,
                                      const void* residual, const void* weight, void* normed,
                                      void* new_residual, int64_t tokens, int64_t hidden,
                                      float eps, cudaStream_t stream,
                                      RmsNormProtocol protocol = RmsNormProtocol::kAuto);
// One rank's operands of the fused call (launch_all_reduce_rmsnorm's).
struct RmsNormOperands {
  const void* x;
  const void* residual;
  const void* weight;
  void* normed;
  void* new_residual;
};
// The fused call on every rank of a virtual group as one launch on `stream`
// (as launch_all_reduce_group does the all-reduce): ops[i] and views[i] are
// rank i's, n == views[i].nranks; the errors of launch_all_reduce_rmsnorm, and
// cudaErrorInvalidValue where the ranks' plans differ.
cudaError_t launch_all_reduce_rmsnorm_group(DType dtype, const RankView* views, int n,
                                            const RmsNormOperands* ops, int64_t tokens,
                                            int64_t hidden, float eps, cudaStream_t stream,
                                            RmsNormProtocol protocol = RmsNormProtocol::kAuto);
// Every kernel of the fused call (`group`: their group twins instead).
std::vector<const void*> rmsnorm_kernel_functions(bool group = false);
// How a call of the fused kernel is cut (what launch_all_reduce_rmsnorm does):
// rows of `segments` blocks of `threads` threads, `rows_at_once` rows at a time
// in `waves` row-waves, the S blocks of a row one thread-block cluster when
// `cluster` > 1; `slots`: the row's partial sums go through the header's
// tagged slots (the tag then advances by `waves`); spans count units of the
// plan's protocol (8 bytes LL16, 16 sentinel); `lean`: the decode-shape kernel
// runs it; `twoshot`: the two-shot kernel runs it. No plan (blocks 0) where the protocol asked for cannot serve.
struct RmsNormPlan {
  int64_t segments = 1, seg_span = 0, chunk_units = 0, rows_at_once = 1, blocks = 0, waves = 0;
  int threads = 0, cluster = 1, units = 1;  // (units: a two-shot thread's)
  bool slots = false, pdl = false, lean = false, twoshot = false;
  Proto proto = Proto::kLL;
};
RmsNormPlan plan_all_reduce_rmsnorm(DType dtype, const RankView& view, int64_t tokens,
                                    int64_t hidden,
                                    RmsNormProtocol protocol = RmsNormProtocol::kAuto);
// The plan's 4-bit code in the call signature's reduction field (ranks whose
// plans differ then report a mismatch instead of exchanging mismatched rows).
uint32_t rmsnorm_plan_code(const RmsNormPlan& plan);
// Its call signature's collective code is Collective::kRmsNorm (below); the
// signature's count field holds the shape, tokens in bits 20-39 and hidden in
// bits 0-19 (each modulo 2^20), so ranks that call with different shapes of one
// size are told apart.
constexpr uint64_t rmsnorm_signature_shape(int64_t tokens, int64_t hidden) {
  return (static_cast<uint64_t>(tokens) & 0xFFFFF) << 20 | (static_cast<uint64_t>(hidden) & 0xFFFFF);
}

// All-gather and reduce-scatter (gather_scatter.cu), on the one-shot path with
// the LL16 protocol (Algorithm::kOneShotLL) or the barrier baseline
// (kOneShotBarrier). `count` is the elements of one piece: all-gather takes
// `count` and writes nranks x `count` (rank r's piece at r x count); reduce-
// scatter takes nranks x `count` and writes `count` (this rank's piece of the
// sum, added in rank order). The collective is the call signature's code.
// (Python takes these codes from _jaxll.codes()["collectives"].)
enum class Collective : uint32_t { kAllReduce = 0, kRmsNorm = 1, kAllGather = 2, kReduceScatter = 3 };
bool has_gather_scatter_kernel(Collective c, Algorithm algorithm, DType dtype);
cudaError_t launch_gather_scatter(Collective c, Algorithm algorithm, DType dtype,
                                  const RankView& view, const void* in, void* out, int64_t count,
                                  cudaStream_t stream);
std::vector<const void*> gather_scatter_kernel_functions();

// Small helper kernels used by the runtime and the testing tools.

cudaError_t launch_fill_i32(int32_t* out, int32_t value, cudaStream_t stream);
// An empty kernel: the floor under any custom call that launches one.
cudaError_t launch_empty(cudaStream_t stream);

}  // namespace jaxll
