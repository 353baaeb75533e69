// One-shot all-reduce: every rank pushes its whole input to every peer, then
// reduces the N contributions from its local scratch, in rank order 0..N-1 (so
// every rank gets bitwise identical results).
//
//   LL16      data and flag in one 16-byte store; no reset, no fence
//   sentinel  data stored directly into sentinel-filled scratch, reset after use
//   barrier   plain stores bracketed by two cross-rank flag barriers (baseline)
//
// Messages larger than one round's scratch go in rounds, scratch halves
// alternating by epoch parity (see all_reduce_common.cuh).
#include "all_reduce_common.cuh"
#include "all_reduce_kernels.h"

namespace jaxll {
namespace {

template <Proto P, class T, class Op>
__global__ void __launch_bounds__(kBlockThreads) oneshot_kernel(AllReduceArgs a) {
  constexpr int W = unit_bytes<P>();
  const RankView& v = a.view;
  const int rank = v.rank;
  const int n = v.nranks;
  const T* x = static_cast<const T*>(a.in);
  T* y = static_cast<T*>(a.out);
  const bool vec = ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y)) % W) == 0;
  const BlockShare share = block_share(a);

  // The thread's first unit is loaded before the epoch handshake, so the two
  // memory round trips overlap (most small calls have one unit per thread).
  const int64_t first = share.u0 + threadIdx.x;
  const Unit<W> first_value =
      first < min(share.u1, share.u0 + a.round_units) ? load_unit<T, W>(x, first, a.count, vec)
                                                      : Unit<W>{};
  const BlockStart bs = block_begin(v, share.rounds);
  if (bs.had_error) {
    // An earlier call of this rank gave up: peers are out of step, so do not
    // communicate; poison the output (all-ones bits, NaN for floats) and leave.
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
    const Channel<P, T> ch{v, 0, static_cast<int>(blockIdx.x), parity, static_cast<uint32_t>(epoch)};
    const WaitContext ctx = wait_context(v, epoch);
    if constexpr (P == Proto::kLL) ll_refresh_if_due(v, epoch, parity, refreshed);
    if constexpr (P == Proto::kBarrier) ok = flag_barrier(v, barrier_value(epoch, 0), ctx) && ok;

    // Push, starting with the next rank so ranks spread their first stores.
    for (int64_t u = r0 + threadIdx.x; u < r1; u += blockDim.x) {
      const Unit<W> val =
          ch.prepare((r == 0 && u == first) ? first_value : load_unit<T, W>(x, u, a.count, vec));
      for (int k = 1; k < n; ++k) ch.send(rank + k < n ? rank + k : rank + k - n, u - r0, val);
    }
    if constexpr (P == Proto::kBarrier) ok = flag_barrier(v, barrier_value(epoch, 1), ctx) && ok;

    for (int64_t u = r0 + threadIdx.x; u < r1; u += blockDim.x) {
      UnitAcc<T, Op, W> acc;
      if (ok) {
        ok = reduce_sources(ch, n, u - r0, ctx, [&] {
          return ch.prepare((r == 0 && u == first) ? first_value : load_unit<T, W>(x, u, a.count, vec));
        }, &acc);
      }
      store_unit<T, W>(y, u, a.count, vec, ok ? acc.result() : poison_unit<W>());
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
struct OneShotKernel {
  static const void* fn() { return reinterpret_cast<const void*>(&oneshot_kernel<P, T, Op>); }
};

}  // namespace

void register_oneshot_kernels(KernelTable& t) { register_family<OneShotKernel>(t, Family::kOneShot); }

}  // namespace jaxll
