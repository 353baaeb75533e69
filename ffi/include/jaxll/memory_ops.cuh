// System-scope loads, stores, fences and vector reductions on global memory.
//
// Scratch memory is written by other GPUs (or, for virtual ranks, other kernels)
// while a kernel polls it, so every access to it is a relaxed system-scope
// operation: it is never served from a stale L1 line and is single-copy atomic
// per element. Vector forms move 8 or 16 bytes in one instruction; a reader must
// still check every element, since a vector access is not atomic as a whole.
//
// None of these orders anything by itself beyond what its PTX qualifier says:
// relaxed accesses order nothing, a release store orders the calling thread's
// earlier accesses before it, an acquire load orders the thread's later accesses
// after it, and fence_sys orders both ways. Any thread may call any of them on
// any rank's workspace memory (peer pointers from a RankView); the pointer must
// be aligned to the access size.
#pragma once

#include <cstdint>

namespace jaxll {

// One relaxed, system-scope 8-byte store / load (single-copy atomic).
__device__ __forceinline__ void st_relaxed_u64(void* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t ld_relaxed_u64(const void* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
// One relaxed, system-scope 16-byte store / load of two 8-byte words (each word
// single-copy atomic, the pair not: a reader checks both).
__device__ __forceinline__ void st_relaxed_v2u64(void* p, uint64_t a, uint64_t b) {
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b)
               : "memory");
}
__device__ __forceinline__ void ld_relaxed_v2u64(const void* p, uint64_t* a, uint64_t* b) {
  asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(*a), "=l"(*b)
               : "l"(p)
               : "memory");
}
// The same 16-byte accesses on a uint4 (x, y the first word's low and high halves).
__device__ __forceinline__ uint4 ld_relaxed_16(const void* p) {
  uint64_t a, b;
  ld_relaxed_v2u64(p, &a, &b);
  return make_uint4(static_cast<uint32_t>(a), static_cast<uint32_t>(a >> 32),
                    static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32));
}
__device__ __forceinline__ void st_relaxed_16(void* p, uint4 q) {
  st_relaxed_v2u64(p, static_cast<uint64_t>(q.x) | static_cast<uint64_t>(q.y) << 32,
                   static_cast<uint64_t>(q.z) | static_cast<uint64_t>(q.w) << 32);
}
// A release store: the calling thread's earlier accesses (and, after a
// __syncthreads, its block's) are visible to any thread that acquires the value.
__device__ __forceinline__ void st_release_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// An acquire load: the calling thread's later accesses see what the releasing
// store ordered before it.
__device__ __forceinline__ uint32_t ld_acquire_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Orders this thread's earlier memory operations (and, through a preceding
// __syncthreads, those of its block) before its later ones, for every observer.
__device__ __forceinline__ void fence_sys() {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
}

}  // namespace jaxll
