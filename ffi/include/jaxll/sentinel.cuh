// The sentinel ("poison") protocol: scratch that holds a bit pattern valid data
// never carries, so the data itself signals its arrival.
//
// Sentinel scratch is filled with all-ones bits when the workspace is built (for
// f32, f16 and bf16 that is a NaN no arithmetic produces: GPUs return the
// canonical NaN). A sender rewrites input elements whose bits equal the pattern
// to the canonical quiet NaN (bits, not values: -0.0 and 0.0 differ), then
// stores the data directly, at full bandwidth. The receiver polls until no
// element of a word equals the pattern, then writes the pattern back so the
// slot is ready for its next use. That reset must be visible before the
// receiver's later sends let a peer reuse the slot: kernels fence between
// rounds, and a kernel boundary orders the last round before the next call.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "jaxll/memory_ops.cuh"
#include "jaxll/workspace_layout.h"

namespace jaxll {

constexpr uint64_t kSentinelWord = ~0ull;

template <class T>
struct SentinelBits;
template <>
struct SentinelBits<float> {
  static constexpr uint64_t kLanes = 2, kMask = 0xFFFFFFFFull, kCanonicalNaN = 0x7FC00000ull;
};
template <>
struct SentinelBits<__half> {
  static constexpr uint64_t kLanes = 4, kMask = 0xFFFFull, kCanonicalNaN = 0x7E00ull;
};
template <>
struct SentinelBits<__nv_bfloat16> {
  static constexpr uint64_t kLanes = 4, kMask = 0xFFFFull, kCanonicalNaN = 0x7FC0ull;
};

// True when any element of the 8-byte word `w` still holds the sentinel.
template <class T>
__device__ __forceinline__ bool sentinel_present(uint64_t w) {
  using S = SentinelBits<T>;
  constexpr int bits = 64 / S::kLanes;
#pragma unroll
  for (int k = 0; k < static_cast<int>(S::kLanes); ++k)
    if (((w >> (k * bits)) & S::kMask) == S::kMask) return true;
  return false;
}

// Rewrites elements of `w` whose bits equal the sentinel to the canonical NaN.
template <class T>
__device__ __forceinline__ uint64_t sentinel_canonicalize(uint64_t w) {
  using S = SentinelBits<T>;
  constexpr int bits = 64 / S::kLanes;
#pragma unroll
  for (int k = 0; k < static_cast<int>(S::kLanes); ++k) {
    const int sh = k * bits;
    if (((w >> sh) & S::kMask) == S::kMask) w = (w & ~(S::kMask << sh)) | (S::kCanonicalNaN << sh);
  }
  return w;
}

// The same for the 16 bytes of `q` (what a sender applies before it stores).
template <class T>
__device__ __forceinline__ uint4 sentinel_canonicalize_16(uint4 q) {
  uint64_t a = static_cast<uint64_t>(q.x) | static_cast<uint64_t>(q.y) << 32;
  uint64_t b = static_cast<uint64_t>(q.z) | static_cast<uint64_t>(q.w) << 32;
  a = sentinel_canonicalize<T>(a);
  b = sentinel_canonicalize<T>(b);
  return make_uint4(static_cast<uint32_t>(a), static_cast<uint32_t>(a >> 32),
                    static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32));
}

// One poll of the 16-byte sentinel slot at `p` (one relaxed load into *a, *b):
// true when neither word holds the pattern any more, i.e. the sender's store
// has landed. Called by the slot's one reader, in a bounded wait; it orders
// nothing, so the reader uses only the loaded words.
template <class T>
__device__ __forceinline__ bool sentinel_slot_probe(const void* p, uint64_t* a, uint64_t* b) {
  ld_relaxed_v2u64(p, a, b);
  return !sentinel_present<T>(*a) && !sentinel_present<T>(*b);
}

// Writes the pattern back into the slot at `p` once its reader is done, so the
// slot can take its next value. The store is relaxed: before a sender may reuse
// the slot (two epochs later) the reader's round boundary must order it (a
// fence between rounds; a kernel boundary between calls).
__device__ __forceinline__ void sentinel_slot_release(void* p) {
  st_relaxed_v2u64(p, kSentinelWord, kSentinelWord);
}

}  // namespace jaxll
