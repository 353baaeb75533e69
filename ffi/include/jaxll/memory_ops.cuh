// System-scope loads, stores, fences and vector reductions on global memory.
//
// Scratch memory is written by other GPUs (or, for virtual ranks, other kernels)
// while a kernel polls it, so every access to it is a relaxed system-scope
// operation: it is never served from a stale L1 line and is single-copy atomic
// per element. Vector forms move 8 or 16 bytes in one instruction; a reader must
// still check every element, since a vector access is not atomic as a whole.
#pragma once

#include <cstdint>

namespace jaxll {

__device__ __forceinline__ void st_relaxed_u64(void* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t ld_relaxed_u64(const void* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
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
__device__ __forceinline__ void st_release_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
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
