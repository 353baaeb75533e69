// LL16 packets: 8 bytes of payload that carry their own readiness.
//
// A packet is {data_lo, flag, data_hi, flag}, written by one aligned 16-byte
// relaxed system-scope store. The reader polls its local copy until both flag
// words equal the epoch it expects; since the flag travels in the same store as
// the data, no fence and no separate signal are needed, and because the epoch
// changes on every round the slot never has to be reset.
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

// LL flags are the low 32 bits of a block's 64-bit epoch. A slot last written
// exactly 2^32 epochs ago would look fresh, so a block rewrites every slot it
// sends to (of one parity) whenever 2^30 or more epochs have passed since it
// last did so for that parity (the epoch of the last rewrite is kept in the
// workspace header). True when that rewrite is due.
__device__ __forceinline__ bool ll16_refresh_due(uint64_t epoch, uint64_t last_refresh) {
  return epoch - last_refresh >= (1ull << 30);
}

}  // namespace jaxll
