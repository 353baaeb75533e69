// Shared pieces of the all-reduce kernels: arguments, the block's share of the
// message, round boundaries, call signatures (transfer units and channels are
// in the device API: jaxll/units.cuh, jaxll/channel.cuh).
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

// Ends a round that another round of this block follows: sentinel and atomic
// resets are made visible before this rank's next sends, and the block moves on
// together. Returns true if some thread's wait gave up.
__device__ __forceinline__ bool round_boundary(bool ok) {
  fence_sys();
  return __syncthreads_or(!ok) != 0;
}

// --- Call signatures ---------------------------------------------------------------
// Ranks that disagree on a call (element count, dtype, op or algorithm) would
// exchange data of different shapes through the same slots: a wrong result or a
// hang. So every block of every rank sends the call's signature to each peer
// (one LL16 packet, flagged with the call's first epoch, into the peer's
// signature slot for this block, call parity and source) and checks the one
// each peer sent it; a block that finds a different signature records a
// mismatch with both signatures (so every wait of the rank gives up at once)
// and poisons its whole share of the output. The block's last n-1 threads do
// it, one peer each, right at the start (the host gives blocks a spare warp for
// it where there is room, so it runs beside the data path; the fused two-shot
// kernel, where it has none, takes threads that only receive instead:
// twoshot_signature_lane in all_reduce_rmsnorm.cu); at the end the
// block learns whether any thread failed. A slot, once checked, is reset to a
// packet whose two flags differ (never ready), so no stale signature is ever
// taken for a current one.
//
// Why the slot alternates with the block's call count, not with the epoch: a
// rank may write slot parity q again only after the owner has read and reset
// it. Take ranks A and B and a block index; count that block's calls. A's call
// j+2 (parity q again) starts after A's call j+1 ended, and a block ends only
// after its signature lanes received B's call-j+1 signature, which B sends
// after its kernel of call j completed (grid_dependency_wait), and with it B's
// read and reset of A's call-j slot. This holds whatever the data path does.
// (With the epoch parity, a call of an even number of rounds starts the next
// call on the same slot, and the argument needs the data path: A cannot finish
// a round after the first before B passed its first round boundary, where B's
// signature lanes are done.)

// Peer offset k (1..n-1) this thread handles the signature for, 0 if none.
__device__ __forceinline__ int signature_lane(int n) {
  const int k = static_cast<int>(blockDim.x - threadIdx.x);
  return k < n ? k : 0;
}

// Sends the call's signature to peer `k` of this rank (k == 0: nothing).
__device__ __forceinline__ void send_signature(const AllReduceArgs& a, int k, int n,
                                               const BlockStart& bs) {
  if (k == 0) return;
  const RankView& v = a.view;
  ll16_store(signature_slot(v, peer_at(v.rank, k, n), blockIdx.x, bs.call_parity, v.rank),
             a.signature, static_cast<uint32_t>(bs.epoch));
}

// Waits for the signature of peer `k` (k == 0: nothing, true), compares it with
// this call's and resets the slot. False on a mismatch (recorded with both
// signatures, so every wait of this rank gives up at once) or a wait that gave
// up. Called right after send_signature: the spare warp's lanes wait here
// while the data path runs; their result joins the block's at the end.
__device__ __forceinline__ bool signature_ok(const AllReduceArgs& a, int k, int n,
                                             const BlockStart& bs) {
  if (k == 0) return true;
  const RankView& v = a.view;
  const int src = peer_at(v.rank, k, n);
  LL16* slot = signature_slot(v, v.rank, blockIdx.x, bs.call_parity, src);
  WaitContext ctx = wait_context(v, bs.epoch);
  ctx.timeout_kind = ErrorKind::kNotStarted;
  uint64_t theirs = 0;
  if (!ll16_wait(slot, static_cast<uint32_t>(bs.epoch), ctx, static_cast<uint32_t>(src),
                 &theirs)) {
    return false;
  }
  ll16_store_never_ready(slot);
  if (theirs != a.signature) {
    report_error(ctx, ErrorKind::kMismatch, static_cast<uint32_t>(src), a.signature, theirs);
    return false;
  }
  return true;
}

// True when some thread of the block failed (a wait gave up, or a signature
// differed): the block must poison its whole share. Every thread must call it.
__device__ __forceinline__ bool block_failed(bool ok) { return __syncthreads_or(!ok) != 0; }

template <class T, int W>
__device__ __forceinline__ void poison_units(T* y, int64_t from, int64_t to, int64_t count,
                                             bool vec) {
  for (int64_t u = from + threadIdx.x; u < to; u += blockDim.x)
    store_unit<T, W>(y, u, count, vec, poison_unit<W>());
}

}  // namespace jaxll
