// Channels: one protocol's view of a block's scratch for one round, and the
// operations collectives are made of, over a RankView.
//
//   Channel<P, T>(view, phase, block, parity, epoch)
//     send(owner, slot, u)    store unit u into slot `slot` of this rank's region
//                             on rank `owner` (LL16: one 16-byte store carrying
//                             the flag; sentinel/plain: one 16-byte relaxed store)
//     probe(src, slot, &u)    one load of this rank's region from `src`; true when
//                             the unit there is this round's (never true for a
//                             stale one: LL16 flags carry the epoch, sentinel
//                             slots hold the pattern until written)
//     release(src, slot)      make a read slot reusable (sentinel: write the
//                             pattern back; LL16, plain: nothing)
//   send_to_peers             broadcast one unit to the same slot of every peer
//   channel_recv              bounded wait for one source's unit, then release
//   reduce_slot               receive-and-reduce: every source's unit at a slot
//                             folded in rank order 0..n-1 (bitwise the same on
//                             every rank), bounded
//
// Calling contract (what keeps the scratch safe to reuse without a barrier):
// rounds use the epochs block_begin() reserved, one per round, and alternate
// scratch by epoch parity; in every round each rank sends something to each
// peer and receives from each peer, and a block ends a round only when all its
// threads are done with it (a block-wide barrier; round_boundary, round.cuh,
// also fences, so sentinel resets are visible before the next round's sends). Then a slot written at epoch e is not written again
// (epoch e + 2) before its reader is done. A wait that gives up records the
// error (spin_wait.cuh) and returns false: the caller poisons its output.
#pragma once

#include <cstddef>
#include <cstdint>

#include "jaxll/ll_packet.cuh"
#include "jaxll/memory_ops.cuh"
#include "jaxll/protocol.h"
#include "jaxll/rank_view.cuh"
#include "jaxll/sentinel.cuh"
#include "jaxll/spin_wait.cuh"
#include "jaxll/units.cuh"
#include "jaxll/workspace_layout.h"

