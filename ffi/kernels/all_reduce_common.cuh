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
  int64_t count;        // elements per rank
  int64_t units;        // transfer units in the message
  int64_t span;         // units per block (the last block may have fewer, never zero)
  int64_t round_units;  // most units one block moves in one round
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
  s.rounds = static_cast<uint32_t>((s.u1 - s.u0 + a.round_units - 1) / a.round_units);
  return s;
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
//   prepare(v)                  what a value must become before it is sent
//   send(owner, slot, v)        store v into rank `owner`'s region from this rank
//   probe(src, slot, &v)        one load of this rank's region from `src`; true
//                               when the value there is this round's
//   release(src, slot)          make a slot that was read reusable
//   recv(src, slot, ctx, &v)    wait (bounded) for the value, then release it
template <Proto P, class T>
struct Channel;

template <class T>
struct Channel<Proto::kLL, T> {
  const RankView& v;
  int phase, block, parity;
  uint32_t flag;
  __device__ __forceinline__ Unit<8> prepare(Unit<8> u) const { return u; }
  __device__ __forceinline__ void send(int owner, int64_t slot, const Unit<8>& u) const {
    ll16_store(ll_region(v, owner, phase, block, parity, v.rank) + slot, u.p[0], flag);
  }
  __device__ __forceinline__ bool probe(int src, int64_t slot, Unit<8>* u) const {
    const uint4 q = ll16_load(ll_region(v, v.rank, phase, block, parity, src) + slot);
    u->p[0] = ll16_payload(q);
    return ll16_ready(q, flag);
  }
  __device__ __forceinline__ void release(int, int64_t) const {}
};

template <class T>
struct Channel<Proto::kSentinel, T> {
  const RankView& v;
  int phase, block, parity;
  uint32_t flag;
  __device__ __forceinline__ Unit<16> prepare(Unit<16> u) const {
    u.p[0] = sentinel_canonicalize<T>(u.p[0]);
    u.p[1] = sentinel_canonicalize<T>(u.p[1]);
    return u;
  }
  __device__ __forceinline__ void send(int owner, int64_t slot, const Unit<16>& u) const {
    st_relaxed_v2u64(sentinel_region(v, owner, phase, block, parity, v.rank) + slot * 16, u.p[0],
                     u.p[1]);
  }
  __device__ __forceinline__ bool probe(int src, int64_t slot, Unit<16>* u) const {
    ld_relaxed_v2u64(sentinel_region(v, v.rank, phase, block, parity, src) + slot * 16, &u->p[0],
                     &u->p[1]);
    return !sentinel_present<T>(u->p[0]) && !sentinel_present<T>(u->p[1]);
  }
  __device__ __forceinline__ void release(int src, int64_t slot) const {
    st_relaxed_v2u64(sentinel_region(v, v.rank, phase, block, parity, src) + slot * 16,
                     kSentinelWord, kSentinelWord);
  }
};

template <class T>
struct Channel<Proto::kBarrier, T> {
  const RankView& v;
  int phase, block, parity;
  uint32_t flag;
  __device__ __forceinline__ Unit<16> prepare(Unit<16> u) const { return u; }
  __device__ __forceinline__ void send(int owner, int64_t slot, const Unit<16>& u) const {
    st_relaxed_v2u64(plain_region(v, owner, phase, block, v.rank) + slot * 16, u.p[0], u.p[1]);
  }
  __device__ __forceinline__ bool probe(int src, int64_t slot, Unit<16>* u) const {
    ld_relaxed_v2u64(plain_region(v, v.rank, phase, block, src) + slot * 16, &u->p[0], &u->p[1]);
    return true;  // a barrier already ordered the data before this read
  }
  __device__ __forceinline__ void release(int, int64_t) const {}
};

template <Proto P, class T, int W>
__device__ __forceinline__ bool channel_recv(const Channel<P, T>& ch, int src, int64_t slot,
                                             const WaitContext& ctx, Unit<W>* u) {
  const bool ok = bounded_wait(ctx, static_cast<uint32_t>(src), [&] { return ch.probe(src, slot, u); });
  if (ok) ch.release(src, slot);
  return ok;
}

// Folds slot `slot` of every source's region into `acc` in rank order 0..n-1,
// with `own()` standing in for this rank. Sources are read in batches whose
// loads are issued together, so the data of a batch costs one memory round
// trip rather than one per source. False when a wait gave up.
template <Proto P, class T, class Op, int W, class Own>
__device__ __forceinline__ bool reduce_sources(const Channel<P, T>& ch, int n, int64_t slot,
                                               const WaitContext& ctx, Own&& own,
                                               UnitAcc<T, Op, W>* acc) {
  constexpr int kBatch = W == 8 ? 4 : 2;  // bounded by register pressure
  const int rank = ch.v.rank;
  for (int s0 = 0; s0 < n; s0 += kBatch) {
    Unit<W> val[kBatch];
    bool ready[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int src = s0 + j;
      ready[j] = src < n && src != rank && ch.probe(src, slot, &val[j]);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int src = s0 + j;
      if (src >= n) break;
      if (src == rank) {
        val[j] = own();
      } else if (ready[j]) {
        ch.release(src, slot);
      } else if (!channel_recv<P, T, W>(ch, src, slot, ctx, &val[j])) {
        return false;
      }
      if (src == 0) acc->init(val[j]); else acc->add(val[j]);
    }
  }
  return true;
}

// LL16 only: when due, rewrites every slot this rank sends to at `parity` (both
// phases, every peer) with an old flag, so no 32-bit flag ages to alias the
// current epoch. Every thread of the block must call it.
__device__ inline void ll_refresh_if_due(const RankView& v, uint64_t epoch, int parity,
                                         uint64_t* refreshed) {
  if (!ll16_refresh_due(epoch, refreshed[parity])) return;
  const uint32_t old_flag = static_cast<uint32_t>(epoch - 2);
  const int64_t slots = v.geo.region_bytes / 8;
  for (int phase = 0; phase < kPhases; ++phase)
    for (int k = 1; k < v.nranks; ++k) {
      const int peer = (v.rank + k) % v.nranks;
      LL16* r = ll_region(v, peer, phase, blockIdx.x, parity, v.rank);
      for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) ll16_store(r + s, 0ull, old_flag);
    }
  fence_sys();
  __syncthreads();
  refreshed[parity] = epoch;
}

// Ends a round that another round of this block follows: sentinel and atomic
// resets are made visible before this rank's next sends, and the block moves on
// together. Returns true if some thread's wait gave up.
__device__ __forceinline__ bool round_boundary(bool ok) {
  fence_sys();
  return __syncthreads_or(!ok) != 0;
}

template <class T, int W>
__device__ __forceinline__ void poison_units(T* y, int64_t from, int64_t to, int64_t count,
                                             bool vec) {
  for (int64_t u = from + threadIdx.x; u < to; u += blockDim.x)
    store_unit<T, W>(y, u, count, vec, poison_unit<W>());
}

}  // namespace jaxll
