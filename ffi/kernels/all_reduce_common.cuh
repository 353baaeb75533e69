// Shared pieces of jaxll's kernels: the all-reduce arguments, a virtual group's
// arguments for one launch, the block's share of the message, poisoning (round
// boundaries, call signatures, transfer units and channels are in the device
// API: jaxll/round.cuh, jaxll/units.cuh, jaxll/channel.cuh).
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

#include "all_reduce.h"
#include "all_reduce_kernels.h"
#include "jaxll/jaxll.cuh"

namespace jaxll {

struct AllReduceArgs {
  RankView view;
  const void* in;
  void* out;
  int64_t count;         // elements per rank
  int64_t units;         // transfer units in the message
  int64_t span;          // units per block (the last block may have fewer, never zero)
  int64_t round_units;   // most units one block moves in one round
  uint32_t rounds;       // rounds of every block but the last (computed on the host)
  uint32_t last_rounds;  // rounds of the last block
  int trigger;           // let the stream's next kernel launch early (launch_order.cuh)
  uint64_t signature;    // the call's signature (error_word.h), checked against every peer's
};

// One launch for every rank of a virtual group (ranks of one group on one GPU,
// launched together from one stream): rank r's blocks are those with
// blockIdx.y == r and run rank r's arguments, rank[r]. The ranks' plans are
// equal (a plan depends only on the call and the workspace's geometry), so
// blockIdx.x and gridDim.x mean in each rank's blocks what they mean in a
// launch of that rank alone. The group twin of a kernel takes this struct as a
// __grid_constant__ parameter (read in place, never copied) and runs the same
// device body as the kernel; the host fills the first nranks entries.
template <class Args>
struct GroupArgs {
  Args rank[kMaxRanks];
};
// The most bytes of parameters a kernel may take (CUDA 12.1 and newer, with a
// driver of release 530 or newer; before that 4 KB, less than a GroupArgs).
constexpr size_t kMaxKernelParamBytes = 32764;
static_assert(sizeof(GroupArgs<AllReduceArgs>) <= kMaxKernelParamBytes,
              "a virtual group's all-reduce arguments exceed a kernel's parameter space");

// This block's units [u0, u1) and its number of rounds.
struct BlockShare {
  int64_t u0, u1;
  uint32_t rounds;
};
__device__ __forceinline__ BlockShare block_share(const AllReduceArgs& a) {
  BlockShare s;
  s.u0 = static_cast<int64_t>(blockIdx.x) * a.span;
  s.u1 = min(a.units, s.u0 + a.span);
  s.rounds = blockIdx.x + 1 == gridDim.x ? a.last_rounds : a.rounds;
  return s;
}

// First thing every all-reduce kernel does: wait until the kernels ahead of it
// on its stream are done (they may write its input and the workspace), then,
// when the host allows it, let the next kernel of the stream be scheduled.
__device__ __forceinline__ void collective_prologue(const AllReduceArgs& a) {
  grid_dependency_wait();
  if (a.trigger) allow_dependent_launch();
}

template <class T, int W>
__device__ __forceinline__ void poison_units(T* y, int64_t from, int64_t to, int64_t count,
                                             bool vec) {
  for (int64_t u = from + threadIdx.x; u < to; u += blockDim.x)
    store_unit<T, W>(y, u, count, vec, poison_unit<W>());
}

}  // namespace jaxll
