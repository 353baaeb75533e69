// What the bit-moving collectives share (all-gather, reduce-scatter, ppermute,
// all-to-all: gather_scatter.cu, exchange.cu): pieces of a message laid out in
// interleaved segments, a block's rounds, and the protocol of an algorithm.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "jaxll/flag_barrier.cuh"
#include "kernels/call_args.cuh"
#include "kernels/types.h"

namespace jaxll {

// Where the units of each piece lie in a message of n interleaved pieces of
// `count` elements: element q of piece r is element `q % segment` of the
// segment that starts at element ((q / segment) * n + r) * segment.
//   Packed = false   every segment is the whole piece or a whole number of
//                    transfer units: unit u of piece r is unit `u % seg_units`
//                    of one segment and moves as one access.
//   Packed = true    any segment that divides the piece (runs shorter than a
//                    unit, or not a multiple of one): a unit gathers its
//                    elements one by one from the runs they lie in.
// A kernel takes the packed form only where a layout needs it
// (pieces_packed), so the whole-unit form keeps its registers.
template <class T, int W, bool Packed>
struct Pieces {
  using Elem = std::remove_const_t<T>;
  using Bits = std::conditional_t<std::is_const_v<T>, const typename ElemTraits<Elem>::Bits,
                                  typename ElemTraits<Elem>::Bits>;
  static constexpr int E = W / static_cast<int>(sizeof(T));
  T* base;
  int64_t count, segment, seg_units;
  int n;
  bool whole;  // one segment per piece (no division)

  __device__ __forceinline__ Pieces(T* b, int64_t count_, int64_t seg, int nranks)
      : base(b), count(count_), segment(seg),
        seg_units(seg * static_cast<int64_t>(sizeof(T)) / W), n(nranks), whole(seg == count_) {}

  __device__ __forceinline__ Unit<W> load(int r, int64_t u, bool vec) const {
    if constexpr (Packed) {
      return gather(r, u);
    } else {
      int64_t k;
      const T* p = at(r, u, &k);
      return load_unit<Elem, W>(p, k, segment, vec);
    }
  }
  __device__ __forceinline__ void store(int r, int64_t u, bool vec, const Unit<W>& v) const {
    if constexpr (Packed) {
      scatter(r, u, v);
    } else {
      int64_t k;
      T* p = at(r, u, &k);
      store_unit<Elem, W>(p, k, segment, vec, v);
    }
  }
  // Poisons this block's units of every piece.
  __device__ __forceinline__ void poison(const BlockShare& share, bool vec) const {
    for (int r = 0; r < n; ++r)
      for (int64_t u = share.u0 + threadIdx.x; u < share.u1; u += blockDim.x)
        store(r, u, vec, poison_unit<W>());
  }
  // Whether this layout takes whole-unit vector accesses.
  __device__ __forceinline__ bool vector() const {
    return !Packed && reinterpret_cast<uintptr_t>(base) % W == 0 &&
           (segment * static_cast<int64_t>(sizeof(T))) % W == 0;
  }

