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

}  // namespace jaxll
