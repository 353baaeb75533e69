// What the bit-moving collectives share (all-gather, reduce-scatter, ppermute,
// all-to-all: gather_scatter.cu, exchange.cu): pieces of a message laid out in
// interleaved segments, a block's rounds, and the protocol of an algorithm.
#pragma once

#include <cstdint>
#include <type_traits>

#include "jaxll/flag_barrier.cuh"
#include "kernels/call_args.cuh"
#include "kernels/types.h"

namespace jaxll {

// Where the units of each piece lie in a message of n interleaved pieces:
// unit u of piece r is unit `u % seg_units` of the segment that starts at
// element ((u / seg_units) * n + r) * segment.
template <class T, int W>
struct Pieces {
  T* base;
  int64_t segment, seg_units;
  int n;
  bool whole;  // one segment per piece (no division)

  __device__ __forceinline__ Pieces(T* b, int64_t count, int64_t seg, int nranks)
      : base(b), segment(seg), seg_units(seg * static_cast<int64_t>(sizeof(T)) / W), n(nranks),
        whole(seg == count) {}

  // The segment of piece r holding unit u, and u's index in it.
  __device__ __forceinline__ T* at(int r, int64_t u, int64_t* unit_in_segment) const {
    if (whole) {
      *unit_in_segment = u;
      return base + r * segment;
    }
    // (32-bit division where it fits, as it does below 32 GiB of units)
    const int64_t s = (u | seg_units) >> 32 == 0
                          ? static_cast<uint32_t>(u) / static_cast<uint32_t>(seg_units)
                          : u / seg_units;
    *unit_in_segment = u - s * seg_units;
    return base + (s * n + r) * segment;
  }
  __device__ __forceinline__ Unit<W> load(int r, int64_t u, bool vec) const {
    int64_t k;
    const T* p = at(r, u, &k);
    return load_unit<std::remove_const_t<T>, W>(p, k, segment, vec);
  }
  __device__ __forceinline__ void store(int r, int64_t u, bool vec, const Unit<W>& v) const {
    int64_t k;
    T* p = at(r, u, &k);
    store_unit<T, W>(p, k, segment, vec, v);
  }
  // Poisons this block's units of every piece.
  __device__ __forceinline__ void poison(const BlockShare& share, bool vec) const {
    for (int r = 0; r < n; ++r)
      for (int64_t u = share.u0 + threadIdx.x; u < share.u1; u += blockDim.x)
        store(r, u, vec, poison_unit<W>());
  }
};

// Whether segments of `p` take whole-unit vector accesses.
template <class T, int W>
__device__ __forceinline__ bool vector_pieces(const Pieces<T, W>& p) {
  return reinterpret_cast<uintptr_t>(p.base) % W == 0 &&
         (p.segment * static_cast<int64_t>(sizeof(T))) % W == 0;
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

// The protocol of a one-shot algorithm (false: not one).
inline bool proto_of(Algorithm algorithm, Proto* p) {
  switch (algorithm) {
    case Algorithm::kOneShotLL: *p = Proto::kLL; return true;
    case Algorithm::kOneShotSentinel: *p = Proto::kSentinel; return true;
    case Algorithm::kOneShotBarrier: *p = Proto::kBarrier; return true;
    default: return false;
  }
}
}  // namespace jaxll
