// A row's sum of squares in one order, whatever the cut of the call.
//
// The fused kernel's cut (how many blocks share a row, how many threads a
// block has, which exchange moves the units, how many rounds a segment takes)
// changes with the token count, the group, the device and the exchange. The
// sum of a row's squares is added in one order that depends on the row's
// length alone: a pairwise tree over its elements, padded with zeros to a
// power of two. Leaves 2i and 2i+1 are added first, then those sums two by
// two, and so on up to the root. Every part of the cut computes whole nodes of
// that tree:
//   a thread          the node of its unit's E elements (unit_node)
//   a warp            the node of 32 consecutive units, by a butterfly of
//                     shuffles (warp_node: lanes l and l^m add the same two
//                     values, and float addition is commutative)
//   a pass            the node of the block's units of one pass (thread t
//                     unit first + t) from its warps' nodes, by a butterfly
//   a block           the tree over its passes' nodes, pair by pair as they
//                     come (RowSquares, rmsnorm_row_total.cuh)
//   a row's blocks    the tree over the S blocks' nodes
// That needs every pass and every segment to start where a node of its size
// starts: the planner cuts a row split over blocks into segments of a
// power-of-two number of units, and a segment of several rounds into rounds
// of a power-of-two number of units; a round of more units than threads has
// 512 threads. Zeros pad every part past the row's end, and x + 0 is x, so a
// node's bits do not depend on how far the padding reaches. Adds are
// __fadd_rn and squares __fmul_rn, which the compiler never contracts into a
// fused multiply-add whose rounding would differ from kernel to kernel.
//
// The cost is that of a float sum: a thread adds E squares, a warp five
// shuffles and a block one barrier per pass, and a row one tree over its
// blocks. A build with JAXLL_NORM_FLOAT_SUM defined adds in the cut's order
// instead (a thread's running sum over its passes, then the same butterflies
// over warps and blocks, one barrier in all) and cuts rows freely; its rows
// change bits with the cut, and it exists to measure what the one order costs
// (benchmarks/norm_invariance_cost.py).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define JAXLL_TREE_FN __host__ __device__ __forceinline__
#else
#define JAXLL_TREE_FN inline
#endif

namespace jaxll {

#if defined(JAXLL_NORM_FLOAT_SUM)
constexpr bool kFixedOrderNorm = false;
#else
constexpr bool kFixedOrderNorm = true;
#endif

// Levels of pass nodes a block keeps pending (up to 2^24 passes over its
// segment of a row).
constexpr int kNormLevels = 24;

JAXLL_TREE_FN float tree_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;  // (host: built with -ffp-contract=off)
#endif
}

JAXLL_TREE_FN float tree_square(float h) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(h, h);
#else
  return h * h;
#endif
}

// The node of E leaves (E a power of two): pairs first.
template <int E>
JAXLL_TREE_FN float unit_node(float (&v)[E]) {
#pragma unroll
  for (int width = 1; width < E; width *= 2) {
#pragma unroll
    for (int i = 0; i < E; i += 2 * width) v[i] = tree_add(v[i], v[i + width]);
  }
  return v[0];
}

// The tree over `count` nodes (zeros past them, up to a power of two), in
// place: the reference every part of the cut must reproduce (host tests).
inline float tree_of(float* v, int64_t count) {
  if (count <= 0) return 0.f;
  while (count > 1) {
    const int64_t half = (count + 1) / 2;
    for (int64_t i = 0; i < half; ++i) {
      v[i] = 2 * i + 1 < count ? tree_add(v[2 * i], v[2 * i + 1]) : v[2 * i];
    }
    count = half;
  }
  return v[0];
}

#if defined(__CUDACC__)
// The node of the warp's 32 lanes' nodes (every lane gets it; every lane must call).
__device__ __forceinline__ float warp_node(float v) {
#pragma unroll
  for (int m = 1; m < 32; m *= 2) v = tree_add(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

#endif

}  // namespace jaxll
