// LL16 packets: 8 bytes of payload that carry their own readiness.
//
// A packet is {data_lo, flag, data_hi, flag}, written by one aligned 16-byte
// relaxed system-scope store. The reader polls its local copy until both flag
// words equal the epoch it expects; since the flag travels in the same store as
// the data, no fence and no separate signal are needed, and because the epoch
// changes on every call the slot never has to be reset.
#pragma once

#include <cstdint>

#include "jaxll/workspace_layout.h"

namespace jaxll {

struct alignas(16) LL16 {
  uint32_t data_lo;
  uint32_t flag0;
  uint32_t data_hi;
  uint32_t flag1;
};
static_assert(sizeof(LL16) == kLLPacketBytes, "LL16 must be 16 bytes");

// Writes `payload` with `flag` into `dst` (local or a peer's memory) in one store.
__device__ __forceinline__ void ll16_store(LL16* dst, uint64_t payload, uint32_t flag) {
  asm volatile("st.relaxed.sys.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst),
               "r"(static_cast<uint32_t>(payload)), "r"(flag),
               "r"(static_cast<uint32_t>(payload >> 32)), "r"(flag)
               : "memory");
}

// Reads a packet in one 16-byte load.
__device__ __forceinline__ uint4 ll16_load(const LL16* src) {
  uint4 v;
  asm volatile("ld.relaxed.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(src)
               : "memory");
  return v;
}

// True when both flag words of a loaded packet equal `flag`.
__device__ __forceinline__ bool ll16_ready(uint4 v, uint32_t flag) {
  return v.y == flag && v.w == flag;
}

__device__ __forceinline__ uint64_t ll16_payload(uint4 v) {
  return static_cast<uint64_t>(v.x) | (static_cast<uint64_t>(v.z) << 32);
}

// LL flags are 32-bit epochs. A slot that was last written exactly 2^32 epochs
// ago would look fresh, so every 2^30 epochs (at two consecutive epochs, one per
// parity) a block rewrites every slot of its regions. This returns true at
// those epochs.
__device__ __forceinline__ bool ll16_refresh_epoch(uint32_t epoch) {
  return (epoch & 0x3FFFFFFEu) == 0;
}

}  // namespace jaxll
