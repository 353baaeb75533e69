// How an all-reduce is cut into blocks and rounds, which kernel serves it, and its launch.
#include <algorithm>

#include "kernels/all_reduce.h"
#include "kernels/launch.h"

namespace jaxll {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up32(int64_t v) { return (v + 31) / 32 * 32; }

// One-shot blocks take at most this many units (4 warps, one per scheduler)
// until the grid reaches its bound: a small message then spreads over several
// SMs instead of queueing 16 warps' sends and polls on one (4 KiB at N=8 cost
// 1 us more than 8 B in one 512-thread block).
constexpr int64_t kOneShotBlockUnits = 128;

bool family_of(Algorithm a, Family* f, Proto* p) {
  switch (a) {
    case Algorithm::kOneShotLL: *f = Family::kOneShot, *p = Proto::kLL; return true;
    case Algorithm::kOneShotSentinel: *f = Family::kOneShot, *p = Proto::kSentinel; return true;
    case Algorithm::kTwoShotLL: *f = Family::kTwoShot, *p = Proto::kLL; return true;
    case Algorithm::kTwoShotSentinel: *f = Family::kTwoShot, *p = Proto::kSentinel; return true;
    case Algorithm::kTwoShotLL128Atomic: *f = Family::kTwoShotAtomic, *p = Proto::kSentinel; return true;
    case Algorithm::kOneShotBarrier: *f = Family::kOneShot, *p = Proto::kBarrier; return true;
    case Algorithm::kTwoShotBarrier: *f = Family::kTwoShot, *p = Proto::kBarrier; return true;
  }
  return false;
}

}  // namespace

LaunchPlan plan_all_reduce(Algorithm algorithm, int64_t count, int elem_bytes, int nranks,
                           const ScratchGeometry& geo, int max_blocks, bool signatures) {
  LaunchPlan plan;
  Family family;
  Proto proto;
  if (!family_of(algorithm, &family, &proto) || count <= 0 || elem_bytes <= 0 || nranks < 1 ||
      geo.region_bytes == 0 || max_blocks <= 0) {
    return plan;
  }
  const int64_t cap = std::min<int64_t>({max_blocks, kMaxBlocks, geo.blocks});
  int64_t units, per_region, target;
  if (family == Family::kTwoShotAtomic) {
    const int64_t per_line = kLineBytes / elem_bytes - 1;
    units = ceil_div(count, per_line);
    per_region = geo.region_bytes / kLineBytes;
    target = kBlockThreads / 8;  // one line per group of 8 threads
  } else {
    const int unit = proto == Proto::kLL ? 8 : 16;
    units = ceil_div(count * elem_bytes, unit);
    per_region = geo.region_bytes / unit;
    target = family == Family::kOneShot ? kOneShotBlockUnits : kBlockThreads;  // a unit a thread
  }
  const int64_t round_units = family == Family::kOneShot ? per_region : per_region * nranks;
  int64_t blocks = std::min(std::max<int64_t>(1, ceil_div(units, target)), cap);
  const int64_t span = ceil_div(units, blocks);
  blocks = ceil_div(units, span);  // so that no block is left without units
  const int64_t piece = std::min(span, round_units);
  int64_t work;
  if (family == Family::kOneShot) {
    work = piece;
  } else {
    const int64_t c = ceil_div(piece, nranks);
    work = std::max<int64_t>(c * std::max(nranks - 1, 1), 1);
    if (family == Family::kTwoShotAtomic) work = c * nranks * 8;
  }
  plan.blocks = static_cast<int>(blocks);
  // A spare warp where the block has room: its last n-1 threads check the
  // peers' call signatures (jaxll/round.cuh) beside the data path.
  const int64_t sig_warp = nranks > 1 && signatures ? 32 : 0;
  plan.threads = static_cast<int>(std::min<int64_t>(kBlockThreads, round_up32(work) + sig_warp));
  plan.units = units;
  plan.span = span;
  plan.round_units = round_units;
  plan.rounds = ceil_div(span, round_units);
  plan.last_rounds = ceil_div(units - (blocks - 1) * span, round_units);
  return plan;
}

const KernelTable& all_reduce_kernels() {
  static const KernelTable t = [] {
    KernelTable k;
    register_oneshot_kernels(k);
    register_twoshot_kernels(k);
    register_atomic_kernels(k);
    return k;
  }();
  return t;
}

bool has_kernel(Algorithm algorithm, DType dtype, ReduceOp op) {
  Family f;
  Proto p;
  return family_of(algorithm, &f, &p) && all_reduce_kernels().find(f, p, dtype, op, 0) != nullptr;
}

Status prepare_all_reduce(const KernelTable& table, Algorithm algorithm, DType dtype, ReduceOp op,
                          const RankView& view, const void* in, void* out, int64_t count,
                          PreparedAllReduce* call) {
  Family f;
  Proto p;
  if (!family_of(algorithm, &f, &p)) return Status::NoKernel();
  const KernelEntry* kernel = table.find(f, p, dtype, op, view.nranks);
  if (kernel == nullptr) return Status::NoKernel();
  call->fn = kernel->fn;
  call->plan = plan_all_reduce(algorithm, count, dtype_bytes(dtype), view.nranks, view.geo,
                               view.max_blocks, view.signatures != 0);
  if (call->plan.blocks == 0) return Status::NoPlan();
  const LaunchPlan& plan = call->plan;
  const bool pdl = launches_early(view, plan.blocks);
  call->args = AllReduceArgs{view, in, out, count, plan.units, plan.span, plan.round_units,
                             static_cast<uint32_t>(plan.rounds),
                             static_cast<uint32_t>(plan.last_rounds), pdl ? 1 : 0,
                             call_signature(algorithm, dtype, op, count)};
  return Status::Ok();
}

Status launch_all_reduce(Algorithm algorithm, DType dtype, ReduceOp op, const RankView& view,
                         const void* in, void* out, int64_t count, cudaStream_t stream) {
  PreparedAllReduce call;
  const Status s =
      prepare_all_reduce(all_reduce_kernels(), algorithm, dtype, op, view, in, out, count, &call);
  if (!s.ok()) return s;
  return launch_collective(call.fn, call.plan.blocks, call.plan.threads, call.args.trigger != 0,
                           &call.args, stream);
}

}  // namespace jaxll
