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
//
// The protocol object is LL128Lines (below): line, add, arrive, complete, take. Its
// calling contract: a line is used once per epoch parity and round; every rank
// adds its slice into each line it owes and then arrives once on that line (one
// thread per line, after a __syncwarp over the line's 8 lanes and a fence_sys,
// so the arrival releases every lane's adds); the owner polls `complete` in a
// bounded wait, then `take`s every lane of the line, which also clears it for
// its next use (two epochs later, after the owner's round boundary).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "jaxll/elements.cuh"
#include "jaxll/memory_ops.cuh"
#include "jaxll/rank_view.cuh"
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
  // (one f16x2 at a time, at system scope: the line may be a peer GPU's memory,
  // where a GPU-scope atomicAdd is not atomic against the other ranks' adds)
  uint32_t* p = static_cast<uint32_t*>(dst);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  for (int k = 0; k < 4; ++k)
    asm volatile("red.relaxed.sys.global.add.noftz.f16x2 [%0], %1;" ::"l"(p + k), "r"(w[k]) : "memory");
#endif
}

template <>
__device__ __forceinline__ void red_add_16<__nv_bfloat16>(void* dst, uint4 v) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.relaxed.sys.global.add.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4};" ::"l"(dst),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
#else
  // (before sm_90 PTX has no bf16x2 reduction: a system-scope compare-and-swap
  // loop, for the same reason as f16's; each bf16 is rounded once, as the
  // vector add rounds it)
  unsigned int* p = static_cast<unsigned int*>(dst);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  for (int k = 0; k < 4; ++k) {
    const __nv_bfloat162 add = *reinterpret_cast<const __nv_bfloat162*>(&w[k]);
    unsigned int seen = p[k];
    while (true) {
      __nv_bfloat162 now = *reinterpret_cast<const __nv_bfloat162*>(&seen);
      const float lo = __bfloat162float(now.x) + __bfloat162float(add.x);
      const float hi = __bfloat162float(now.y) + __bfloat162float(add.y);
      now = __floats2bfloat162_rn(lo, hi);
      const unsigned int want = *reinterpret_cast<const unsigned int*>(&now);
      const unsigned int was = atomicCAS_system(p + k, seen, want);
      if (was == seen) break;
      seen = was;
    }
  }
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

// A line's 16-byte slices and a message of elements: lane `lane` (0..7, one of
// the 8 threads that move a line) holds elements [lane*V, lane*V+V) of line
// `line`, the last element of lane 7 being the counter.
template <class T>
struct LL128Slice {
  static constexpr int V = 16 / sizeof(T);
  static constexpr int kData = line_data_elems<T>();
  using Bits = typename ElemTraits<T>::Bits;

  // The slice of line `line` of the message `x` (zeros past `limit` elements and
  // in the counter slot).
  __device__ static uint4 load(const T* x, int64_t line, int lane, int64_t limit) {
    Bits b[V];
#pragma unroll
    for (int s = 0; s < V; ++s) {
      const int slot = lane * V + s;
      const int64_t e = line * kData + slot;
      b[s] = (slot < kData && e < limit) ? reinterpret_cast<const Bits*>(x)[e] : Bits(0);
    }
    uint4 q;
    memcpy(&q, b, 16);
    return q;
  }
  // Stores slice `q` into line `line` of the message `y` (elements before `limit`).
  __device__ static void store(T* y, int64_t line, int lane, int64_t limit, uint4 q) {
    Bits b[V];
    memcpy(b, &q, 16);
#pragma unroll
    for (int s = 0; s < V; ++s) {
      const int slot = lane * V + s;
      const int64_t e = line * kData + slot;
      if (slot < kData && e < limit) reinterpret_cast<Bits*>(y)[e] = b[s];
    }
  }
};

// The LL128-atomic protocol object: block `block`'s accumulation lines on every
// rank of a group of `nranks`, each epoch parity its own set.
template <class T>
struct LL128Lines {
  const RankView& v;
  int block;
  uint32_t arrived;  // the counter word once every rank has arrived
  uint4 one;         // lane 7's slice that counts one arrival

  __device__ __forceinline__ LL128Lines(const RankView& view, int b, int nranks)
      : v(view), block(b), arrived(counter_bits<T>(nranks)),
        one(counter_slice<T>(counter_bits<T>(1))) {}
  // Line `t` of rank `owner`'s lines of this parity.
  __device__ __forceinline__ char* line(int owner, int parity, int64_t t) const {
    return atomic_region(v, owner, block, parity) + t * kLineBytes;
  }
  // Adds this thread's slice `q` (lane `lane`) into `line` (relaxed vector
  // atomics: the order of the ranks' adds is not fixed).
  __device__ __forceinline__ void add(char* line, int lane, uint4 q) const {
    red_add_16<T>(line + lane * 16, q);
  }
  // Counts this rank in on `line`. One thread per line, after its lanes' adds
  // are ordered before a fence_sys (see the contract above).
  __device__ __forceinline__ void arrive(char* line) const { red_add_16<T>(line + 7 * 16, one); }
  // The counter word of `line` (its last 4 bytes).
  __device__ __forceinline__ static const uint32_t* counter(const char* line) {
    return reinterpret_cast<const uint32_t*>(line + kLineBytes - 4);
  }
  // One poll of the `counter` of one of this rank's lines: true once every rank
  // has arrived (an acquire load: the adds those arrivals released are then
  // visible to this thread).
  __device__ __forceinline__ bool complete(const uint32_t* counter) const {
    return (ld_acquire_u32(counter) & counter_mask<T>()) == arrived;
  }
  // Lane `lane`'s slice of the sum in this rank's completed `line`, into *q (the
  // counter masked off), clearing the slice to zeros for the line's next use.
  // Every lane of the line must take its slice after `complete` held for it.
  __device__ __forceinline__ void take(char* line, int lane, uint4* q) const {
    *q = ld_relaxed_16(line + lane * 16);
    st_relaxed_16(line + lane * 16, make_uint4(0, 0, 0, 0));
    if (lane == 7) q->w &= ~counter_mask<T>();
  }
};

}  // namespace jaxll
