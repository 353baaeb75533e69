// Transfer units: the pieces a message moves in (8 bytes for LL16, 16 bytes
// for the sentinel protocol and plain stores), loaded from and stored to a
// message of elements, and reduced in rank order.
#pragma once

#include <cstdint>

#include "jaxll/elements.cuh"
#include "jaxll/protocol.h"

namespace jaxll {

// Bytes per transfer unit of a protocol.
template <Proto P>
__host__ __device__ constexpr int unit_bytes() {
  return P == Proto::kLL ? 8 : 16;
}

// A transfer unit's payload: W/8 raw 8-byte packets.
template <int W>
struct Unit {
  uint64_t p[W / 8];
};

// Loads unit `u` of `x` (elements past `count` read as zero bits).
template <class T, int W>
__device__ __forceinline__ Unit<W> load_unit(const T* x, int64_t u, int64_t count, bool vec) {
  Unit<W> r;
  constexpr int E = W / static_cast<int>(sizeof(T));
  if constexpr (W == 16) {
    if (vec && (u + 1) * E <= count) {
      const uint4 q = *reinterpret_cast<const uint4*>(x + u * E);
      r.p[0] = static_cast<uint64_t>(q.x) | static_cast<uint64_t>(q.y) << 32;
      r.p[1] = static_cast<uint64_t>(q.z) | static_cast<uint64_t>(q.w) << 32;
      return r;
    }
  }
#pragma unroll
  for (int k = 0; k < W / 8; ++k) r.p[k] = load_packet(x, u * (W / 8) + k, count, vec);
  return r;
}

template <class T, int W>
__device__ __forceinline__ void store_unit(T* y, int64_t u, int64_t count, bool vec,
                                           const Unit<W>& v) {
  constexpr int E = W / static_cast<int>(sizeof(T));
  if constexpr (W == 16) {
    if (vec && (u + 1) * E <= count) {
      *reinterpret_cast<uint4*>(y + u * E) =
          make_uint4(static_cast<uint32_t>(v.p[0]), static_cast<uint32_t>(v.p[0] >> 32),
                     static_cast<uint32_t>(v.p[1]), static_cast<uint32_t>(v.p[1] >> 32));
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < W / 8; ++k) store_packet(y, u * (W / 8) + k, count, vec, v.p[k]);
}

template <int W>
__device__ __forceinline__ Unit<W> poison_unit() {
  Unit<W> r;
#pragma unroll
  for (int k = 0; k < W / 8; ++k) r.p[k] = ~0ull;
  return r;
}

// Reduction of units in rank order.
template <class T, class Op, int W>
struct UnitAcc {
  PacketAcc<T, Op> acc[W / 8];
  __device__ __forceinline__ void init(const Unit<W>& v) {
#pragma unroll
    for (int k = 0; k < W / 8; ++k) acc[k].init(v.p[k]);
  }
  __device__ __forceinline__ void add(const Unit<W>& v) {
#pragma unroll
    for (int k = 0; k < W / 8; ++k) acc[k].add(v.p[k]);
  }
  __device__ __forceinline__ Unit<W> result() const {
    Unit<W> r;
#pragma unroll
    for (int k = 0; k < W / 8; ++k) r.p[k] = acc[k].result();
    return r;
  }
};

}  // namespace jaxll