 private:
  // (32-bit division where it fits, as it does below 4 Gi units or elements)
  __device__ __forceinline__ static int64_t divide(int64_t a, int64_t b) {
    return (a | b) >> 32 == 0 ? static_cast<uint32_t>(a) / static_cast<uint32_t>(b) : a / b;
  }
  // The segment of piece r holding unit u, and u's index in it.
  __device__ __forceinline__ T* at(int r, int64_t u, int64_t* unit_in_segment) const {
    if (whole) {
      *unit_in_segment = u;
      return base + r * segment;
    }
    const int64_t s = divide(u, seg_units);
    *unit_in_segment = u - s * seg_units;
    return base + (s * n + r) * segment;
  }
  // Where the first element of unit u of piece r lies, and its place in its run.
  __device__ __forceinline__ Bits* element(int r, int64_t u, int64_t* in_run) const {
    const int64_t q = u * E;
    const int64_t s = divide(q, segment);
    *in_run = q - s * segment;
    return reinterpret_cast<Bits*>(base) + (s * n + r) * segment + *in_run;
  }
  // Unit u of piece r element by element (elements past the piece read as zero bits).
  __device__ __forceinline__ Unit<W> gather(int r, int64_t u) const {
    std::remove_const_t<Bits> b[E];
    int64_t k;
    const Bits* p = element(r, u, &k);
    const int64_t left = count - u * E;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      b[e] = e < left ? *p : 0;
      ++p;
      if (++k == segment) {  // on to the piece's next run
        k = 0;
        p += (n - 1) * segment;
      }
    }
    Unit<W> v;
    memcpy(v.p, b, W);
    return v;
  }
  __device__ __forceinline__ void scatter(int r, int64_t u, const Unit<W>& v) const {
    std::remove_const_t<Bits> b[E];
    memcpy(b, v.p, W);
    int64_t k;
    Bits* p = element(r, u, &k);
    const int64_t left = count - u * E;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if (e < left) *p = b[e];
      ++p;
      if (++k == segment) {
        k = 0;
        p += (n - 1) * segment;
      }
    }
  }
};

// Whether pieces of `count` elements of `elem_bytes` bytes in segments of
// `segment` need the packed form for units of `unit` bytes (host and device).
__host__ __device__ constexpr bool pieces_packed(int64_t count, int64_t segment, int elem_bytes,
                                                 int unit) {
  return segment != count && (segment * elem_bytes) % unit != 0;
}

// Round r of this block: its epoch, scratch parity and units [r0, r0 + len).
struct RoundPlace {
  uint64_t epoch;
  int parity;
  int64_t r0;
  int len;
};
__device__ __forceinline__ RoundPlace round_place(const AllReduceArgs& a, const BlockShare& share,
                                                  const BlockStart& bs, uint32_t r) {
  RoundPlace p;
  p.epoch = bs.epoch + r;
  p.parity = static_cast<int>(p.epoch & 1);
  p.r0 = share.u0 + static_cast<int64_t>(r) * a.round_units;
  p.len = static_cast<int>(min(share.u1 - p.r0, a.round_units));
  return p;
}

// What a round does before its sends: LL16's periodic refresh of the slots, or
// the barrier protocol's first flag barrier (peers are done with the scratch).
template <Proto P>
__device__ __forceinline__ void round_start(const RankView& v, const RoundPlace& p, bool* ok) {
  if constexpr (P == Proto::kLL) {
    ll_round_begin(v, p.epoch, p.parity);
  }
  if constexpr (P == Proto::kBarrier) *ok = flag_barrier(v, barrier_value(p.epoch, 0), wait_context(v, p.epoch)) && *ok;
}

// The barrier protocol's second flag barrier (every peer's sends have landed).
template <Proto P>
__device__ __forceinline__ void round_sent(const RankView& v, const RoundPlace& p, bool* ok) {
  if constexpr (P == Proto::kBarrier) *ok = flag_barrier(v, barrier_value(p.epoch, 1), wait_context(v, p.epoch)) && *ok;
}

// Threads of this block that carry data lanes: all but the spare warp, whose
// last n-1 threads exchange the call's signature (jaxll/round.cuh) and wait for
// their peers' before anything else: a lane of theirs would add that wait to
// its unit.
__device__ __forceinline__ uint32_t lane_threads(const RankView& v) {
  return v.signatures && v.nranks > 1 && blockDim.x > 32 ? blockDim.x - 32 : blockDim.x;
}

