// One-shot LL all-reduce: every rank pushes its whole input to every peer as LL16
// packets, then reduces the N contributions from its local scratch.
//
// Block b of every rank handles the same packet range and owns its own scratch
// regions and epoch counter, so the protocol is per block: one synchronisation
// (the data itself), no barrier. Scratch regions alternate by epoch parity:
// receiving a peer's packets of epoch e proves that peer finished epoch e-1 of
// this block, so the region of parity e+1 is free when this rank gets there.
#include <algorithm>

#include "all_reduce.h"
#include "jaxll/jaxll.cuh"

namespace jaxll {
namespace {

struct OneShotArgs {
  RankView view;
  const void* in;
  void* out;
  int64_t count;
};

template <class T, class Op>
__global__ void __launch_bounds__(kBlockThreads) oneshot_ll_kernel(OneShotArgs a) {
  constexpr int E = elems_per_packet<T>();
  bool had_error;
  const uint32_t epoch = block_epoch_advance(a.view, &had_error);
  const int parity = static_cast<int>(epoch & 1u);
  const int rank = a.view.rank;
  const int n = a.view.nranks;

  const int64_t packets = (a.count + E - 1) / E;
  const int64_t per_block = (packets + gridDim.x - 1) / gridDim.x;
  const int64_t p0 = min(packets, static_cast<int64_t>(blockIdx.x) * per_block);
  const int64_t p1 = min(packets, p0 + per_block);
  const T* x = static_cast<const T*>(a.in);
  T* y = static_cast<T*>(a.out);
  const bool vec = ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y)) & 7u) == 0;

  if (had_error) {
    // An earlier call of this rank timed out: the peers are out of step, so do not
    // communicate; poison the output (all-ones bits, NaN for floats) and leave.
    for (int64_t i = p0 + threadIdx.x; i < p1; i += blockDim.x)
      store_packet(y, i, a.count, vec, ~0ull);
    return;
  }

  // Push this block's packets into every peer's scratch, starting with the next
  // rank so that ranks spread their first stores over different peers.
  for (int64_t i = p0 + threadIdx.x; i < p1; i += blockDim.x) {
    const uint64_t v = load_packet(x, i, a.count, vec);
    for (int k = 1; k < n; ++k) {
      const int peer = rank + k < n ? rank + k : rank + k - n;
      ll16_store(ll_region(a.view, peer, blockIdx.x, parity, rank) + (i - p0), v, epoch);
    }
  }
  if (ll16_refresh_epoch(epoch)) {
    // Rewrite the unused tail of the regions too, so no slot's flag ages past 2^31.
    for (int64_t s = (p1 - p0) + threadIdx.x; s < a.view.slots_per_block; s += blockDim.x) {
      for (int k = 1; k < n; ++k) {
        const int peer = rank + k < n ? rank + k : rank + k - n;
        ll16_store(ll_region(a.view, peer, blockIdx.x, parity, rank) + s, 0ull, epoch);
      }
    }
  }

  // Reduce in rank order 0..n-1 from the local scratch (own data from the input).
  const WaitContext ctx = wait_context(a.view, epoch);
  for (int64_t i = p0 + threadIdx.x; i < p1; i += blockDim.x) {
    PacketAcc<T, Op> acc;
    bool ok = true;
    for (int src = 0; src < n && ok; ++src) {
      uint64_t v;
      if (src == rank) {
        v = load_packet(x, i, a.count, vec);
      } else {
        ok = ll16_wait(ll_region(a.view, rank, blockIdx.x, parity, src) + (i - p0), epoch, ctx,
                       static_cast<uint32_t>(src), &v);
      }
      if (src == 0) acc.init(v); else acc.add(v);
    }
    store_packet(y, i, a.count, vec, ok ? acc.result() : ~0ull);
  }
}

__global__ void fill_i32_kernel(int32_t* out, int32_t value) { *out = value; }

