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

// NR > 0: compiled for groups of exactly NR ranks (loops over peers unroll);
// NR == 0: any group size.
template <Proto P, class T, class Op, int NR>
__device__ __forceinline__ void oneshot_body(const AllReduceArgs& a) {
  constexpr int W = unit_bytes<P>();
  const RankView& v = a.view;
  const int rank = v.rank;
  const int n = NR > 0 ? NR : v.nranks;
  const T* x = static_cast<const T*>(a.in);
  T* y = static_cast<T*>(a.out);
  const bool vec = ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y)) % W) == 0;
  const BlockShare share = block_share(a);
  collective_prologue(a);

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
  const int sig_lane = NR == 1 || !v.signatures ? 0 : signature_lane(n);
  send_signature(a, sig_lane, n, bs);
  bool ok = signature_ok(a, sig_lane, n, bs);
  for (uint32_t r = 0; r < share.rounds; ++r) {
    const uint64_t epoch = bs.epoch + r;
    const int parity = static_cast<int>(epoch & 1);
    const int64_t r0 = share.u0 + static_cast<int64_t>(r) * a.round_units;
    const int len = static_cast<int>(min(share.u1 - r0, a.round_units));
    const Channel<P, T> ch(v, 0, static_cast<int>(blockIdx.x), parity, epoch);
    if constexpr (P == Proto::kLL) {
      ll_round_begin(v, epoch, parity);
    }
    if constexpr (P == Proto::kBarrier) ok = flag_barrier(v, barrier_value(epoch, 0), wait_context(v, epoch)) && ok;

    if (P != Proto::kBarrier && len <= static_cast<int>(blockDim.x)) {
      // One unit per thread (every small message): push it, then reduce it
      // with the value already in registers.
      const int i = threadIdx.x;
      if (i < len) {
        const Unit<W> own =
            ch.prepare(r == 0 ? first_value : load_unit<T, W>(x, r0 + i, a.count, vec));
        send_to_peers<NR>(ch, n, i, own);
        Unit<W> res;
        if (ok) ok = reduce_slot<NR, P, T, Op, W>(ch, n, i, own, &res);
        store_unit<T, W>(y, r0 + i, a.count, vec, ok ? res : poison_unit<W>());
      }
    } else {
      // Several units per thread: push them all, then reduce them all.
      for (int i = threadIdx.x; i < len; i += blockDim.x) {
        const Unit<W> val = ch.prepare((r == 0 && i == static_cast<int>(threadIdx.x))
                                           ? first_value
                                           : load_unit<T, W>(x, r0 + i, a.count, vec));
        send_to_peers<NR>(ch, n, i, val);
      }
      if constexpr (P == Proto::kBarrier) ok = flag_barrier(v, barrier_value(epoch, 1), wait_context(v, epoch)) && ok;
      for (int i = threadIdx.x; i < len; i += blockDim.x) {
        const Unit<W> own = ch.prepare((r == 0 && i == static_cast<int>(threadIdx.x))
                                           ? first_value
                                           : load_unit<T, W>(x, r0 + i, a.count, vec));
        Unit<W> res;
        if (ok) ok = reduce_slot<NR, P, T, Op, W>(ch, n, i, own, &res);
        store_unit<T, W>(y, r0 + i, a.count, vec, ok ? res : poison_unit<W>());
      }
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

template <Proto P, class T, class Op, int NR>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) oneshot_kernel(AllReduceArgs a) {
  oneshot_body<P, T, Op, NR>(a);
}

// Every rank of a virtual group in one launch (GroupArgs, all_reduce_common.cuh).
template <Proto P, class T, class Op, int NR>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    oneshot_group_kernel(const __grid_constant__ GroupArgs<AllReduceArgs> g) {
  oneshot_body<P, T, Op, NR>(g.rank[blockIdx.y]);
}

template <Proto P, class T, class Op, int NR>
struct OneShotKernel {
  static const void* fn() { return reinterpret_cast<const void*>(&oneshot_kernel<P, T, Op, NR>); }
  static const void* group_fn() {
    return reinterpret_cast<const void*>(&oneshot_group_kernel<P, T, Op, NR>);
  }
};

}  // namespace

void register_oneshot_kernels(KernelTable& t) { register_family<OneShotKernel>(t, Family::kOneShot); }

}  // namespace jaxll
