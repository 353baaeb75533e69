// Planning and dispatch of the all-reduce kernels.
#include "all_reduce.h"

#include <algorithm>
#include <string>

#include "all_reduce_common.cuh"
#include "all_reduce_kernels.h"

namespace jaxll {
namespace {

struct Shape {
  Family family;
  Proto proto;
};

bool shape_of(Algorithm a, Shape* s) {
  switch (a) {
    case Algorithm::kOneShotLL: *s = {Family::kOneShot, Proto::kLL}; return true;
    case Algorithm::kOneShotSentinel: *s = {Family::kOneShot, Proto::kSentinel}; return true;
    case Algorithm::kTwoShotLL: *s = {Family::kTwoShot, Proto::kLL}; return true;
    case Algorithm::kTwoShotSentinel: *s = {Family::kTwoShot, Proto::kSentinel}; return true;
    case Algorithm::kTwoShotLL128Atomic: *s = {Family::kTwoShotAtomic, Proto::kSentinel}; return true;
    case Algorithm::kOneShotBarrier: *s = {Family::kOneShot, Proto::kBarrier}; return true;
    case Algorithm::kTwoShotBarrier: *s = {Family::kTwoShot, Proto::kBarrier}; return true;
  }
  return false;
}

const KernelTable& table() {
  static const KernelTable t = [] {
    KernelTable k;
    register_oneshot_kernels(k);
    register_twoshot_kernels(k);
    register_atomic_kernels(k);
    return k;
  }();
  return t;
}

__global__ void fill_i32_kernel(int32_t* out, int32_t value) { *out = value; }

__global__ void empty_kernel() {}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int64_t kOneShotBlockUnits = 128;

int64_t round_up32(int64_t v) { return (v + 31) / 32 * 32; }

}  // namespace


LaunchPlan plan_all_reduce(Algorithm algorithm, int64_t count, int elem_bytes, int nranks,
                           const ScratchGeometry& geo, int max_blocks, bool signatures) {
  LaunchPlan plan;
  Shape s;
  if (!shape_of(algorithm, &s) || count <= 0 || elem_bytes <= 0 || nranks < 1 ||
      geo.region_bytes == 0 || max_blocks <= 0) {
    return plan;
  }
  const int64_t cap = std::min<int64_t>({max_blocks, kMaxBlocks, geo.blocks});
  int64_t units, per_region, target;
  if (s.family == Family::kTwoShotAtomic) {
    const int64_t per_line = kLineBytes / elem_bytes - 1;
    units = ceil_div(count, per_line);
    per_region = geo.region_bytes / kLineBytes;
    target = kBlockThreads / 8;  // one line per group of 8 threads
  } else {
    const int unit = s.proto == Proto::kLL ? 8 : 16;
    units = ceil_div(count * elem_bytes, unit);
    per_region = geo.region_bytes / unit;
    // One unit per thread. One-shot blocks take at most 128 units (4 warps, one
    // per scheduler) until the grid reaches its bound: a small message then
    // spreads over several SMs instead of queueing 16 warps' sends and polls
    // on one (4 KiB at N=8 cost 1 us more than 8 B in one 512-thread block).
    target = s.family == Family::kOneShot ? kOneShotBlockUnits : kBlockThreads;
  }
  const int64_t round_units = s.family == Family::kOneShot ? per_region : per_region * nranks;
  int64_t blocks = std::min(std::max<int64_t>(1, ceil_div(units, target)), cap);
  const int64_t span = ceil_div(units, blocks);
  blocks = ceil_div(units, span);  // so that no block is left without units
  const int64_t piece = std::min(span, round_units);
  int64_t work;
  if (s.family == Family::kOneShot) {
    work = piece;
  } else {
    const int64_t c = ceil_div(piece, nranks);
    work = std::max<int64_t>(c * std::max(nranks - 1, 1), 1);
    if (s.family == Family::kTwoShotAtomic) work = c * nranks * 8;
  }
  plan.blocks = static_cast<int>(blocks);
  // A spare warp where the block has room: its last n-1 threads check the
  // peers' call signatures (all_reduce_common.cuh) beside the data path.
  const int64_t sig_warp = nranks > 1 && signatures ? 32 : 0;
  plan.threads = static_cast<int>(std::min<int64_t>(kBlockThreads, round_up32(work) + sig_warp));
  plan.units = units;
  plan.span = span;
  plan.round_units = round_units;
  plan.rounds = ceil_div(span, round_units);
  plan.last_rounds = ceil_div(units - (blocks - 1) * span, round_units);
  return plan;
}

const std::vector<CodeName>& algorithm_codes() {
  static const std::vector<CodeName> t = {
      {"xla", 0},
      {"oneshot_ll", static_cast<int>(Algorithm::kOneShotLL)},
      {"oneshot_sentinel", static_cast<int>(Algorithm::kOneShotSentinel)},
      {"twoshot_ll", static_cast<int>(Algorithm::kTwoShotLL)},
      {"twoshot_sentinel", static_cast<int>(Algorithm::kTwoShotSentinel)},
      {"twoshot_ll128_atomic", static_cast<int>(Algorithm::kTwoShotLL128Atomic)},
      {"oneshot_barrier", static_cast<int>(Algorithm::kOneShotBarrier)},
      {"twoshot_barrier", static_cast<int>(Algorithm::kTwoShotBarrier)},
  };
  return t;
}

const std::vector<CodeName>& dtype_codes() {
  static const std::vector<CodeName> t = {{"float32", static_cast<int>(DType::kF32)},
                                          {"bfloat16", static_cast<int>(DType::kBF16)},
                                          {"float16", static_cast<int>(DType::kF16)},
                                          {"int32", static_cast<int>(DType::kI32)}};
  return t;
}

const std::vector<CodeName>& op_codes() {
  static const std::vector<CodeName> t = {{"sum", static_cast<int>(ReduceOp::kSum)},
                                          {"max", static_cast<int>(ReduceOp::kMax)},
                                          {"min", static_cast<int>(ReduceOp::kMin)}};
  return t;
}

std::string describe_signature(uint64_t sig) {
  const DecodedSignature d = decode_signature(sig);
  auto name = [](const std::vector<CodeName>& table, uint32_t code) {
    for (const CodeName& c : table) {
      if (static_cast<uint32_t>(c.code) == code) return std::string(c.name);
    }
    return "code " + std::to_string(code);
  };
  if (d.collective == static_cast<uint32_t>(Collective::kRmsNorm)) {
    return "all_reduce_rmsnorm of " + std::to_string(d.count >> 20) + " x " +
           std::to_string(d.count & 0xFFFFF) + " " + name(dtype_codes(), d.dtype) +
           " elements (tokens x hidden, modulo 2^20), algorithm fused, plan " +
           std::to_string(d.op) + " (the cut into blocks, which depends on the device)";
  }
  if (d.collective == static_cast<uint32_t>(Collective::kAllGather) ||
      d.collective == static_cast<uint32_t>(Collective::kReduceScatter)) {
    const bool gather = d.collective == static_cast<uint32_t>(Collective::kAllGather);
    return std::string(gather ? "all_gather" : "psum_scatter") + " of pieces of " +
           std::to_string(d.count) + " " + name(dtype_codes(), d.dtype) + " elements, algorithm " +
           name(algorithm_codes(), d.algorithm);
  }
  return std::string(d.collective == 0 ? "all_reduce" : "collective " + std::to_string(d.collective)) +
         " of " + std::to_string(d.count) + " " + name(dtype_codes(), d.dtype) + " elements, op " +
         name(op_codes(), d.op) + ", algorithm " + name(algorithm_codes(), d.algorithm);
}

uint64_t call_signature(Algorithm algorithm, DType dtype, ReduceOp op, int64_t count) {
  return encode_signature(0, static_cast<uint32_t>(algorithm), static_cast<uint32_t>(dtype),
                          static_cast<uint32_t>(op), count);
}

bool has_kernel(Algorithm algorithm, DType dtype, ReduceOp op) {
  Shape s;
  return shape_of(algorithm, &s) && table().find(s.family, s.proto, dtype, op, 0) != nullptr;
}

namespace {

// The kernel, plan and arguments of one rank's all-reduce; cudaErrorInvalidValue
// when there is no kernel for the combination or the plan is empty.
cudaError_t prepare_all_reduce(Algorithm algorithm, DType dtype, ReduceOp op,
                               const RankView& view, const void* in, void* out, int64_t count,
                               const KernelEntry** kernel, LaunchPlan* plan, AllReduceArgs* args) {
  Shape s;
  if (!shape_of(algorithm, &s)) return cudaErrorInvalidValue;
  *kernel = table().find(s.family, s.proto, dtype, op, view.nranks);
  if (*kernel == nullptr) return cudaErrorInvalidValue;
  *plan = plan_all_reduce(algorithm, count, dtype_bytes(dtype), view.nranks, view.geo,
                          view.max_blocks, view.signatures != 0);
  if (plan->blocks == 0) return cudaErrorInvalidValue;
  const bool pdl = launches_early(view, plan->blocks);
  *args = AllReduceArgs{view, in, out, count, plan->units, plan->span, plan->round_units,
                        static_cast<uint32_t>(plan->rounds), static_cast<uint32_t>(plan->last_rounds),
                        pdl ? 1 : 0, call_signature(algorithm, dtype, op, count)};
  return cudaSuccess;
}

}  // namespace

cudaError_t launch_all_reduce(Algorithm algorithm, DType dtype, ReduceOp op, const RankView& view,
                              const void* in, void* out, int64_t count, cudaStream_t stream) {
  const KernelEntry* kernel = nullptr;
  LaunchPlan plan;
  AllReduceArgs args;
  cudaError_t e = prepare_all_reduce(algorithm, dtype, op, view, in, out, count, &kernel, &plan, &args);
  if (e != cudaSuccess) return e;
  return launch_collective(kernel->fn, plan.blocks, plan.threads, args.trigger != 0, &args, stream);
}

cudaError_t launch_all_reduce_group(Algorithm algorithm, DType dtype, ReduceOp op,
                                    const RankView* views, int n, const void* const* in,
                                    void* const* out, int64_t count, cudaStream_t stream) {
  if (n < 1 || n > kMaxRanks || views[0].nranks != n) return cudaErrorInvalidValue;
  GroupArgs<AllReduceArgs> group{};
  const KernelEntry* kernel = nullptr;
  LaunchPlan plan;
  for (int i = 0; i < n; ++i) {
    const KernelEntry* k = nullptr;
    LaunchPlan p;
    cudaError_t e = prepare_all_reduce(algorithm, dtype, op, views[i], in[i], out[i], count, &k, &p,
                                       &group.rank[i]);
    if (e != cudaSuccess) return e;
    // (one grid for all: every rank's plan and kernel must be rank 0's)
    if (i > 0 && (k != kernel || p.blocks != plan.blocks || p.threads != plan.threads ||
                  group.rank[i].trigger != group.rank[0].trigger)) {
      return cudaErrorInvalidValue;
    }
    kernel = k;
    plan = p;
  }
  return launch_collective(kernel->group_fn, plan.blocks, plan.threads, group.rank[0].trigger != 0,
                           &group, stream, 1, n);
}

std::vector<const void*> all_kernel_functions() {
  std::vector<const void*> out;
  for (const KernelEntry& e : table().entries()) out.push_back(e.fn);
  for (const void* fn : rmsnorm_kernel_functions()) out.push_back(fn);
  for (const void* fn : gather_scatter_kernel_functions()) out.push_back(fn);
  out.push_back(reinterpret_cast<const void*>(&fill_i32_kernel));
  out.push_back(reinterpret_cast<const void*>(&empty_kernel));
  return out;
}

std::vector<const void*> group_kernel_functions() {
  std::vector<const void*> out;
  for (const KernelEntry& e : table().entries()) out.push_back(e.group_fn);
  for (const void* fn : rmsnorm_kernel_functions(true)) out.push_back(fn);
  return out;
}

cudaError_t launch_fill_i32(int32_t* out, int32_t value, cudaStream_t stream) {
  fill_i32_kernel<<<1, 1, 0, stream>>>(out, value);
  return cudaGetLastError();
}

cudaError_t launch_empty(cudaStream_t stream) {
  empty_kernel<<<1, 32, 0, stream>>>();
  return cudaGetLastError();
}

}  // namespace jaxll
