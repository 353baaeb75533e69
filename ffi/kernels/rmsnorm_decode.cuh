// The fused call's decode-shape kernel: the one-shot all-reduce's rounds
// (oneshot.cuh) with the residual add and the row's norm as their epilogue.
//
// The cut (rmsnorm_plan.cc, lean): one row-wave, each block one segment of one
// row, moved in one round with at most one unit a thread. The block's share is
// its segment of the flattened (tokens, hidden) array; the one-shot body pushes
// it to every peer and reduces the N contributions in rank order (bitwise what
// jaxll.all_reduce gives), and the epilogue adds the residual in float32,
// rounds once (new_residual), adds the squares of the rounded values in the
// row's one order (square_tree.cuh), combines the block's node with the row's
// other blocks (rmsnorm_row_total.cuh), and writes
// normed = round(new_residual * rsqrt(mean + eps)) * weight for its units.
//
// P is the exchange: LL16 (8-byte units) or sentinel (16-byte units stored
// straight into sentinel-filled scratch and reset after reading: half LL16's
// bytes; a row's bytes must be a multiple of 16). The sentinel reset needs no
// fence here: the call has one round, and the kernel boundary orders the
// resets before this rank's next call's sends.
#pragma once

#include "kernels/oneshot.cuh"
#include "kernels/rmsnorm_row_total.cuh"

namespace jaxll {

// The decode-shape kernel's epilogue (see oneshot.cuh for the calling
// contract). It keeps this thread's unit of the residual, the weight and
// new_residual in registers from its prefetch to the norm.
template <class T, int W>
struct DecodeNorm {
  static constexpr bool kOneUnitPerThread = true;

  const RmsNormArgs& a;
  WaveBlock wb;
  bool vec;
  bool has = false;       // this thread holds a unit of the segment
  bool entered = false;   // (clustered: this thread has waited out the entry barrier)
  uint64_t tag0 = 0;
  int64_t unit = 0;       // its unit of the flattened array
  float node = 0.f;       // the tree node of its unit's squares
  Unit<W> rv{}, wv{}, hv{};

  __device__ __forceinline__ explicit DecodeNorm(const RmsNormArgs& args)
      : a(args), wb(wave_block(args)), vec(arrays_aligned(args, W)) {
    if (wb.row >= a.tokens) __trap();  // (a decode-shape plan has one row-wave)
  }
  // The block's segment of the flattened array, one round.
  __device__ __forceinline__ BlockShare share() const {
    const int64_t at = static_cast<int64_t>(wb.row) * a.row_units + wb.u0;
    return BlockShare{at, at + wb.len, 1u};
  }
  __device__ __forceinline__ void enter() {
    if (a.clustered) wave_cluster_begin(a.segments);
  }
  // The residual and weight are loaded before the epochs, so that their
  // latencies hide behind the handshake and the peers' data.
  __device__ __forceinline__ void prefetch(int64_t u, bool mine) {
    tag0 = read_tag(a.base.view, wb.slots);
    has = mine;
    unit = u;
    if (mine) {
      rv = load_unit<T, W>(static_cast<const T*>(a.residual), u, a.base.count, vec);
      wv = load_unit<T, W>(static_cast<const T*>(a.weight), wb.u0 + threadIdx.x, a.hidden, vec);
    }
  }
  __device__ __forceinline__ void before_reduce(int64_t) {}
  __device__ __forceinline__ void reduced(int64_t u, const Unit<W>& sum, bool ok) {
    hv = ok ? residual_add<T, W>(sum, rv, &node) : poison_unit<W>();
    store_unit<T, W>(static_cast<T*>(a.new_residual), u, a.base.count, vec, hv);
  }
  __device__ __forceinline__ void after_pass(int64_t, int) {}  // (the squares: in finish)
  // The row's sum of squares, then the norm of this thread's unit (the call's
  // only round: no fence, and no barrier to end it).
  __device__ __forceinline__ bool finish(const BlockStart& bs, bool* ok) {
    RowSquares sq;
    sq.pass(node, wb.len, *ok);  // (one pass: thread t holds the segment's unit t)
    float total;
    if (!wave_total(a, wb.g, sq, tag0, bs.epoch, ok, &entered, &total)) {
      poison_segments<T, W>(a, wb.g);
      return false;
    }
    const float inv = rsqrtf(total / static_cast<float>(a.hidden) + a.eps);
    if (has) {
      const Unit<W> out = norm_unit<T, W>(hv, wv, inv);
      store_unit<T, W>(static_cast<T*>(a.normed), unit, a.base.count, vec,
                       *ok ? out : poison_unit<W>());
    }
    end_slot_waves(a.base.view, wb.slots, tag0, 1);
    return true;
  }
  __device__ __forceinline__ void poison(const BlockShare&) { poison_segments<T, W>(a, wb.g); }
  __device__ __forceinline__ void give_up(const BlockShare&) {
    wave_give_up<T, W>(a, wb.g, &entered);
  }
};

// One block of the decode-shape kernel. NR: the group size it is compiled for
// (2, 4, 8; 0: any).
template <class T, int NR, Proto P>
__device__ __forceinline__ void rmsnorm_decode(const RmsNormArgs& a) {
  DecodeNorm<T, unit_bytes<P>()> epi(a);
  oneshot_body<P, T, SumOp, NR>(a.base, epi.share(), epi.vec, epi);
}

}  // namespace jaxll
