// Bounded spin-waits.
//
// Every wait in a jaxll kernel is bounded: it reads %globaltimer every few hundred
// polls, and when the deadline passes it records who waited for whom in the
// workspace's error word (and its host-visible mirror) and returns false, so the
// kernel can finish instead of hanging the GPU. A wait also gives up early once
// another thread of the same rank has recorded an error. With JAXLL_ON_ERROR=trap
// the thread that records an error then traps, which aborts the CUDA context:
// nothing queued after the failed call can run on a wrong value.
#pragma once

#include <cstdint>

#include "jaxll/error_word.h"
#include "jaxll/workspace_layout.h"

namespace jaxll {

struct WaitContext {
  unsigned long long* error;       // the rank's error word in device memory
  unsigned long long* host_error;  // its host record (kHostErrorWords, mapped; may be null)
  uint64_t timeout_ns;             // deadline, counted from the first failed poll
  uint32_t rank;
  uint32_t block;
  uint32_t epoch;
  bool trap;                       // trap after recording an error
  ErrorKind timeout_kind = ErrorKind::kTimeout;  // what a deadline records
};

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ bool error_raised(const WaitContext& ctx) {
  return *reinterpret_cast<volatile unsigned long long*>(ctx.error) != 0ull;
}

// Records an error of `kind` about `peer` (with, for a mismatch, both
// signatures). The first error of a rank wins; its host record gets the details
// before the error word, so a host that sees the word sees them too.
__device__ inline void report_error(const WaitContext& ctx, ErrorKind kind, uint32_t peer,
                                          uint64_t mine = 0, uint64_t theirs = 0) {
  const unsigned long long code = encode_error(kind, ctx.rank, peer, ctx.block, ctx.epoch);
  if (atomicCAS(ctx.error, 0ull, code) == 0ull && ctx.host_error != nullptr) {
    volatile unsigned long long* h = ctx.host_error;
    h[1] = mine;
    h[2] = theirs;
    __threadfence_system();
    h[0] = code;
    __threadfence_system();
  }
  if (ctx.trap) __trap();
}

__device__ __forceinline__ void report_timeout(const WaitContext& ctx, uint32_t peer) {
  report_error(ctx, ctx.timeout_kind, peer);
}

// Polls `probe()` until it returns true (returns true), the deadline passes
// (records a timeout, returns false) or another thread already recorded an
// error (returns false).
template <class Probe>
__device__ __forceinline__ bool bounded_wait(const WaitContext& ctx, uint32_t peer, Probe&& probe) {
  if (probe()) return true;
  const uint64_t start = globaltimer_ns();
  for (uint32_t spins = 1;; ++spins) {
    if (probe()) return true;
    if ((spins & 255u) == 0) {
      if (error_raised(ctx)) return false;
      if (globaltimer_ns() - start > ctx.timeout_ns) {
        report_timeout(ctx, peer);
        return false;
      }
    }
  }
}

}  // namespace jaxll