namespace jaxll {

// One protocol's view of the scratch of one (phase, block, parity) for a round.
// The layout is symmetric, so the region this rank writes on any peer sits at
// the same offset (`send_off`) in every peer's workspace, and the regions it
// reads, one per source, follow each other `stride` bytes apart from `recv`.
//   prepare(v)                  what a value must become before it is sent
//   send(owner, slot, v)        store v into rank `owner`'s region from this rank
//   probe(src, slot, &v)        one load of this rank's region from `src`; true
//                               when the value there is this round's
//   release(src, slot)          make a slot that was read reusable
template <Proto P, class T>
struct Channel;

struct ChannelPlace {
  const RankView& v;
  size_t send_off;   // byte offset of this rank's region in any owner's workspace
  const char* recv;  // this rank's region for source 0
  size_t stride;     // bytes between the regions of consecutive sources
  uint32_t flag;     // low 32 bits of the round's epoch
  __device__ __forceinline__ char* to(int owner) const { return v.peers.base[owner] + send_off; }
  __device__ __forceinline__ const char* from(int src) const { return recv + src * stride; }
};

// The place of (phase, block, parity) in the double-buffered area at
// `area_offset` with regions `stride` bytes apart.
__device__ __forceinline__ ChannelPlace channel_place(const RankView& v, size_t area_offset,
                                                      size_t stride, int phase, int block,
                                                      int parity, uint64_t epoch) {
  const size_t first = region_offset(v, area_offset, stride, phase, block, parity, 0);
  return ChannelPlace{v, first + v.rank * stride, v.peers.base[v.rank] + first,
                      stride, static_cast<uint32_t>(epoch)};
}

template <class T>
struct Channel<Proto::kLL, T> : ChannelPlace {
  __device__ __forceinline__ Channel(const RankView& v, int phase, int block, int parity,
                                     uint64_t epoch)
      : ChannelPlace(channel_place(v, v.geo.ll_offset, 2 * size_t{v.geo.region_bytes}, phase,
                                   block, parity, epoch)) {}
  __device__ __forceinline__ Unit<8> prepare(Unit<8> u) const { return u; }
  __device__ __forceinline__ void send(int owner, int slot, const Unit<8>& u) const {
    ll16_store(reinterpret_cast<LL16*>(to(owner)) + slot, u.p[0], flag);
  }
  __device__ __forceinline__ bool probe(int src, int slot, Unit<8>* u) const {
    const LL16Value q = ll16_load(reinterpret_cast<const LL16*>(from(src)) + slot);
    u->p[0] = ll16_payload(q);
    return ll16_ready(q, flag);
  }
  __device__ __forceinline__ void release(int, int64_t) const {}
};

template <class T>
struct Channel<Proto::kSentinel, T> : ChannelPlace {
  __device__ __forceinline__ Channel(const RankView& v, int phase, int block, int parity,
                                     uint64_t epoch)
      : ChannelPlace(channel_place(v, v.geo.sentinel_offset, v.geo.region_bytes, phase, block,
                                   parity, epoch)) {}
  __device__ __forceinline__ Unit<16> prepare(Unit<16> u) const {
    u.p[0] = sentinel_canonicalize<T>(u.p[0]);
    u.p[1] = sentinel_canonicalize<T>(u.p[1]);
    return u;
  }
  __device__ __forceinline__ void send(int owner, int slot, const Unit<16>& u) const {
    st_relaxed_v2u64(to(owner) + slot * 16, u.p[0], u.p[1]);
  }
  __device__ __forceinline__ bool probe(int src, int slot, Unit<16>* u) const {
    return sentinel_slot_probe<T>(from(src) + slot * 16, &u->p[0], &u->p[1]);
  }
  __device__ __forceinline__ void release(int src, int slot) const {
    sentinel_slot_release(const_cast<char*>(from(src)) + slot * 16);
  }
};

// Plain scratch of the barrier baselines: single-buffered, [phase][block][src].
template <class T>
struct Channel<Proto::kBarrier, T> : ChannelPlace {
  __device__ __forceinline__ Channel(const RankView& v, int phase, int block, int,
                                     uint64_t epoch)
      : ChannelPlace{v,
                     v.geo.plain_offset +
                         ((static_cast<size_t>(phase) * v.geo.blocks + block) * v.geo.nranks +
                          v.rank) * v.geo.region_bytes,
                     v.peers.base[v.rank] + v.geo.plain_offset +
                         (static_cast<size_t>(phase) * v.geo.blocks + block) * v.geo.nranks *
                             v.geo.region_bytes,
                     v.geo.region_bytes, static_cast<uint32_t>(epoch)} {}
  __device__ __forceinline__ Unit<16> prepare(Unit<16> u) const { return u; }
  __device__ __forceinline__ void send(int owner, int slot, const Unit<16>& u) const {
    st_relaxed_v2u64(to(owner) + slot * 16, u.p[0], u.p[1]);
  }
  __device__ __forceinline__ bool probe(int src, int slot, Unit<16>* u) const {
    ld_relaxed_v2u64(from(src) + slot * 16, &u->p[0], &u->p[1]);
    return true;  // a barrier already ordered the data before this read
  }
  __device__ __forceinline__ void release(int, int64_t) const {}
};

// Waits (bounded) for one source's value at `slot`, then releases the slot.
template <Proto P, class T, int W>
__device__ __forceinline__ bool channel_recv(const Channel<P, T>& ch, int src, int slot,
                                             Unit<W>* u) {
  bool ok = ch.probe(src, slot, u);
  if (!ok) {
    const WaitContext ctx = wait_context(ch.v, ch.flag);
    ok = bounded_wait(ctx, static_cast<uint32_t>(src), [&] { return ch.probe(src, slot, u); });
  }
  if (ok) ch.release(src, slot);
  return ok;
}

// Folds the values at `slot` of sources s0 .. s0+B-1 (those below n) into
// `acc` in rank order, `own` standing in for this rank. The loads of all B
// sources are issued together, and sources not ready at the first look are
// polled together in one bounded loop, so a batch costs about one memory round
// trip after the last peer's data lands. False when the wait gave up (the
// timeout is recorded; see spin_wait.cuh).
template <int B, Proto P, class T, class Op, int W>
__device__ __forceinline__ bool reduce_batch(const Channel<P, T>& ch, int s0, int n, int slot,
                                             const Unit<W>& own, UnitAcc<T, Op, W>* acc) {
  const int rank = ch.v.rank;
  Unit<W> val[B];
  bool ready[B];
  bool all = true;
#pragma unroll
  for (int j = 0; j < B; ++j) {
    const int s = s0 + j;
    ready[j] = true;
    if (s < n) ready[j] = ch.probe(s, slot, &val[j]) || s == rank;
    all = all && ready[j];
  }
  if (!all) {
    const WaitContext ctx = wait_context(ch.v, ch.flag);
    const uint64_t start = globaltimer_ns();
    for (uint32_t spins = 1;; ++spins) {
      all = true;
#pragma unroll
      for (int j = 0; j < B; ++j) {
        if (!ready[j]) ready[j] = ch.probe(s0 + j, slot, &val[j]);
        all = all && ready[j];
      }
      if (all) break;
      if ((spins & 255u) == 0) {
        if (error_raised(ctx)) return false;
        if (globaltimer_ns() - start > ctx.timeout_ns) {
          int late = s0;
#pragma unroll
          for (int j = B - 1; j >= 0; --j) late = ready[j] ? late : s0 + j;
          report_timeout(ctx, static_cast<uint32_t>(late));
          return false;
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < B; ++j) {
    const int s = s0 + j;
    if (s < n) {
      if (s != rank) ch.release(s, slot);
      const Unit<W> u = s == rank ? own : val[j];
      if (s == 0) acc->init(u); else acc->add(u);
    }
  }
  return true;
}

// Sources whose loads one batch issues together: bounded by the registers the
// values in flight take (a thread has 64; see kMinBlocksPerSM). Batches of 8
// spilled to local memory on sm_90 and measured slower than two batches of 4.
template <int NR>
__host__ __device__ constexpr int reduce_batch_size() {
  return NR > 0 && NR < 4 ? NR : 4;
}

// The reduction of slot `slot` over all n sources in rank order 0..n-1 (so
// every rank gets bitwise identical results), `own` standing in for this rank.
// NR > 0: the group size is the compile-time NR (batches unroll completely);
// NR == 0: any n. False when a wait gave up.
template <int NR, Proto P, class T, class Op, int W>
__device__ __forceinline__ bool reduce_slot(const Channel<P, T>& ch, int n, int slot,
                                            const Unit<W>& own, Unit<W>* out) {
  constexpr int B = reduce_batch_size<NR>();
  UnitAcc<T, Op, W> acc;
  if constexpr (NR == 1) {
    acc.init(own);  // a group of one: nothing to read
  } else if constexpr (NR > 0) {
#pragma unroll
    for (int s0 = 0; s0 < NR; s0 += B)
      if (!reduce_batch<B>(ch, s0, NR, slot, own, &acc)) return false;
  } else {
#pragma unroll 1
    for (int s0 = 0; s0 < n; s0 += B)
      if (!reduce_batch<B>(ch, s0, n, slot, own, &acc)) return false;
  }
  *out = acc.result();
  return true;
}

// Sends `u` to slot `slot` of every peer, next rank first.
template <int NR, Proto P, class T, int W>
__device__ __forceinline__ void send_to_peers(const Channel<P, T>& ch, int n, int slot,
                                              const Unit<W>& u) {
  const int rank = ch.v.rank;
  if constexpr (NR > 0) {
#pragma unroll
    for (int k = 1; k < NR; ++k) ch.send(peer_at(rank, k, NR), slot, u);
  } else {
#pragma unroll 1
    for (int k = 1; k < n; ++k) ch.send(peer_at(rank, k, n), slot, u);
  }
}

}  // namespace jaxll
