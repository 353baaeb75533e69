// Two-shot all-reduce: reduce-scatter, then all-gather.
//
// In each round a block's piece of L units is cut into N chunks of c = ceil(L/N)
// units (the last chunks padded, so every rank owns and sends at least one unit
// to every peer in every round). Rank j owns chunk j: every rank pushes chunk j
// into rank j's phase-0 scratch, rank j reduces the N contributions in rank
// order and pushes the result into every peer's phase-1 scratch. Two
// synchronisations, traffic about 2(N-1)/N of the message per rank.
//
//   LL16 / sentinel  the data signals itself; no barrier anywhere
//   barrier          plain stores and three cross-rank flag barriers per round
//                    (scratch free, chunks ready, results ready): the baseline
#pragma once

#include "kernels/call_args.cuh"

namespace jaxll {

// NR > 0: compiled for groups of exactly NR ranks; NR == 0: any group size.
template <Proto P, class T, class Op, int NR>
__device__ __forceinline__ void twoshot_all_reduce(const AllReduceArgs& a) {
  constexpr int W = unit_bytes<P>();
  const RankView& v = a.view;
  const int rank = v.rank;
  const int n = NR > 0 ? NR : v.nranks;
  const T* x = static_cast<const T*>(a.in);
  T* y = static_cast<T*>(a.out);
  const bool vec = ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y)) % W) == 0;
  const BlockShare share = block_share(a);
  collective_prologue(a);

  const BlockStart bs = block_begin(v, share.rounds);
  if (bs.had_error) {
    poison_units<T, W>(y, share.u0, share.u1, a.count, vec);
    return;
  }
  const int sig_lane = NR == 1 || !v.signatures ? 0 : signature_lane(n);
  send_signature(a, sig_lane, n, bs);
  bool ok = signature_ok(a, sig_lane, n, bs);
  for (uint32_t r = 0; r < share.rounds; ++r) {
    const uint64_t epoch = bs.epoch + r;
    const int parity = static_cast<int>(epoch & 1);
    const int64_t r0 = share.u0 + static_cast<int64_t>(r) * a.round_units;
    const int len = static_cast<int>(min(share.u1 - r0, a.round_units));
    const int c = (len + n - 1) / n;  // units per chunk (the last chunks padded)
    const int b = static_cast<int>(blockIdx.x);
    const Channel<P, T> rs(v, 0, b, parity, epoch);
    const Channel<P, T> ag(v, 1, b, parity, epoch);
    // Unit j of the round, prepared for sending (zeros past the message).
    auto load = [&](int j) {
      return j < len ? rs.prepare(load_unit<T, W>(x, r0 + j, a.count, vec)) : Unit<W>{};
    };
    if constexpr (P == Proto::kLL) {
      ll_round_begin(v, epoch, parity);
    }
    if constexpr (P == Proto::kBarrier) ok = flag_barrier(v, barrier_value(epoch, 0), wait_context(v, epoch)) && ok;

    // Reduce-scatter: chunk j of every rank goes to rank j (slot t of the chunk).
    for (int i = threadIdx.x; i < (n - 1) * c; i += blockDim.x) {
      const int k = i / c + 1;
      const int t = i - (k - 1) * c;
      const int owner = peer_at(rank, k, n);
      rs.send(owner, t, load(owner * c + t));
    }
    if constexpr (P == Proto::kBarrier) ok = flag_barrier(v, barrier_value(epoch, 1), wait_context(v, epoch)) && ok;

    // Reduce this rank's chunk in rank order and push the result to every peer.
    for (int t = threadIdx.x; t < c; t += blockDim.x) {
      const int j = rank * c + t;
      const Unit<W> own = load(j);
      Unit<W> res;
      if (ok) ok = reduce_slot<NR, P, T, Op, W>(rs, n, t, own, &res);
      res = ok ? ag.prepare(res) : poison_unit<W>();
      if (ok) send_to_peers<NR>(ag, n, t, res);
      if (j < len) store_unit<T, W>(y, r0 + j, a.count, vec, res);
    }
    if constexpr (P == Proto::kBarrier) ok = flag_barrier(v, barrier_value(epoch, 2), wait_context(v, epoch)) && ok;

    // All-gather: every other rank's reduced chunk.
    for (int i = threadIdx.x; i < (n - 1) * c; i += blockDim.x) {
      const int k = i / c + 1;
      const int t = i - (k - 1) * c;
      const int owner = peer_at(rank, k, n);
      const int j = owner * c + t;
      Unit<W> val;
      if (ok) ok = channel_recv<P, T, W>(ag, owner, t, &val);
      if (j < len) store_unit<T, W>(y, r0 + j, a.count, vec, ok ? val : poison_unit<W>());
    }
    if (r + 1 < share.rounds && round_boundary(ok)) {
      poison_units<T, W>(y, share.u0, share.u1, a.count, vec);  // earlier rounds too
      return;
    }
  }
  if constexpr (NR != 1) {
    if (block_failed(ok))
      poison_units<T, W>(y, share.u0, share.u1, a.count, vec);
  }
}

}  // namespace jaxll
