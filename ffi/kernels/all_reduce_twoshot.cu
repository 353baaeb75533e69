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
#include "all_reduce_common.cuh"
#include "all_reduce_kernels.h"

namespace jaxll {
namespace {

template <Proto P, class T, class Op>
__global__ void __launch_bounds__(kBlockThreads) twoshot_kernel(AllReduceArgs a) {
  constexpr int W = unit_bytes<P>();
  const RankView& v = a.view;
  const int rank = v.rank;
  const int n = v.nranks;
  const T* x = static_cast<const T*>(a.in);
  T* y = static_cast<T*>(a.out);
  const bool vec = ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y)) % W) == 0;
  const BlockShare share = block_share(a);

  const BlockStart bs = block_begin(v, share.rounds);
  if (bs.had_error) {
    poison_units<T, W>(y, share.u0, share.u1, a.count, vec);
    return;
  }
  uint64_t refreshed[2] = {bs.ll_refreshed[0], bs.ll_refreshed[1]};
  bool ok = true;
  for (uint32_t r = 0; r < share.rounds; ++r) {
    const uint64_t epoch = bs.epoch + r;
    const int parity = static_cast<int>(epoch & 1);
    const int64_t r0 = share.u0 + static_cast<int64_t>(r) * a.round_units;
    const int64_t r1 = min(share.u1, r0 + a.round_units);
    const int64_t c = (r1 - r0 + n - 1) / n;
    const int b = static_cast<int>(blockIdx.x);
    const Channel<P, T> rs{v, 0, b, parity, static_cast<uint32_t>(epoch)};
    const Channel<P, T> ag{v, 1, b, parity, static_cast<uint32_t>(epoch)};
    const WaitContext ctx = wait_context(v, epoch);
    auto load = [&](int64_t u) {
      return u < r1 ? rs.prepare(load_unit<T, W>(x, u, a.count, vec)) : Unit<W>{};
    };
    if constexpr (P == Proto::kLL) ll_refresh_if_due(v, epoch, parity, refreshed);
    if constexpr (P == Proto::kBarrier) ok = flag_barrier(v, barrier_value(epoch, 0), ctx) && ok;

    // Reduce-scatter: chunk j of every rank goes to rank j (slot t of the chunk).
    for (int64_t i = threadIdx.x; i < (n - 1) * c; i += blockDim.x) {
      const int k = static_cast<int>(i / c) + 1;
      const int64_t t = i - (k - 1) * c;
      const int owner = rank + k < n ? rank + k : rank + k - n;
      rs.send(owner, t, load(r0 + owner * c + t));
    }
    if constexpr (P == Proto::kBarrier) ok = flag_barrier(v, barrier_value(epoch, 1), ctx) && ok;

    // Reduce this rank's chunk in rank order and push the result to every peer.
    for (int64_t t = threadIdx.x; t < c; t += blockDim.x) {
      const int64_t u = r0 + rank * c + t;
      UnitAcc<T, Op, W> acc;
      if (ok) ok = reduce_sources(rs, n, t, ctx, [&] { return load(u); }, &acc);
      const Unit<W> res = ok ? ag.prepare(acc.result()) : poison_unit<W>();
      if (ok)
        for (int k = 1; k < n; ++k) ag.send(rank + k < n ? rank + k : rank + k - n, t, res);
      if (u < r1) store_unit<T, W>(y, u, a.count, vec, res);
    }
    if constexpr (P == Proto::kBarrier) ok = flag_barrier(v, barrier_value(epoch, 2), ctx) && ok;

    // All-gather: every other rank's reduced chunk.
    for (int64_t i = threadIdx.x; i < (n - 1) * c; i += blockDim.x) {
      const int k = static_cast<int>(i / c) + 1;
      const int64_t t = i - (k - 1) * c;
      const int owner = rank + k < n ? rank + k : rank + k - n;
      const int64_t u = r0 + owner * c + t;
      Unit<W> val;
      if (ok) ok = channel_recv<P, T, W>(ag, owner, t, ctx, &val);
      if (u < r1) store_unit<T, W>(y, u, a.count, vec, ok ? val : poison_unit<W>());
    }
    if (r + 1 < share.rounds && round_boundary(ok)) {
      poison_units<T, W>(y, r1, share.u1, a.count, vec);
      return;
    }
  }
  if constexpr (P == Proto::kLL) {
    if (threadIdx.x == 0) {
      v.header->ll_refreshed[blockIdx.x][0] = refreshed[0];
      v.header->ll_refreshed[blockIdx.x][1] = refreshed[1];
    }
  }
}

template <Proto P, class T, class Op>
struct TwoShotKernel {
  static const void* fn() { return reinterpret_cast<const void*>(&twoshot_kernel<P, T, Op>); }
};

}  // namespace

void register_twoshot_kernels(KernelTable& t) { register_family<TwoShotKernel>(t, Family::kTwoShot); }

}  // namespace jaxll
