// LL128-atomic lines: reduce-scatter by vector atomic adds into the owner's scratch.
//
// A 128-byte line carries 31 f32 (or 63 f16/bf16) elements and, in its last
// element, an arrival counter. Every rank adds its slice of the line into the
// owner's line with 16-byte vector reductions (`red.add.v4`), then, after a
// fence, adds 1 to the counter. The owner polls the counter until it equals the
// group size N: by then every rank's data adds have landed. The owner reads the
// sum, writes zeros back (ready for the line's next use) and sends the result
// on.
// The order of the adds varies from run to run, so sums are not bitwise
// reproducible (the owner's result is what every rank gets, so ranks agree),
// f16/bf16 accumulate in their own precision, f32 atomic adds flush subnormals
// to zero (PTX red.add.f32), and a sum of negative zeros comes out +0.0 (the
// line starts at +0.0; an H200 also returned +0.0 with lines starting at -0.0).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "jaxll/workspace_layout.h"

namespace jaxll {

// Elements per line that carry data (the last one is the counter).
template <class T>
__host__ __device__ constexpr int line_data_elems() {
  return kLineBytes / static_cast<int>(sizeof(T)) - 1;
}

// Adds the 16 bytes `v` (4 f32 or 8 f16/bf16) into `dst` element-wise.
template <class T>
__device__ __forceinline__ void red_add_16(void* dst, uint4 v);

template <>
__device__ __forceinline__ void red_add_16<float>(void* dst, uint4 v) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.relaxed.sys.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst),
               "f"(__uint_as_float(v.x)), "f"(__uint_as_float(v.y)), "f"(__uint_as_float(v.z)),
               "f"(__uint_as_float(v.w))
               : "memory");
#else
  float* p = static_cast<float*>(dst);
  atomicAdd_system(p + 0, __uint_as_float(v.x));
  atomicAdd_system(p + 1, __uint_as_float(v.y));
  atomicAdd_system(p + 2, __uint_as_float(v.z));
  atomicAdd_system(p + 3, __uint_as_float(v.w));
#endif
}

template <>
__device__ __forceinline__ void red_add_16<__half>(void* dst, uint4 v) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.relaxed.sys.global.add.noftz.v4.f16x2 [%0], {%1, %2, %3, %4};" ::"l"(dst),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
#else
  __half2* p = static_cast<__half2*>(dst);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  for (int k = 0; k < 4; ++k) atomicAdd(p + k, *reinterpret_cast<const __half2*>(&w[k]));
#endif
}

template <>
__device__ __forceinline__ void red_add_16<__nv_bfloat16>(void* dst, uint4 v) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.relaxed.sys.global.add.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4};" ::"l"(dst),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
#else
  __nv_bfloat162* p = static_cast<__nv_bfloat162*>(dst);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  for (int k = 0; k < 4; ++k)
    atomicAdd(p + k, *reinterpret_cast<const __nv_bfloat162*>(&w[k]));
#endif
}

// Bits of the 32-bit word holding the counter (the line's last 4 bytes) once
// `n` ranks have arrived: the counter element equals n, a data element beside it
// (f16/bf16) is masked off by counter_mask.
template <class T>
__device__ __forceinline__ uint32_t counter_bits(int n) {
  if constexpr (sizeof(T) == 4) {
    return __float_as_uint(static_cast<float>(n));
  } else {
    T t = T(static_cast<float>(n));
    uint16_t b;
    memcpy(&b, &t, 2);
    return static_cast<uint32_t>(b) << 16;
  }
}
template <class T>
__device__ __forceinline__ uint32_t counter_mask() {
  return sizeof(T) == 4 ? 0xFFFFFFFFu : 0xFFFF0000u;
}
// The 16-byte slice of lane 7 (the one that holds the counter) with the counter
// element set to `bits` and the other elements zero.
template <class T>
__device__ __forceinline__ uint4 counter_slice(uint32_t bits) {
  return make_uint4(0u, 0u, 0u, bits);
}

}  // namespace jaxll
