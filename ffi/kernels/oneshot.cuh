// The one-shot round loop: every rank pushes its share to every peer, then
// reduces the N contributions from its local scratch, in rank order 0..N-1 (so
// every rank gets bitwise identical results).
//
//   LL16      data and flag in one 16-byte store; no reset, no fence
//   sentinel  data stored directly into sentinel-filled scratch, reset after use
//   barrier   plain stores bracketed by two cross-rank flag barriers (baseline)
//
// Shares larger than one round's scratch go in rounds, scratch halves
// alternating by epoch parity (call_args.cuh).
//
// The loop is written once and hands every reduced unit to an epilogue: the
// all-reduce stores it (StoreOutput, below); a fused kernel computes on it
// (all_reduce_rmsnorm's RowNorm adds the residual and normalizes the row). An
// epilogue E provides, all on the device:
//   static constexpr bool kOneUnitPerThread
//                          true: no round gives a thread more than one unit
//   void enter()           at kernel entry, before the grid dependency wait
//   void prefetch(u, has)  after the wait and before the epochs, with this
//                          thread's first unit u (has: the thread has one)
//   void before_reduce(u)  before the wait for unit u's contributions
//   void reduced(u, v, ok) unit u's result v (ok false: v is the poison pattern)
//   void after_pass(u, len) every thread, after each pass of the block over
//                          units [u, u + len) of a round (a pass: a unit a
//                          thread, thread t unit u + t)
//   bool finish(bs, &ok)   after the last round; false: the block has poisoned
//                          what it owns and leaves
//   void poison(share)     the block failed: poison everything it owns
//   void give_up(share)    an earlier call of this rank failed: poison and leave
//                          without communicating
#pragma once

#include "kernels/call_args.cuh"

