// What every kernel of jaxll's collectives takes and does first: its arguments,
// the block's share of the message, the prologue, poisoning (round boundaries,
// call signatures, transfer units and channels are in the device API:
// jaxll/round.cuh, jaxll/units.cuh, jaxll/channel.cuh).
//
// A message is cut into transfer units (8 bytes for LL16, 16 bytes otherwise).
// Block b of every rank owns the same contiguous span of units and moves it in
// rounds of at most `round_units`; every round of a block is non-empty, and each
// rank sends to each peer in every round, so receiving a peer's round i proves
// the peer finished round i-1 and scratch can alternate by epoch parity with no
// barrier between rounds or calls.
#pragma once

#include <cstddef>
#include <cstdint>

#include "jaxll/jaxll.cuh"
#include "kernels/call_args.h"

namespace jaxll {

// A block's units [u0, u1) and its number of rounds.
struct BlockShare {
  int64_t u0, u1;
  uint32_t rounds;
};

// Block blockIdx.x's share of a message cut as `a` says.
__device__ __forceinline__ BlockShare block_share(const AllReduceArgs& a) {
  BlockShare s;
  s.u0 = static_cast<int64_t>(blockIdx.x) * a.span;
  s.u1 = min(a.units, s.u0 + a.span);
  s.rounds = blockIdx.x + 1 == gridDim.x ? a.last_rounds : a.rounds;
  return s;
}

// First thing every collective kernel does: wait until the kernels ahead of it
// on its stream are done (they may write its input and the workspace), then,
// when the host allows it, let the next kernel of the stream be scheduled.
__device__ __forceinline__ void collective_prologue(const AllReduceArgs& a) {
  grid_dependency_wait();
  if (a.trigger) allow_dependent_launch();
}

// Writes the poison pattern (all-ones bits) into units [from, to) of y.
template <class T, int W>
__device__ __forceinline__ void poison_units(T* y, int64_t from, int64_t to, int64_t count,
                                             bool vec) {
  for (int64_t u = from + threadIdx.x; u < to; u += blockDim.x)
    store_unit<T, W>(y, u, count, vec, poison_unit<W>());
}

}  // namespace jaxll
