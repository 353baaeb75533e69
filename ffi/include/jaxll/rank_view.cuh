// Device-side helpers over a RankView (see rank_view.h): scratch regions,
// per-block epochs and LL16 waits.
#pragma once

#include <cstdint>

#include "jaxll/ll_packet.cuh"
#include "jaxll/memory_ops.cuh"
#include "jaxll/rank_view.h"
#include "jaxll/spin_wait.cuh"
#include "jaxll/workspace_layout.h"

namespace jaxll {

// Byte offset, inside any rank's workspace (the layout is symmetric), of the
// region [phase][block][parity][src] of the double-buffered area that starts at
// `area_offset` and whose regions are `region_stride` bytes apart. Sources are
// the innermost index: the region of source s is s * region_stride further.
__device__ __forceinline__ size_t region_offset(const RankView& v, size_t area_offset,
                                                size_t region_stride, int phase, int block,
                                                int parity, int src) {
  return area_offset + region_index(v.geo, phase, block, parity, src) * region_stride;
}

// The LL16 region on rank `owner` that receives data from rank `src` for block
// `block`, scratch phase `phase`, epoch parity `parity`.
__device__ __forceinline__ LL16* ll_region(const RankView& v, int owner, int phase, int block,
                                           int parity, int src) {
  LL16* area = reinterpret_cast<LL16*>(v.peers.base[owner] + v.geo.ll_offset);
  return area + region_index(v.geo, phase, block, parity, src) * (v.geo.region_bytes / 8);
}

// The signature slot on rank `owner` that rank `src` writes for `block` and `parity`.
__device__ __forceinline__ LL16* signature_slot(const RankView& v, int owner, int block,
                                                int parity, int src) {
  return reinterpret_cast<LL16*>(v.peers.base[owner] + v.geo.sig_offset) +
         signature_index(v.geo, block, parity, src);
}

// The sentinel region on rank `owner` (same indexing as ll_region).
__device__ __forceinline__ char* sentinel_region(const RankView& v, int owner, int phase,
                                                 int block, int parity, int src) {
  return v.peers.base[owner] + v.geo.sentinel_offset +
         region_index(v.geo, phase, block, parity, src) * v.geo.region_bytes;
}

// The plain (barrier-protected, single-buffered) region on rank `owner`.
__device__ __forceinline__ char* plain_region(const RankView& v, int owner, int phase, int block,
                                              int src) {
  const size_t idx = (static_cast<size_t>(phase) * v.geo.blocks + block) * v.geo.nranks + src;
  return v.peers.base[owner] + v.geo.plain_offset + idx * v.geo.region_bytes;
}

// The LL128-atomic accumulation lines on rank `owner` for `block` and `parity`.
__device__ __forceinline__ char* atomic_region(const RankView& v, int owner, int block,
                                               int parity) {
  return v.peers.base[owner] + v.geo.atomic_offset +
         (static_cast<size_t>(block) * 2 + parity) * v.geo.region_bytes;
}

// Barrier flag on rank `owner` that rank `src` raises for block `block`.
__device__ __forceinline__ uint32_t* barrier_flag(const RankView& v, int owner, int block,
                                                  int src) {
  return reinterpret_cast<uint32_t*>(v.peers.base[owner] + v.geo.flags_offset) +
         block * kMaxRanks + src;
}

// What a block learns when it starts: the epoch of its first round and whether
// the workspace already holds an error (then it must not communicate).
struct BlockStart {
  uint64_t epoch;  // epoch of the first round of this call
  int call_parity; // parity of the number of calls this block index served before
  bool had_error;
};

// Reserves `rounds` consecutive epochs for this block and counts the call as
// `calls_taken` signature exchanges (1: one at its start; a one-way collective that
// exchanges one every round passes `rounds`: round_signature_start, round.cuh);
// every thread of the block must call it. Thread 0 loads the error word, the
// epoch and the call count together (one memory round trip) and stores the
// advanced values at once; the block learns them through shared memory.
__device__ __forceinline__ BlockStart block_begin(const RankView& v, uint32_t rounds,
                                                  uint32_t calls_taken = 1) {
  __shared__ uint64_t s_epoch;
  __shared__ int s_parity;
  __shared__ int s_error;
  if (threadIdx.x == 0) {
    const unsigned long long err = *reinterpret_cast<volatile unsigned long long*>(&v.header->error);
    const uint64_t e = v.header->epochs[blockIdx.x];
    const uint32_t calls = v.header->calls[blockIdx.x];
    v.header->epochs[blockIdx.x] = e + rounds;
    v.header->calls[blockIdx.x] = calls + calls_taken;
    s_epoch = e + 1;
    s_parity = static_cast<int>(calls & 1);
    s_error = err != 0ull;
  }
  __syncthreads();
  return BlockStart{s_epoch, s_parity, s_error != 0};
}

// A block that learns its number of rounds as it goes (a ragged exchange
// learns it from its peers' first packets) calls block_begin(v, 0) at its
// start and this at its end, once it has used `rounds` epochs from bs.epoch:
// the next call on the workspace starts after this kernel has ended
// (collective_prologue), so it finds the epoch advanced. Thread 0 stores it.
__device__ __forceinline__ void block_end_rounds(const RankView& v, const BlockStart& bs,
                                                 uint32_t rounds) {
  if (threadIdx.x == 0) v.header->epochs[blockIdx.x] = bs.epoch - 1 + rounds;
}

// Peer k of this rank (k = 1..n-1), starting with the next rank so that ranks
// spread their first stores.
__device__ __forceinline__ int peer_at(int rank, int k, int n) {
  return rank + k < n ? rank + k : rank + k - n;
}

// LL16 only, at the epochs where ll16_refresh_due() holds: rewrites every slot
// this rank sends to at `parity` (both phases, every peer) with an old flag, so
// no 32-bit flag ages into aliasing. Every thread of the block must call it.
__device__ __forceinline__ void ll_refresh(const RankView& v, uint64_t epoch, int parity) {
  const uint32_t old_flag = static_cast<uint32_t>(epoch - 2);
  const int slots = v.geo.region_bytes / 8;
  for (int phase = 0; phase < kPhases; ++phase)
    for (int k = 1; k < v.nranks; ++k) {
      LL16* r = ll_region(v, peer_at(v.rank, k, v.nranks), phase, blockIdx.x, parity, v.rank);
      for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) ll16_store(r + s, 0ull, old_flag);
    }
  fence_sys();
  __syncthreads();
}

__device__ __forceinline__ WaitContext wait_context(const RankView& v, uint64_t epoch) {
  return WaitContext{&v.header->error, v.host_error, v.timeout_ns,
                     static_cast<uint32_t>(v.rank), blockIdx.x, static_cast<uint32_t>(epoch),
                     v.trap != 0};
}

// Waits until the LL16 packet at `slot` carries `flag`; returns its payload in
// `*payload`. False when the wait gave up (see bounded_wait).
__device__ __forceinline__ bool ll16_wait(const LL16* slot, uint32_t flag, const WaitContext& ctx,
                                          uint32_t peer, uint64_t* payload) {
  LL16Value v;
  const bool ok = bounded_wait(ctx, peer, [&] {
    v = ll16_load(slot);
    return ll16_ready(v, flag);
  });
  *payload = ll16_payload(v);
  return ok;
}

}  // namespace jaxll
