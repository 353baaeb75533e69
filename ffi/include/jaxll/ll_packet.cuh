// LL16 packets: 8 bytes of payload that carry their own readiness.
//
// A packet is two 8-byte words {data_lo | flag << 32, data_hi | flag << 32},
// written by one aligned 16-byte relaxed system-scope store. The reader polls
// its local copy until the flag half of both words equals the epoch it
// expects. Each word is accessed as one aligned 64-bit element
// (`st/ld.relaxed.sys.v2.u64`), which the PTX memory model makes single-copy
// atomic, so a word whose flag is current also carries that round's data half:
// the two-flag check is sufficient, with no fence and no separate signal, and
// because the epoch changes on every round the slot never has to be reset.
#pragma once

#include <cstdint>

#include "jaxll/workspace_layout.h"

namespace jaxll {

struct alignas(16) LL16 {
  uint64_t lo;  // data bits 0-31 | flag << 32
  uint64_t hi;  // data bits 32-63 | flag << 32
};
static_assert(sizeof(LL16) == kLLPacketBytes, "LL16 must be 16 bytes");

// A packet as loaded: both words.
struct LL16Value {
  uint64_t lo, hi;
};

// Writes `payload` with `flag` into `dst` (local or a peer's memory) in one store.
__device__ __forceinline__ void ll16_store(LL16* dst, uint64_t payload, uint32_t flag) {
  const uint64_t f = static_cast<uint64_t>(flag) << 32;
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(dst),
               "l"((payload & 0xFFFFFFFFull) | f), "l"((payload >> 32) | f)
               : "memory");
}

// Writes a packet whose two flags differ: it is ready for no epoch.
__device__ __forceinline__ void ll16_store_never_ready(LL16* dst) {
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(dst), "l"(0ull),
               "l"(1ull << 32)
               : "memory");
}

// Reads a packet in one 16-byte load.
__device__ __forceinline__ LL16Value ll16_load(const LL16* src) {
  LL16Value v;
  asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(v.lo), "=l"(v.hi)
               : "l"(src)
               : "memory");
  return v;
}

// True when both words of a loaded packet carry `flag`.
__device__ __forceinline__ bool ll16_ready(LL16Value v, uint32_t flag) {
  return static_cast<uint32_t>(v.lo >> 32) == flag && static_cast<uint32_t>(v.hi >> 32) == flag;
}

__device__ __forceinline__ uint64_t ll16_payload(LL16Value v) {
  return (v.lo & 0xFFFFFFFFull) | (v.hi << 32);
}

// LL flags are the low 32 bits of a block's 64-bit epoch, and a slot last
// written exactly 2^32 epochs ago would look fresh. A block index runs every
// epoch in turn (epochs only grow, one per round), so it rewrites every slot it
// sends to, of the parity at hand, with an old flag at the first epoch of each
// parity in every window of 2^30 epochs: no slot is ever older than about 2^30
// epochs. True at those epochs (decided from the epoch alone, no state).
__device__ __forceinline__ bool ll16_refresh_due(uint64_t epoch) {
  return (epoch & (kLLRefreshEpochs - 1)) < 2;
}

}  // namespace jaxll