__global__ void empty_kernel() {}

template <class T, class Op>
cudaError_t launch_oneshot_ll(const OneShotArgs& args, LaunchPlan plan, cudaStream_t stream) {
  oneshot_ll_kernel<T, Op><<<plan.blocks, plan.threads, 0, stream>>>(args);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_oneshot_ll_op(ReduceOp op, const OneShotArgs& args, LaunchPlan plan,
                                 cudaStream_t stream) {
  switch (op) {
    case ReduceOp::kSum: return launch_oneshot_ll<T, SumOp>(args, plan, stream);
    case ReduceOp::kMax: return launch_oneshot_ll<T, MaxOp>(args, plan, stream);
    case ReduceOp::kMin: return launch_oneshot_ll<T, MinOp>(args, plan, stream);
  }
  return cudaErrorInvalidValue;
}

template <class T>
void append_kernels(std::vector<const void*>& out) {
  out.push_back(reinterpret_cast<const void*>(&oneshot_ll_kernel<T, SumOp>));
  out.push_back(reinterpret_cast<const void*>(&oneshot_ll_kernel<T, MaxOp>));
  out.push_back(reinterpret_cast<const void*>(&oneshot_ll_kernel<T, MinOp>));
}

}  // namespace

int dtype_bytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kI32: return 4;
  }
  return 0;
}

LaunchPlan plan_oneshot_ll(int64_t count, int elem_bytes, uint32_t slots_per_block,
                           int max_blocks) {
  LaunchPlan plan;
  if (count <= 0 || elem_bytes <= 0 || slots_per_block == 0 || max_blocks <= 0) return plan;
  const int64_t per_packet = kLLPayloadBytes / elem_bytes;
  const int64_t packets = (count + per_packet - 1) / per_packet;
  const int64_t min_blocks = (packets + slots_per_block - 1) / slots_per_block;
  const int64_t cap = std::min<int64_t>(max_blocks, kMaxBlocks);
  if (min_blocks > cap) return plan;
  // One packet per thread where the grid allows it.
  int64_t blocks = (packets + kBlockThreads - 1) / kBlockThreads;
  blocks = std::min(std::max(blocks, min_blocks), cap);
  plan.blocks = static_cast<int>(blocks);
  plan.threads = blocks == 1 ? static_cast<int>(std::min<int64_t>(kBlockThreads, (packets + 31) / 32 * 32))
                             : kBlockThreads;
  return plan;
}

cudaError_t launch_all_reduce(Algorithm algorithm, DType dtype, ReduceOp op, const RankView& view,
                              const void* in, void* out, int64_t count, cudaStream_t stream) {
  if (algorithm != Algorithm::kOneShotLL) return cudaErrorInvalidValue;
  const LaunchPlan plan =
      plan_oneshot_ll(count, dtype_bytes(dtype), view.slots_per_block, view.max_blocks);
  if (plan.blocks == 0) return cudaErrorInvalidValue;
  const OneShotArgs args{view, in, out, count};
  switch (dtype) {
    case DType::kF32: return launch_oneshot_ll_op<float>(op, args, plan, stream);
    case DType::kBF16: return launch_oneshot_ll_op<__nv_bfloat16>(op, args, plan, stream);
    case DType::kF16: return launch_oneshot_ll_op<__half>(op, args, plan, stream);
    case DType::kI32: return launch_oneshot_ll_op<int32_t>(op, args, plan, stream);
  }
  return cudaErrorInvalidValue;
}

std::vector<const void*> all_kernel_functions() {
  std::vector<const void*> out;
  append_kernels<float>(out);
  append_kernels<__nv_bfloat16>(out);
  append_kernels<__half>(out);
  append_kernels<int32_t>(out);
  out.push_back(reinterpret_cast<const void*>(&fill_i32_kernel));
  out.push_back(reinterpret_cast<const void*>(&empty_kernel));
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
