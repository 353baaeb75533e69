// Rounds and call signatures: what every block of a collective does at the start
// of a call, at the start and end of each round, and at its end, over a RankView.
//
//   ll_round_begin(v, epoch, parity)   LL16 scratch: the periodic flag refresh
//                                      (every thread of the block, each round)
//   round_boundary(ok)                 between two rounds of a block: fence, then
//                                      the block moves on together
//   block_failed(ok)                   at the end: did any thread's wait give up?
//   signature_lane / send_signature / signature_ok
//                                      the call's signature, sent to and checked
//                                      against every peer's (below)
//   round_signature_start(bs, r)       a one-way collective's signature exchange
//                                      of round r (below)
//
// Calling contract: a block calls block_begin() first (rank_view.cuh), then these
// in that order, every thread of the block where a line above says so.
#pragma once

#include <cstdint>

#include "jaxll/error_word.h"
#include "jaxll/ll_packet.cuh"
#include "jaxll/memory_ops.cuh"
#include "jaxll/rank_view.cuh"
#include "jaxll/spin_wait.cuh"

namespace jaxll {

// Starts a round at `epoch` (scratch parity `parity`) on LL16 scratch: at the
// epochs where ll16_refresh_due() holds, rewrites the slots this rank sends to
// with an old flag (ll_refresh: it ends with a fence and a block barrier). Every
// thread of the block must call it, before the round's first send.
__device__ __forceinline__ void ll_round_begin(const RankView& v, uint64_t epoch, int parity) {
  if (ll16_refresh_due(epoch)) ll_refresh(v, epoch, parity);
}

// Ends a round that another round of this block follows: sentinel and atomic
// resets are made visible before this rank's next sends, and the block moves on
// together. Returns true if some thread's wait gave up. Every thread must call it.
__device__ __forceinline__ bool round_boundary(bool ok) {
  fence_sys();
  return __syncthreads_or(!ok) != 0;
}

// True when some thread of the block failed (a wait gave up, or a signature
// differed): the block must poison its whole share. Every thread must call it.
__device__ __forceinline__ bool block_failed(bool ok) { return __syncthreads_or(!ok) != 0; }

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
// twoshot_signature_lane in jaxll's rmsnorm_twoshot.cuh); at the end the
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

// One-way collectives. A ppermute's data goes from a rank to one peer, and a
// rank may hear nothing from most peers: receiving nothing from B, A would
// learn nothing of B's progress, and could write B's slot of parity q again
// before B read it (the argument above, and channel.cuh's, need every rank to
// hear from every peer each round). Such a kernel exchanges the signature
// every round instead of once: round r of a call is the signature exchange
// of round_signature_start(bs, r), whose slot parity and flag move on with
// the round, and block_begin(v, rounds, rounds) counts them all. A's round
// r+2 then starts after it received B's round r+1 signature, which B sends
// after its round r ended (its reads, and its reset of the round-r slot,
// done). The signature is 16 bytes each way per peer and round, sent beside
// the data at the round's start by the spare warp: no barrier phase, but a
// round ends only once every peer has started it.
__device__ __forceinline__ BlockStart round_signature_start(const BlockStart& bs, uint32_t r) {
  return BlockStart{bs.epoch + r, (bs.call_parity + static_cast<int>(r)) & 1, bs.had_error};
}

// Peer offset k (1..n-1) this thread handles the signature for, 0 if none.
__device__ __forceinline__ int signature_lane(int n) {
  const int k = static_cast<int>(blockDim.x - threadIdx.x);
  return k < n ? k : 0;
}

// In what follows, `a` is a call's arguments: any struct with members
// `RankView view` and `uint64_t signature` (encode_signature, error_word.h).

// Sends the call's signature to peer `k` of this rank (k == 0: nothing).
template <class Args>
__device__ __forceinline__ void send_signature(const Args& a, int k, int n, const BlockStart& bs) {
  if (k == 0) return;
  const RankView& v = a.view;
  ll16_store(signature_slot(v, peer_at(v.rank, k, n), blockIdx.x, bs.call_parity, v.rank),
             a.signature, static_cast<uint32_t>(bs.epoch));
}

// Waits for the signature of peer `k` (k == 0: nothing, true), compares it with
// this call's and resets the slot. False on a mismatch (recorded with both
// signatures, so every wait of this rank gives up at once) or a wait that gave
// up. Called right after send_signature: the spare warp's lanes wait here
// while the data path runs; their result joins the block's at the end. A wait
// that gives up records `timeout_kind`: kNotStarted for a call's first
// signature; a one-way collective's later rounds pass kTimeout (the peer had
// started).
template <class Args>
__device__ __forceinline__ bool signature_ok(const Args& a, int k, int n, const BlockStart& bs,
                                             ErrorKind timeout_kind = ErrorKind::kNotStarted) {
  if (k == 0) return true;
  const RankView& v = a.view;
  const int src = peer_at(v.rank, k, n);
  LL16* slot = signature_slot(v, v.rank, blockIdx.x, bs.call_parity, src);
  WaitContext ctx = wait_context(v, bs.epoch);
  ctx.timeout_kind = timeout_kind;
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

}  // namespace jaxll
