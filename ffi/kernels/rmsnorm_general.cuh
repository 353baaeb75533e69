// The fused call's general kernel, for any cut on LL16: the one-shot
// all-reduce's rounds (oneshot.cuh), row after row, with the residual add as
// their epilogue and each row's norm after its rounds.
//
// Block b holds segment b % S of rows b / S, b / S + W, ... (W = gridDim.x / S
// rows at once); a segment goes in chunks of at most one scratch region (one
// round, one epoch each). After a row's rounds the S blocks of the row combine
// their partial sums of squares (rmsnorm_row_total.cuh: in a cluster, or
// through the header's tagged slots) and each block writes the norm of its
// segment. All blocks of the grid are co-resident (the grid bound), so a block
// waiting for its row's partial sums always ends.
#pragma once

#include "kernels/oneshot.cuh"
#include "kernels/rmsnorm_row_total.cuh"

namespace jaxll {

// The general kernel's epilogue (see oneshot.cuh for the calling contract):
// the residual add of every reduced unit, and the row's squares. A segment
// that one round moves with one unit a thread keeps its unit of new_residual
// and of the weight in registers for the norm.
template <class T>
struct RowsNorm {
  static constexpr bool kOneUnitPerThread = false;

  const RmsNormArgs& a;
  Segment g;
  int64_t chunks;     // rounds of a row's segment
  bool single;        // one round, at most one unit a thread
  bool vec;
  bool slots;         // the row's partial sums go through the header's slots
  bool entered = false;
  uint64_t tag0 = 0;
  int64_t row = 0;    // the row being reduced
  int64_t k = 0;      // its index among the block's rows
  RowSquares sq;      // the row's squares so far
  float node = 0.f;   // the tree node of this thread's unit of the current pass
  Unit<8> rv{}, kept_new{}, kept_w{};

  __device__ __forceinline__ explicit RowsNorm(const RmsNormArgs& args)
      : a(args), g(segment_of(args)) {
    chunks = (g.u1 - g.u0 + a.chunk_units - 1) / a.chunk_units;
    single = chunks == 1 && g.u1 - g.u0 <= static_cast<int64_t>(blockDim.x);
    vec = arrays_aligned(a, 8);
    slots = a.segments > 1 && !a.clustered;
  }
  // The block's segment of its `k`-th row in the flattened array.
  __device__ __forceinline__ BlockShare row_share(int64_t index) const {
    if (g.rows == 0) return BlockShare{0, 0, 0u};
    const int64_t r = g.group + index * (gridDim.x / a.segments);
    return BlockShare{r * a.row_units + g.u0, r * a.row_units + g.u1,
                      static_cast<uint32_t>(chunks)};
  }
  __device__ __forceinline__ void start_row(int64_t index) {
    k = index;
    row = g.group + index * (gridDim.x / a.segments);
    sq = RowSquares{};
  }
  __device__ __forceinline__ void enter() {
    if (a.clustered) cluster_entry_arrive();
  }
  __device__ __forceinline__ void prefetch(int64_t, bool) { tag0 = read_tag(a.base.view, slots); }
  // The residual (and the weight of a single-round segment) is loaded before
  // the wait for the peers, so that its latency hides behind theirs.
  __device__ __forceinline__ void before_reduce(int64_t u) {
    rv = load_unit<T, 8>(static_cast<const T*>(a.residual), u, a.base.count, vec);
    if (single) {
      kept_w = load_unit<T, 8>(static_cast<const T*>(a.weight), u - row * a.row_units, a.hidden, vec);
    }
  }
  __device__ __forceinline__ void reduced(int64_t u, const Unit<8>& sum, bool ok) {
    const Unit<8> out = ok ? residual_add<T>(sum, rv, &node) : poison_unit<8>();
    if (single) kept_new = out;
    store_unit<T, 8>(static_cast<T*>(a.new_residual), u, a.base.count, vec, out);
  }
  // A pass of the block over the row's units [u, u + len): its units' squares.
  __device__ __forceinline__ void after_pass(int64_t, int len) {
    sq.pass(node, len);
    node = 0.f;
  }
  // The row's sum of squares from its S blocks, then the norm of this block's
  // segment: new_residual (this block wrote it; the round's end ordered the
  // stores) times the inverse root mean square, rounded, times the weight.
  // `epoch`: the row's last round's.
  __device__ __forceinline__ void norm_row(uint64_t epoch, bool* ok) {
    bool all = true;  // (the rounds' end agreed on *ok already)
    const float part = sq.block_node(&all, true);
    const float total =
        a.segments == 1 ? part
        : a.clustered   ? cluster_row_total(part, static_cast<int>(k & 1), a.segments, ok, &entered)
                        : row_total(a, g, part, tag0 + static_cast<uint64_t>(k) + 1,
                                    static_cast<int>(k & 1), epoch, ok);
    const float inv = rsqrtf(total / static_cast<float>(a.hidden) + a.eps);
    const T* nr = static_cast<const T*>(a.new_residual) + row * a.hidden;
    T* no = static_cast<T*>(a.normed) + row * a.hidden;
    for (int64_t u = g.u0 + threadIdx.x; u < g.u1; u += blockDim.x) {
      const Unit<8> hv = single ? kept_new : load_unit<T, 8>(nr, u, a.hidden, vec);
      const Unit<8> wv = single ? kept_w : load_unit<T, 8>(static_cast<const T*>(a.weight), u, a.hidden, vec);
      const Unit<8> out = norm_unit<T>(hv, wv, inv);
      store_unit<T, 8>(no, u, a.hidden, vec, *ok ? out : poison_unit<8>());
    }
  }
  // The block failed in row k: poison every row it holds; a clustered block
  // still takes part in its row exchanges from row k on, flagged as failed.
  __device__ __forceinline__ bool finish(const BlockStart&, bool*) { return true; }
  __device__ __forceinline__ void poison(const BlockShare&) {
    poison_segments<T>(a, g);
    if (a.clustered) cluster_drain(a, g, k, &entered);
  }
  __device__ __forceinline__ void give_up(const BlockShare& s) { poison(s); }
};

// One block of the general kernel.
template <class T>
__device__ __forceinline__ void rmsnorm_general(const RmsNormArgs& a) {
  RowsNorm<T> epi(a);
  OneShotStart<8> s;
  const uint32_t rounds = static_cast<uint32_t>(epi.g.rows * epi.chunks);
  if (!oneshot_begin<Proto::kLL, T, 0>(a.base, epi.row_share(0), rounds, epi.vec, epi, &s)) return;
  bool ok = true;
  for (int64_t k = 0; k < epi.g.rows; ++k) {
    epi.start_row(k);
    const BlockShare share = epi.row_share(k);
    const uint64_t epoch0 = s.bs.epoch + static_cast<uint64_t>(k * epi.chunks);
    if (!oneshot_rounds<Proto::kLL, T, SumOp, 0>(a.base, share, epoch0, k == 0, s, epi.vec, epi,
                                                   &ok)) {
      return;
    }
    // Between rows the boundary orders this row's receives before the next
    // row's sends; after the call's last round the block only has to agree
    // on `ok` (and the barrier orders the new_residual stores before the norm
    // reads them): no system-scope fence.
    if (k + 1 == epi.g.rows ? block_failed(ok) : round_boundary(ok)) {
      epi.poison(share);
      return;
    }
    epi.norm_row(epoch0 + epi.chunks - 1, &ok);
  }
  end_slot_waves(a.base.view, epi.slots, epi.tag0, static_cast<uint64_t>(a.waves));
  if (block_failed(ok)) poison_segments<T>(a, epi.g);
}

}  // namespace jaxll
