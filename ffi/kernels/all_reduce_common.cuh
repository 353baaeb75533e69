// Shared pieces of the all-reduce kernels: arguments, the block's share of the
// message, transfer units, and one "channel" per synchronisation protocol.
//
// A message is cut into transfer units (8 bytes for LL16, 16 bytes otherwise).
// Block b of every rank owns the same contiguous span of units and moves it in
// rounds of at most `round_units`; every round of a block is non-empty, and each
// rank sends to each peer in every round, so receiving a peer's round i proves
// the peer finished round i-1 and scratch can alternate by epoch parity with no
// barrier between rounds or calls.
#pragma once

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

// Bytes per transfer unit of a protocol.
template <Proto P>
__host__ __device__ constexpr int unit_bytes() {
  return P == Proto::kLL ? 8 : 16;
}

// A transfer unit's payload: W/8 raw 8-byte packets.
template <int W>
struct Unit {
  uint64_t p[W / 8];
};

// Loads unit `u` of `x` (elements past `count` read as zero bits).
template <class T, int W>
__device__ __forceinline__ Unit<W> load_unit(const T* x, int64_t u, int64_t count, bool vec) {
  Unit<W> r;
  constexpr int E = W / static_cast<int>(sizeof(T));
  if constexpr (W == 16) {
    if (vec && (u + 1) * E <= count) {
      const uint4 q = *reinterpret_cast<const uint4*>(x + u * E);
      r.p[0] = static_cast<uint64_t>(q.x) | static_cast<uint64_t>(q.y) << 32;
      r.p[1] = static_cast<uint64_t>(q.z) | static_cast<uint64_t>(q.w) << 32;
      return r;
    }
  }
#pragma unroll
  for (int k = 0; k < W / 8; ++k) r.p[k] = load_packet(x, u * (W / 8) + k, count, vec);
  return r;
}

template <class T, int W>
__device__ __forceinline__ void store_unit(T* y, int64_t u, int64_t count, bool vec,
                                           const Unit<W>& v) {
  constexpr int E = W / static_cast<int>(sizeof(T));
  if constexpr (W == 16) {
    if (vec && (u + 1) * E <= count) {
      *reinterpret_cast<uint4*>(y + u * E) =
          make_uint4(static_cast<uint32_t>(v.p[0]), static_cast<uint32_t>(v.p[0] >> 32),
                     static_cast<uint32_t>(v.p[1]), static_cast<uint32_t>(v.p[1] >> 32));
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < W / 8; ++k) store_packet(y, u * (W / 8) + k, count, vec, v.p[k]);
}

template <int W>
__device__ __forceinline__ Unit<W> poison_unit() {
  Unit<W> r;
#pragma unroll
  for (int k = 0; k < W / 8; ++k) r.p[k] = ~0ull;
  return r;
}

// Reduction of units in rank order.
template <class T, class Op, int W>
struct UnitAcc {
  PacketAcc<T, Op> acc[W / 8];
  __device__ __forceinline__ void init(const Unit<W>& v) {
#pragma unroll
    for (int k = 0; k < W / 8; ++k) acc[k].init(v.p[k]);
  }
  __device__ __forceinline__ void add(const Unit<W>& v) {
#pragma unroll
    for (int k = 0; k < W / 8; ++k) acc[k].add(v.p[k]);
  }
  __device__ __forceinline__ Unit<W> result() const {
    Unit<W> r;
#pragma unroll
    for (int k = 0; k < W / 8; ++k) r.p[k] = acc[k].result();
    return r;
  }
};

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
    ld_relaxed_v2u64(from(src) + slot * 16, &u->p[0], &u->p[1]);
    return !sentinel_present<T>(u->p[0]) && !sentinel_present<T>(u->p[1]);
  }
  __device__ __forceinline__ void release(int src, int slot) const {
    st_relaxed_v2u64(const_cast<char*>(from(src)) + slot * 16, kSentinelWord, kSentinelWord);
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
// it where there is room, so it runs beside the data path); at the end the
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
