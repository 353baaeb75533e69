// The fused call's two-shot kernel: each row segment's exchange in two shots
// (reduce-scatter, then all-gather of the sums), the residual add and the
// row's norm after them.
//
// Its units stay in registers from the exchange to the norm (K a thread); the
// two-shot all-reduce's rounds (twoshot.cuh) hand units to threads by
// destination rank instead, which would not.
#pragma once

#include "kernels/rmsnorm_row_total.cuh"

namespace jaxll {

// The signature lane (peer offset k, 0: none) of this thread in the two-shot
// kernel: the block's spare threads past the padded segment where it has n - 1
// of them (signature_lane), else the n - 1 threads from the next rank's chunk
// on, which only receive there. A lane waits for its peer's signature before
// its next step, and on a thread that reduces this rank's chunk that wait held
// back a sum every peer awaits (N=8 on one H200, 16 rows of 8192 bf16: 13.3 us
// a call with the block's last threads as lanes, 10.7 us with these).
__device__ __forceinline__ int twoshot_signature_lane(int rank, int n, int c, int padded) {
  const int threads = static_cast<int>(blockDim.x);
  if (padded + n - 1 <= threads) return signature_lane(n);
  const int first = ((rank + 1) % n) * c % threads;
  const int k = (static_cast<int>(threadIdx.x) - first + threads) % threads + 1;
  return k < n ? k : 0;
}

// One block of the two-shot kernel: the decode-shape kernel's kind of cut (one
// row-wave, a block per segment of a row, the row's blocks combined as there), with the
// segment's exchange done in two shots, as the two-shot all-reduce does with a
// round. The segment's len units are cut into N chunks of c = ceil(len / N)
// (the last padded with zeros, so every rank sends every peer something in
// both phases); rank j owns chunk j. Every rank stores chunk j of its x into
// rank j's phase-0 scratch; rank j reduces the N contributions in rank order
// (the same bits the one-shot kernels get) and stores the sum into every
// peer's phase-1 scratch; every rank then holds the whole segment's sum and
// adds its own residual (so new_residual is what the one-shot kernel gives,
// even where residuals differ across ranks). The bytes a rank moves are about
// 2(N-1)/N of the segment's instead of N-1 times it, which is what wins at
// N = 8 on one GPU's memory. A thread holds units i, i + blockDim.x, ... of
// the padded segment (K of them: 1, or kRmsNormTwoShotUnits for segments of
// more units than threads; K = 1 has no register spills on sm_90). Every
// thread does all its reductions before any of its receives: a receive waits
// for an owner's reduction, a reduction only for the sends that precede every
// wait, so no wait cycles.
// One round per call: the sentinel resets need no fence (as in the decode-shape kernel).
template <class T, int NR, Proto P, int K>
__device__ __forceinline__ void rmsnorm_twoshot(const RmsNormArgs& a) {
  constexpr int W = unit_bytes<P>();
  const RankView& v = a.base.view;
  const int n = NR > 0 ? NR : v.nranks;
  const int rank = v.rank;
  const bool vec = arrays_aligned(a, W);
  bool entered = false;
  if (a.clustered) wave_cluster_begin(a.segments);
  collective_prologue(a.base);
  const WaveBlock wb = wave_block(a);
  const int row = wb.row, u0 = wb.u0, len = wb.len;
  const bool slots = wb.slots;
  const uint64_t tag0 = read_tag(v, slots);
  Segment g = wb.g;
  const int c = (len + n - 1) / n;  // units per chunk (the last chunks padded)
  const int padded = n * c;
  if (row >= a.tokens || padded > K * static_cast<int>(blockDim.x)) __trap();  // (plan and launch disagree)
  const size_t at = static_cast<size_t>(row) * static_cast<size_t>(a.row_units) + u0;
  const int64_t count = a.tokens * a.hidden;
  // x and the residual are loaded before the epochs, so that the latencies
  // overlap; the weight after the exchange (registers: a thread holds two units).
  Unit<W> xv[K], rv[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    xv[k] = rv[k] = Unit<W>{};
    if (u < len) {
      xv[k] = load_unit<T, W>(static_cast<const T*>(a.x), at + u, count, vec);
      rv[k] = load_unit<T, W>(static_cast<const T*>(a.residual), at + u, count, vec);
    }
  }
  const BlockStart bs = block_begin(v, 1u);
  if (bs.had_error) {
    wave_give_up<T, W>(a, g, &entered);
    return;
  }
  const int sig_lane = !v.signatures || n == 1 ? 0 : twoshot_signature_lane(rank, n, c, padded);
  send_signature(a.base, sig_lane, n, bs);
  const uint64_t epoch = bs.epoch;
  const int parity = static_cast<int>(epoch & 1);
  const Channel<P, T> rs(v, 0, static_cast<int>(blockIdx.x), parity, epoch);
  const Channel<P, T> ag(v, 1, static_cast<int>(blockIdx.x), parity, epoch);
  if constexpr (P == Proto::kLL) {
    ll_round_begin(v, epoch, parity);
  }
  // Reduce-scatter: unit u goes to its owner's slot u - owner * c.
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    xv[k] = rs.prepare(xv[k]);  // (sentinel: the value every rank adds is the one sent)
    const int owner = u / c;
    if (u < padded && owner != rank) rs.send(owner, u - owner * c, xv[k]);
  }
  // (the signature lanes check after their sends, as in the one-shot rounds)
  bool ok = signature_ok(a.base, sig_lane, n, bs);
  // This rank's chunk: reduce in rank order, send the sum to every peer.
  Unit<W> hv[K];  // the sums, then new_residual
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    if (u < padded && u / c == rank && ok) {
      ok = reduce_slot<NR, P, T, SumOp, W>(rs, n, u - rank * c, xv[k], &hv[k]);
      if (ok) {
        hv[k] = ag.prepare(hv[k]);
        send_to_peers<NR>(ag, n, u - rank * c, hv[k]);
      }
    }
  }
  // The other chunks' sums from their owners.
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    const int owner = u / c;
    if (u < padded && owner != rank && ok) {
      ok = channel_recv<P, T, W>(ag, owner, u - owner * c, &hv[k]);
    }
  }
  // The residual, and the squares of new_residual: pass k of the block holds
  // the segment's units [k * blockDim.x, (k + 1) * blockDim.x).
  Unit<W> wv[K];
  RowSquares sq;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    wv[k] = u < len ? load_unit<T, W>(static_cast<const T*>(a.weight), u0 + u, a.hidden, vec) : Unit<W>{};
    float node = 0.f;
    if (u < len) {
      hv[k] = ok ? residual_add<T, W>(hv[k], rv[k], &node) : poison_unit<W>();
      store_unit<T, W>(static_cast<T*>(a.new_residual), at + u, count, vec, hv[k]);
    }
    const int first = k * static_cast<int>(blockDim.x);  // (K = 2: 512 threads)
    if (first < len) sq.pass(node, min(len - first, static_cast<int>(blockDim.x)), ok);
  }
  // (the call's only round: no fence)
  float total;
  if (!wave_total(a, g, sq, tag0, epoch, &ok, &entered, &total)) {
    poison_segments<T, W>(a, g);
    return;
  }
  const float inv = rsqrtf(total / static_cast<float>(a.hidden) + a.eps);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    if (u < len) {
      const Unit<W> out = norm_unit<T, W>(hv[k], wv[k], inv);
      store_unit<T, W>(static_cast<T*>(a.normed), at + u, count, vec, ok ? out : poison_unit<W>());
    }
  }
  end_slot_waves(v, slots, tag0, 1);
  if (block_failed(ok)) poison_segments<T, W>(a, g);
}

}  // namespace jaxll
