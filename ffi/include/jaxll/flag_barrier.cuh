// An explicit cross-rank barrier of one block index, as most one-shot and
// two-shot kernels elsewhere are built: each rank raises a flag on every peer
// (release) and waits for every peer's flag (acquire). jaxll's own algorithms
// never use it; the barrier baselines do, so the benchmark shows what dropping
// it buys.
#pragma once

#include <cstdint>

#include "jaxll/memory_ops.cuh"
#include "jaxll/rank_view.cuh"
#include "jaxll/spin_wait.cuh"

namespace jaxll {

// Flag value of barrier `index` (0..3) in the round of `epoch`: grows with every
// barrier of a block, so a peer that already raised a later value passes too.
__device__ __forceinline__ uint32_t barrier_value(uint64_t epoch, int index) {
  return static_cast<uint32_t>(epoch * 4 + index);
}

// Every thread of the block must call it. Orders the block's earlier writes
// (including to peers) before every peer's later reads. False if a wait gave up.
__device__ inline bool flag_barrier(const RankView& v, uint32_t value, const WaitContext& ctx) {
  __syncthreads();
  bool ok = true;
  const int t = threadIdx.x;
  if (t < v.nranks && t != v.rank) {
    fence_sys();
    st_release_u32(barrier_flag(v, t, blockIdx.x, v.rank), value);
    const uint32_t* mine = barrier_flag(v, v.rank, blockIdx.x, t);
    ok = bounded_wait(ctx, static_cast<uint32_t>(t), [&] {
      return static_cast<int32_t>(ld_acquire_u32(mine) - value) >= 0;
    });
  }
  return __syncthreads_and(ok) != 0;
}

}  // namespace jaxll
