// How a fused all-reduce + residual + RMSNorm call is cut (rmsnorm.h), and its
// argument block.
//
// Rows (tokens) are cut into S segments of about kSegmentUnits units, and each
// block owns one segment of one row per row-wave: block b takes segment b % S
// of rows b / S, b / S + W, ... (W = blocks / S rows at once), so a decode
// step's few rows spread over as many SMs as the one-shot all-reduce would
// use; many rows go a whole row per block in several row-waves. Rows split
// over blocks combine their partial sums of squares in a cluster where the
// device launches clusters and holds every rank's at once, else through the
// header's slots.
//
// The row's sum of squares takes one order whatever the cut (square_tree.cuh):
// a row split over blocks is split into segments of a power-of-two number of
// units, and a segment that takes several rounds into rounds of a power-of-two
// number of units (a round of more units than threads then has 512 threads,
// so its passes are of 512 units).
#include <algorithm>

#include "jaxll/error_word.h"
#include "kernels/launch.h"
#include "kernels/rmsnorm_args.h"
#include "kernels/square_tree.cuh"

namespace jaxll {
namespace {

// Units a block's segment aims at (the one-shot all-reduce's block size).
constexpr int64_t kSegmentUnits = 128;

// The smallest power of two >= v (v >= 1).
int64_t pow2_at_least(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

// The largest power of two <= v (v >= 1).
int64_t pow2_at_most(int64_t v) {
  int64_t p = 1;
  while (2 * p <= v) p *= 2;
  return p;
}

// The cut for `s` segments a row, as many rows at once as `cap` blocks allow.
RmsNormPlan shape(int64_t s, int64_t row_units, int64_t tokens, int64_t cap, int unit,
                  const RankView& view) {
  const int64_t sig_warp = view.nranks > 1 && view.signatures ? 32 : 0;
  RmsNormPlan p;
  p.seg_span = (row_units + s - 1) / s;
  // (segments: nodes of the row's tree of squares)
  if (kFixedOrderNorm && p.seg_span < row_units) p.seg_span = pow2_at_least(p.seg_span);
  p.segments = (row_units + p.seg_span - 1) / p.seg_span;  // no segment left empty
  p.rows_at_once = std::max<int64_t>(1, std::min<int64_t>(tokens, cap / p.segments));
  p.chunk_units = std::min<int64_t>(p.seg_span, view.geo.region_bytes / unit);
  if (kFixedOrderNorm && p.chunk_units < p.seg_span) p.chunk_units = pow2_at_most(p.chunk_units);
  const int64_t work = std::min<int64_t>(p.chunk_units, kBlockThreads);
  p.threads = static_cast<int>(std::min<int64_t>(kBlockThreads, ((work + 31) / 32) * 32 + sig_warp));
  return p;
}

// The rest of the plan for a cut `p`: rows split over blocks go as one cluster
// per row where the device launches clusters and holds every rank's at once
// (at most kClusterSegments blocks a row), else through the header's slots;
// then the grid, its row-waves and whether it launches early.
RmsNormPlan finish(RmsNormPlan p, const void* fn, int64_t row_units, int64_t tokens, int64_t cap,
                   int unit, const RankView& view) {
  int64_t allowed = 0;
  if (p.segments > 1) {
    const RmsNormPlan c = shape(std::min<int64_t>(p.segments, kClusterSegments), row_units, tokens,
                                cap, unit, view);
    if (c.segments > 1) {
      allowed = cluster_allowance(fn, static_cast<int>(c.segments), c.threads, view);
      // (only where the rank may hold a cluster for every row of the wave: fewer
      // rows at once would cost row-waves the slot path does not need)
      if (allowed >= c.rows_at_once) {
        p = c;
        p.cluster = static_cast<int>(p.segments);
      }
    }
  }
  p.blocks = p.segments * p.rows_at_once;
  p.waves = (tokens + p.rows_at_once - 1) / p.rows_at_once;
  p.slots = p.segments > 1 && p.cluster == 1;
  // PDL lets two of this rank's grids be resident: for clusters, only where
  // twice the grid's clusters stay within the rank's share too.
  p.pdl = launches_early(view, p.blocks) && (p.cluster == 1 || 2 * p.rows_at_once <= allowed);
  return p;
}

// The cut of a call into units of `unit` bytes (8: LL16, 16: sentinel).
RmsNormPlan plan_cut(DType dtype, const RankView& view, int64_t tokens, int64_t hidden, int unit) {
  const void* fn = rmsnorm_reference_kernel(dtype);
  if (fn == nullptr || tokens <= 0 || hidden <= 0) return RmsNormPlan{};
  const int64_t row_units = hidden * dtype_bytes(dtype) / unit;
  // The grid the one-shot all-reduce would take for the whole message (a block
  // per kSegmentUnits units, up to the bound); few rows are cut into segments
  // to fill it, many rows go a whole row per block in several row-waves.
  const int64_t cap = std::min<int64_t>({view.max_blocks, view.geo.blocks, kMaxBlocks});
  const int64_t target =
      std::min<int64_t>(cap, (tokens * row_units + kSegmentUnits - 1) / kSegmentUnits);
  int64_t segments = 1;
  if (tokens < target) {
    segments = std::min<int64_t>((row_units + kSegmentUnits - 1) / kSegmentUnits, target / tokens);
    segments = std::max<int64_t>(segments, 1);
  }
  RmsNormPlan plan =
      finish(shape(segments, row_units, tokens, cap, unit, view), fn, row_units, tokens, cap, unit, view);
  // A grid of more than half the rank's bound does not launch early, and the
  // next call then starts only when this one has ended (N=8 on one H200, 4 rows
  // of 8192 bf16: 32 blocks of 128 sentinel units, 6.8 us a call; 16 blocks of
  // 256 that launch early, 5.9 us). Where one row-wave takes every row and
  // fewer, longer segments still leave a unit a thread and the signature warp
  // spare (and one round moves a segment), the cut takes as many segments a
  // row as keep the grid within half the bound, if that grid then launches early.
  const int64_t sig_warp = view.nranks > 1 && view.signatures ? 32 : 0;
  if (!plan.pdl && view.pdl && plan.waves == 1) {
    const int64_t s = view.max_blocks / 2 / tokens;
    if (s >= 1 && s < plan.segments) {
      const RmsNormPlan c =
          finish(shape(s, row_units, tokens, cap, unit, view), fn, row_units, tokens, cap, unit, view);
      if (c.pdl && c.waves == 1 && c.chunk_units >= c.seg_span && c.segments < plan.segments &&
          c.seg_span + sig_warp <= kBlockThreads) {
        plan = c;
      }
    }
  }
  return plan;
}

// Whether a plan's cut is the decode shape: one row-wave, one round a
// segment, at most one unit a thread.
bool lean_plan(const RmsNormPlan& p) {
  return p.blocks > 0 && p.waves == 1 && p.chunk_units >= p.seg_span && p.seg_span <= p.threads;
}

// The sentinel exchange's cut, where the decode-shape kernel can take it (a
// row's bytes a multiple of 16, one round, a unit a thread); else no plan.
RmsNormPlan sentinel_cut(DType dtype, const RankView& view, int64_t tokens, int64_t hidden) {
  if ((hidden * dtype_bytes(dtype)) % 16 != 0) return RmsNormPlan{};
  RmsNormPlan p = plan_cut(dtype, view, tokens, hidden, 16);
  if (!lean_plan(p)) return RmsNormPlan{};
  p.proto = Proto::kSentinel;
  p.lean = true;
  return p;
}

// The two-shot kernel's cut on protocol `proto`, where it can take it (a row's
// bytes a multiple of the unit, one row-wave, an owner's chunk within a
// region, at most kRmsNormTwoShotUnits units a thread); else no plan.
RmsNormPlan twoshot_cut(DType dtype, const RankView& view, int64_t tokens, int64_t hidden,
                        Proto proto) {
  const int unit = proto == Proto::kSentinel ? 16 : 8;
  if ((hidden * dtype_bytes(dtype)) % unit != 0) return RmsNormPlan{};
  RmsNormPlan p = plan_cut(dtype, view, tokens, hidden, unit);
  if (p.blocks == 0 || p.waves != 1) return RmsNormPlan{};
  const int64_t n = view.nranks;
  const int64_t c = (p.seg_span + n - 1) / n;
  if (c * unit > view.geo.region_bytes || n * c > int64_t{kRmsNormTwoShotUnits} * p.threads) {
    return RmsNormPlan{};
  }
  p.proto = proto;
  p.twoshot = true;
  // (two units a thread: two passes, of kBlockThreads units each, so that
  // each is a node of the row's tree of squares)
  if (kFixedOrderNorm && n * c > p.threads) p.threads = kBlockThreads;
  p.units = n * c > p.threads ? kRmsNormTwoShotUnits : 1;
  return p;
}

}  // namespace

const char* rmsnorm_protocol_name(int code) {
  switch (static_cast<RmsNormProtocol>(code)) {
    case RmsNormProtocol::kLL: return "ll";
    case RmsNormProtocol::kSentinel: return "sentinel";
    case RmsNormProtocol::kTwoShotLL: return "twoshot_ll";
    case RmsNormProtocol::kTwoShotSentinel: return "twoshot_sentinel";
  }
  return nullptr;
}

const char* rmsnorm_refusal(RmsNormProtocol p) {
  switch (p) {
    case RmsNormProtocol::kSentinel:
      return "sentinel needs rows whose bytes are a multiple of 16 and a call that the "
             "decode-shape kernel moves in one round, a 16-byte unit a thread";
    case RmsNormProtocol::kTwoShotLL:
      return "twoshot_ll needs a call of one row-wave of the kernel's cut, at most 2 units a "
             "thread, an owner's chunk within a scratch region";
    case RmsNormProtocol::kTwoShotSentinel:
      return "twoshot_sentinel needs rows whose bytes are a multiple of 16 and a call of one "
             "row-wave of the kernel's cut, at most 2 units a thread, an owner's chunk within a "
             "scratch region";
    case RmsNormProtocol::kLL: break;
  }
  return "ll serves every call the kernels support";
}

const char* rmsnorm_unsupported(DType dtype, int64_t hidden, const RankView& view) {
  if (rmsnorm_reference_kernel(dtype) == nullptr) return "element type (float32, bfloat16, float16)";
  if (hidden <= 0 || (hidden * dtype_bytes(dtype)) % 8 != 0) {
    return "hidden size (its bytes must be a multiple of 8)";
  }
  if (view.geo.region_bytes < 8 || view.max_blocks < 1) return "workspace geometry";
  return nullptr;
}

uint32_t rmsnorm_plan_code(const RmsNormPlan& p) {
  // 4 bits: whether clustered, and the segments and rows at once folded in
  const uint64_t h = static_cast<uint64_t>(p.segments) * 131 +
                     static_cast<uint64_t>(p.rows_at_once) * 7 + (p.cluster > 1 ? 1 : 0);
  return static_cast<uint32_t>(h % 15);
}

RmsNormPlan plan_all_reduce_rmsnorm(DType dtype, const RankView& view, int64_t tokens,
                                    int64_t hidden, RmsNormProtocol protocol) {
  switch (protocol) {
    case RmsNormProtocol::kSentinel: return sentinel_cut(dtype, view, tokens, hidden);
    case RmsNormProtocol::kTwoShotLL: return twoshot_cut(dtype, view, tokens, hidden, Proto::kLL);
    case RmsNormProtocol::kTwoShotSentinel:
      return twoshot_cut(dtype, view, tokens, hidden, Proto::kSentinel);
    case RmsNormProtocol::kLL: break;
  }
  RmsNormPlan p = plan_cut(dtype, view, tokens, hidden, 8);
  p.lean = lean_plan(p);
  return p;
}

Status prepare_all_reduce_rmsnorm(DType dtype, const RankView& view, const void* x,
                                  const void* residual, const void* weight, void* normed,
                                  void* new_residual, int64_t tokens, int64_t hidden, float eps,
                                  RmsNormProtocol protocol, PreparedRmsNorm* call) {
  if (rmsnorm_protocol_name(static_cast<int>(protocol)) == nullptr ||
      rmsnorm_unsupported(dtype, hidden, view) != nullptr) {
    return Status::NoKernel();
  }
  if (tokens <= 0) return Status::NoPlan();
  const RmsNormPlan plan = plan_all_reduce_rmsnorm(dtype, view, tokens, hidden, protocol);
  if (plan.blocks == 0) return Status::Refused();
  call->plan = plan;
  RmsNormArgs& a = call->args;
  a = RmsNormArgs{};
  a.base.view = view;
  a.x = x;
  a.residual = residual;
  a.weight = weight;
  a.normed = normed;
  a.new_residual = new_residual;
  a.tokens = tokens;
  a.hidden = hidden;
  a.row_units = hidden * dtype_bytes(dtype) / (plan.proto == Proto::kSentinel ? 16 : 8);
  a.eps = eps;
  a.seg_span = plan.seg_span;
  a.segments = static_cast<int>(plan.segments);
  a.waves = static_cast<int>(plan.waves);
  a.chunk_units = plan.chunk_units;
  a.clustered = plan.cluster > 1 ? 1 : 0;
  a.base.in = x;
  a.base.count = tokens * hidden;
  a.base.round_units = plan.chunk_units;
  a.base.trigger = plan.pdl ? 1 : 0;
  // The plan rides in the signature's reduction field: it depends on device
  // queries (cluster support and capacity), so ranks on unlike devices could
  // cut a call differently; that must be a reported mismatch, never a wrong row.
  const Algorithm exchange =
      plan.twoshot ? (plan.proto == Proto::kSentinel ? Algorithm::kTwoShotSentinel : Algorithm::kTwoShotLL)
                   : (plan.proto == Proto::kSentinel ? Algorithm::kOneShotSentinel : Algorithm::kOneShotLL);
  a.base.signature = encode_signature(static_cast<uint32_t>(Collective::kRmsNorm),
                                      static_cast<uint32_t>(exchange), static_cast<uint32_t>(dtype),
                                      rmsnorm_plan_code(plan), rmsnorm_signature_shape(tokens, hidden));
  return Status::Ok();
}

}  // namespace jaxll
