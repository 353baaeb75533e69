// The fused call's cut on the device (rmsnorm_plan.cc plans it): which rows
// and units a block holds, the row-norm arithmetic, and poisoning.
#pragma once

#include "kernels/call_args.cuh"
#include "kernels/rmsnorm_args.h"
#include "kernels/square_tree.cuh"

namespace jaxll {

// This block's units [u0, u1) of every row it holds.
struct Segment {
  int64_t u0, u1;
  int64_t group;  // first row (rows group, group + W, ...)
  int64_t rows;   // how many rows it holds
};

__device__ __forceinline__ Segment segment_of(const RmsNormArgs& a) {
  Segment g;
  const int64_t seg = blockIdx.x % a.segments;
  const int64_t rows_at_once = gridDim.x / a.segments;
  g.group = blockIdx.x / a.segments;
  g.u0 = seg * a.seg_span;
  g.u1 = min(a.row_units, g.u0 + a.seg_span);
  g.rows = a.tokens > g.group ? (a.tokens - g.group + rows_at_once - 1) / rows_at_once : 0;
  return g;
}

// Whether all five of the call's arrays are aligned to `w` bytes (the units'
// vector loads and stores; else element by element).
__device__ __forceinline__ bool arrays_aligned(const RmsNormArgs& a, int w) {
  return ((reinterpret_cast<uintptr_t>(a.x) | reinterpret_cast<uintptr_t>(a.residual) |
           reinterpret_cast<uintptr_t>(a.weight) | reinterpret_cast<uintptr_t>(a.new_residual) |
           reinterpret_cast<uintptr_t>(a.normed)) % w) == 0;
}

// The block's part of a call of one row-wave (the decode-shape and two-shot
// kernels): segment `seg` of row `row`, the row's units [u0, u0 + len);
// `slots`: the row's blocks add their partial sums through the header's slots;
// `g` the same as the general kernel's Segment, for the failure paths they share.
struct WaveBlock {
  int seg, row, u0, len;
  bool slots;
  Segment g;
};

__device__ __forceinline__ WaveBlock wave_block(const RmsNormArgs& a) {
  WaveBlock b;
  b.seg = static_cast<int>(blockIdx.x) % a.segments;
  b.row = static_cast<int>(blockIdx.x) / a.segments;
  const int span = static_cast<int>(a.seg_span);
  b.u0 = b.seg * span;
  b.len = min(static_cast<int>(a.row_units) - b.u0, span);
  b.slots = a.segments > 1 && !a.clustered;
  b.g.u0 = b.u0;
  b.g.u1 = b.u0 + b.len;
  b.g.group = b.row;
  b.g.rows = 1;
  return b;
}

// The tag of this call's row-waves where the block uses the header's slots: the
// last call's last block advanced it, and the kernel boundary made that
// visible (read after the grid dependency wait, before any of this call's packets).
__device__ __forceinline__ uint64_t read_tag(const RankView& v, bool slots) {
  return slots ? *reinterpret_cast<volatile uint64_t*>(&v.header->norm_tag) : 0;
}

// The last block of the call moves the tag past this call's `waves`
// row-waves, so that the next call's packets never match a stale one (only
// calls that used the header's slots: the others leave both the slots and the
// tag as they were). Thread 0 of every block calls it after its last packet.
__device__ __forceinline__ void end_slot_waves(const RankView& v, bool slots, uint64_t tag0,
                                               uint64_t waves) {
  if (slots && threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&v.header->norm_done, 1ull) == gridDim.x - 1) {
      v.header->norm_done = 0;
      v.header->norm_tag = tag0 + waves;
    }
  }
}

// (W: the bytes of the units g counts in)
template <class T, int W = 8>
__device__ __forceinline__ void poison_segments(const RmsNormArgs& a, const Segment& g) {
  T* nr = static_cast<T*>(a.new_residual);
  T* no = static_cast<T*>(a.normed);
  const int64_t rows_at_once = gridDim.x / a.segments;
  for (int64_t k = 0; k < g.rows; ++k) {
    const int64_t row = g.group + k * rows_at_once;
    for (int64_t u = g.u0 + threadIdx.x; u < g.u1; u += blockDim.x) {
      store_unit<T, W>(nr + row * a.hidden, u, a.hidden, false, poison_unit<W>());
      store_unit<T, W>(no + row * a.hidden, u, a.hidden, false, poison_unit<W>());
    }
  }
}

// new_residual's unit: the reduced sum plus the residual, added in float32
// and rounded once; *node: the tree node of the rounded values' squares.
template <class T, int W = 8>
__device__ __forceinline__ Unit<W> residual_add(const Unit<W>& sum, const Unit<W>& rv,
                                                float* node) {
  using Tr = ElemTraits<T>;
  constexpr int E = W / static_cast<int>(sizeof(T));
  T s[E], q[E], o[E];
  float sq[E];
  memcpy(s, sum.p, W);
  memcpy(q, rv.p, W);
#pragma unroll
  for (int e = 0; e < E; ++e) {
    o[e] = Tr::from_acc(Tr::to_acc(s[e]) + Tr::to_acc(q[e]));
    const float h = Tr::to_acc(o[e]);
    sq[e] = tree_square(h);
  }
  *node = unit_node<E>(sq);
  Unit<W> out;
  memcpy(out.p, o, W);
  return out;
}

// normed's unit: new_residual times the inverse root mean square, rounded,
// times the weight (in the element type).
template <class T, int W = 8>
__device__ __forceinline__ Unit<W> norm_unit(const Unit<W>& hv, const Unit<W>& wv, float inv) {
  using Tr = ElemTraits<T>;
  constexpr int E = W / static_cast<int>(sizeof(T));
  T h[E], wt[E], o[E];
  memcpy(h, hv.p, W);
  memcpy(wt, wv.p, W);
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const T scaled = Tr::from_acc(Tr::to_acc(h[e]) * inv);
    o[e] = Tr::from_acc(Tr::to_acc(scaled) * Tr::to_acc(wt[e]));
  }
  Unit<W> out;
  memcpy(out.p, o, W);
  return out;
}

}  // namespace jaxll