namespace jaxll {

// What a block holds once its call has started (oneshot_begin).
template <int W>
struct OneShotStart {
  BlockStart bs;
  Unit<W> first;  // this thread's unit of the first round (loaded before the epochs)
  int sig_lane;   // the peer whose signature this thread checks (0: none)
};

// Starts a block's call: the kernel's entry and prologue, this thread's first
// unit of `first_share` (loaded before the epoch handshake, so that the two
// memory round trips overlap: most small calls have one unit a thread), the
// epochs of `rounds` rounds, and the call's signature sent to every peer.
// False where an earlier call of this rank gave up: peers are out of step, so
// the block does not communicate; epi.give_up has poisoned what it owns and
// the block leaves. NR > 0: compiled for groups of exactly NR ranks; NR == 0:
// any group size. `vec`: a.in is aligned to whole units.
template <Proto P, class T, int NR, class E>
__device__ __forceinline__ bool oneshot_begin(const AllReduceArgs& a, const BlockShare& first_share,
                                              uint32_t rounds, bool vec, E& epi,
                                              OneShotStart<unit_bytes<P>()>* s) {
  constexpr int W = unit_bytes<P>();
  const RankView& v = a.view;
  const int n = NR > 0 ? NR : v.nranks;
  epi.enter();
  collective_prologue(a);
  const int64_t first = first_share.u0 + threadIdx.x;
  const bool has_first = first < min(first_share.u1, first_share.u0 + a.round_units);
  s->first = has_first ? load_unit<T, W>(static_cast<const T*>(a.in), first, a.count, vec)
                       : Unit<W>{};
  epi.prefetch(first, has_first);
  s->bs = block_begin(v, rounds);
  if (s->bs.had_error) {
    epi.give_up(first_share);
    return false;
  }
  s->sig_lane = NR == 1 || !v.signatures ? 0 : signature_lane(n);
  send_signature(a, s->sig_lane, n, s->bs);
  return true;
}

// The rounds of `share`, the first at epoch `epoch0`, every reduced unit to
// `epi`; *ok false once a wait gave up or a signature differed. `opening`: the
// call's first share (its first round takes the unit oneshot_begin loaded,
// and the signature lanes check the peers' signatures after its sends, so
// that data they carry is not held back a cross-rank round trip). False where
// a round boundary found a failure: epi.poison has poisoned the share (earlier
// rounds too) and the block leaves.
template <Proto P, class T, class Op, int NR, class E>
__device__ __forceinline__ bool oneshot_rounds(const AllReduceArgs& a, const BlockShare& share,
                                               uint64_t epoch0, bool opening,
                                               const OneShotStart<unit_bytes<P>()>& s, bool vec,
                                               E& epi, bool* ok) {
  constexpr int W = unit_bytes<P>();
  constexpr bool kOneUnit = E::kOneUnitPerThread && P != Proto::kBarrier;
  const RankView& v = a.view;
  const int n = NR > 0 ? NR : v.nranks;
  const T* x = static_cast<const T*>(a.in);
  for (uint32_t r = 0; r < share.rounds; ++r) {
    const uint64_t epoch = epoch0 + r;
    const int parity = static_cast<int>(epoch & 1);
    const int64_t r0 = share.u0 + static_cast<int64_t>(r) * a.round_units;
    const int len = static_cast<int>(min(share.u1 - r0, a.round_units));
    const bool first_round = opening && r == 0;
    const Channel<P, T> ch(v, 0, static_cast<int>(blockIdx.x), parity, epoch);
    auto input = [&](int i) {  // unit r0 + i, prepared for sending
      return ch.prepare(first_round && i == static_cast<int>(threadIdx.x)
                            ? s.first
                            : load_unit<T, W>(x, r0 + i, a.count, vec));
    };
    if constexpr (P == Proto::kLL) {
      ll_round_begin(v, epoch, parity);
    }
    if constexpr (P == Proto::kBarrier) {
      *ok = flag_barrier(v, barrier_value(epoch, 0), wait_context(v, epoch)) && *ok;
    }
    if (kOneUnit || (P != Proto::kBarrier && len <= static_cast<int>(blockDim.x))) {
      // One unit per thread (every small message): push it, then reduce it
      // with the value already in registers.
      const int i = threadIdx.x;
      Unit<W> own{};
      if (i < len) {
        own = input(i);
        send_to_peers<NR>(ch, n, i, own);
      }
      if (first_round) *ok = signature_ok(a, s.sig_lane, n, s.bs) && *ok;
      if (i < len) {
        epi.before_reduce(r0 + i);
        Unit<W> res;
        if (*ok) *ok = reduce_slot<NR, P, T, Op, W>(ch, n, i, own, &res);
        epi.reduced(r0 + i, *ok ? res : poison_unit<W>(), *ok);
      }
      epi.after_pass(r0, len);
    } else {
      if constexpr (!kOneUnit) {
        // Several units per thread: push them all, then reduce them all.
        for (int i = threadIdx.x; i < len; i += blockDim.x) send_to_peers<NR>(ch, n, i, input(i));
        if (first_round) *ok = signature_ok(a, s.sig_lane, n, s.bs) && *ok;
        if constexpr (P == Proto::kBarrier) {
          *ok = flag_barrier(v, barrier_value(epoch, 1), wait_context(v, epoch)) && *ok;
        }
        for (int b = 0; b < len; b += blockDim.x) {
          const int i = b + static_cast<int>(threadIdx.x);
          if (i < len) {
            const Unit<W> own = input(i);
            epi.before_reduce(r0 + i);
            Unit<W> res;
            if (*ok) *ok = reduce_slot<NR, P, T, Op, W>(ch, n, i, own, &res);
            epi.reduced(r0 + i, *ok ? res : poison_unit<W>(), *ok);
          }
          epi.after_pass(r0 + b, min(len - b, static_cast<int>(blockDim.x)));
        }
      }
    }
    if (r + 1 < share.rounds && round_boundary(*ok)) {
      epi.poison(share);
      return false;
    }
  }
  return true;
}

// A whole call of one share: begin, its rounds, the epilogue's finish, and the
// block's agreement on failure at the end.
template <Proto P, class T, class Op, int NR, class E>
__device__ __forceinline__ void oneshot_body(const AllReduceArgs& a, const BlockShare& share,
                                             bool vec, E& epi) {
  OneShotStart<unit_bytes<P>()> s;
  if (!oneshot_begin<P, T, NR>(a, share, share.rounds, vec, epi, &s)) return;
  bool ok = true;
  if (!oneshot_rounds<P, T, Op, NR>(a, share, s.bs.epoch, true, s, vec, epi, &ok)) return;
  if (!epi.finish(s.bs, &ok)) return;
  if constexpr (NR != 1) {
    if (block_failed(ok)) epi.poison(share);
  }
}

// The all-reduce's epilogue: every reduced unit goes to the output.
template <class T, int W>
struct StoreOutput {
  static constexpr bool kOneUnitPerThread = false;
  T* y;
  int64_t count;
  bool vec;
  __device__ __forceinline__ void enter() {}
  __device__ __forceinline__ void prefetch(int64_t, bool) {}
  __device__ __forceinline__ void before_reduce(int64_t) {}
  __device__ __forceinline__ void reduced(int64_t u, const Unit<W>& value, bool) {
    store_unit<T, W>(y, u, count, vec, value);
  }
  __device__ __forceinline__ void after_pass(int64_t, int) {}
  __device__ __forceinline__ bool finish(const BlockStart&, bool*) { return true; }
  __device__ __forceinline__ void poison(const BlockShare& s) {
    poison_units<T, W>(y, s.u0, s.u1, count, vec);
  }
  __device__ __forceinline__ void give_up(const BlockShare& s) { poison(s); }
};

// The one-shot all-reduce of `a` (its block of it).
template <Proto P, class T, class Op, int NR>
__device__ __forceinline__ void oneshot_all_reduce(const AllReduceArgs& a) {
  constexpr int W = unit_bytes<P>();
  const bool vec =
      ((reinterpret_cast<uintptr_t>(a.in) | reinterpret_cast<uintptr_t>(a.out)) % W) == 0;
  StoreOutput<T, W> out{static_cast<T*>(a.out), a.count, vec};
  oneshot_body<P, T, Op, NR>(a, block_share(a), vec, out);
}

}  // namespace jaxll
