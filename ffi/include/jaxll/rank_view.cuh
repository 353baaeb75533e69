// Device-side helpers over a RankView (see rank_view.h): scratch regions,
// per-block epochs and LL16 waits.
#pragma once

#include <cstdint>

#include "jaxll/ll_packet.cuh"
#include "jaxll/rank_view.h"
#include "jaxll/spin_wait.cuh"
#include "jaxll/workspace_layout.h"

namespace jaxll {

// The LL scratch region on rank `owner` that receives data from rank `src` for
// block `block` at epoch parity `parity`.
__device__ __forceinline__ LL16* ll_region(const RankView& v, int owner, int block, int parity,
                                           int src) {
  LL16* scratch = reinterpret_cast<LL16*>(v.peers.base[owner] + kScratchOffset);
  return scratch + ll_slot_index(block, parity, src, v.nranks, v.slots_per_block, 0);
}

// Advances this block's epoch and returns the new value; every thread of the
// block must call it. `*had_error` is set when the workspace already holds an
// error, in which case the caller must not communicate.
__device__ __forceinline__ uint32_t block_epoch_advance(const RankView& v, bool* had_error) {
  __shared__ uint32_t s_epoch;
  __shared__ int s_error;
  if (threadIdx.x == 0) {
    const uint32_t e = v.header->epochs[blockIdx.x] + 1u;
    v.header->epochs[blockIdx.x] = e;
    s_epoch = e;
    s_error = *reinterpret_cast<volatile unsigned long long*>(&v.header->error) != 0ull;
  }
  __syncthreads();
  *had_error = s_error != 0;
  return s_epoch;
}

__device__ __forceinline__ WaitContext wait_context(const RankView& v, uint32_t epoch) {
  return WaitContext{&v.header->error, v.host_error, v.timeout_ns,
                     static_cast<uint32_t>(v.rank), blockIdx.x, epoch};
}

// Waits until the LL16 packet at `slot` carries `flag`; returns its payload in
// `*payload`. False when the wait gave up (see bounded_wait).
__device__ __forceinline__ bool ll16_wait(const LL16* slot, uint32_t flag, const WaitContext& ctx,
                                          uint32_t peer, uint64_t* payload) {
  uint4 v;
  const bool ok = bounded_wait(ctx, peer, [&] {
    v = ll16_load(slot);
    return ll16_ready(v, flag);
  });
  *payload = ll16_payload(v);
  return ok;
}

}  // namespace jaxll