// Round p of an exchange in which piece j of this rank's input `x` goes to
// rank j (an all-to-all, a reduce-scatter's first half): every (piece, unit)
// pair is a lane of its own, so the N-1 sends of a unit run side by side, and
// a thread issues the loads of B lanes before their stores (a send is a
// volatile store, which no load moves past; B is bounded by the registers the
// caller leaves). `own`, where not null, takes this rank's own piece (an
// all-to-all's copy to its output).
template <int B, Proto P, class T, int W, bool K>
__device__ __forceinline__ void send_pieces(const Channel<P, T>& ch,
                                            const Pieces<const T, W, K>& x, bool vx,
                                            const RoundPlace& p, const Pieces<T, W, K>* own,
                                            bool vown) {
  const int rank = ch.v.rank;
  const int n = ch.v.nranks;
  const int first = own != nullptr ? 0 : 1;  // (piece offset 0 is this rank's own)
  const uint32_t len = static_cast<uint32_t>(p.len);
  const uint32_t lanes = static_cast<uint32_t>(n - first) * len;
  const uint32_t threads = lane_threads(ch.v);
  for (uint32_t j0 = threadIdx.x; j0 < lanes && threadIdx.x < threads; j0 += B * threads) {
    Unit<W> u[B];
    int to[B];
    uint32_t slot[B];
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const uint32_t j = j0 + b * threads;
      to[b] = -1;
      if (j < lanes) {
        const uint32_t k = j / len;
        slot[b] = j - k * len;
        to[b] = peer_at(rank, static_cast<int>(k) + first, n);
        u[b] = x.load(to[b], p.r0 + slot[b], vx);
      }
    }
#pragma unroll
    for (int b = 0; b < B; ++b) {
      if (to[b] == rank) {
        own->store(rank, p.r0 + slot[b], vown, u[b]);
      } else if (to[b] >= 0) {
        ch.send(to[b], static_cast<int>(slot[b]), ch.prepare(u[b]));
      }
    }
  }
}

// Round p's receive of an exchange in which every peer's piece lands in its
// place in `y` (an all-gather, an all-to-all): every (peer, unit) pair is a
// lane of its own, so the waits on different peers run side by side. A lane
// whose wait gave up, or that follows one in this thread, stores the poison.
template <Proto P, class T, int W, bool K>
__device__ __forceinline__ void receive_pieces(const Channel<P, T>& ch, const Pieces<T, W, K>& y,
                                               bool vy, const RoundPlace& p, bool* ok) {
  const int rank = ch.v.rank;
  const int n = ch.v.nranks;
  const uint32_t len = static_cast<uint32_t>(p.len);
  const uint32_t lanes = static_cast<uint32_t>(n - 1) * len;
  const uint32_t threads = lane_threads(ch.v);
  for (uint32_t j = threadIdx.x; j < lanes && threadIdx.x < threads; j += threads) {
    const uint32_t k = j / len;
    const uint32_t slot = j - k * len;
    const int src = peer_at(rank, static_cast<int>(k) + 1, n);
    Unit<W> u;
    if (*ok) *ok = channel_recv<P, T, W>(ch, src, static_cast<int>(slot), &u);
    y.store(src, p.r0 + slot, vy, *ok ? u : poison_unit<W>());
  }
}

// Threads of a block that moves a piece in rounds of `work` units per peer
// over `nranks` ranks: a lane per (peer, unit) pair, up to kBlockThreads, and
// a spare warp for the call signatures (jaxll/round.cuh) where there is room.
inline int piece_lane_threads(int64_t work, int nranks, bool signatures) {
  const int64_t lanes = work * (nranks > 1 ? nranks - 1 : 1);
  const int64_t sig_warp = nranks > 1 && signatures ? 32 : 0;
  return static_cast<int>(std::min<int64_t>(kBlockThreads, (lanes + 31) / 32 * 32 + sig_warp));
}

// The protocol of a one-shot algorithm (false: not one).
inline bool proto_of(Algorithm algorithm, Proto* p) {
  switch (algorithm) {
    case Algorithm::kOneShotLL: *p = Proto::kLL; return true;
    case Algorithm::kOneShotSentinel: *p = Proto::kSentinel; return true;
    case Algorithm::kOneShotBarrier: *p = Proto::kBarrier; return true;
    default: return false;
  }
}

// Bytes of a one-shot algorithm's transfer unit (0: not one).
inline int unit_bytes_of(Algorithm algorithm) {
  Proto p;
  if (!proto_of(algorithm, &p)) return 0;
  return p == Proto::kLL ? unit_bytes<Proto::kLL>() : unit_bytes<Proto::kSentinel>();
}

}  // namespace jaxll
