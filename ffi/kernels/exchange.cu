// ppermute and all-to-all on the one-shot path, written with the device API's
// channels (jaxll/channel.cuh) as the all-gather is (gather_scatter.cu):
//
//   all-to-all  every rank sends piece j of its input to rank j and copies its
//               own piece; then it reads each peer's piece from its scratch
//               into that peer's place in the output. Every rank sends to and
//               receives from every peer in every round, so the scratch
//               alternates by epoch parity with no barrier (call_args.cuh).
//   ppermute    one-way: a rank sends to at most one peer and receives from at
//               most one. It hears nothing from the others, so the call's
//               signature goes to every peer every round (round.cuh, "One-way
//               collectives"): that keeps the scratch safe to reuse, for this
//               call's rounds and for the calls after it, of any collective.
//               The barrier baseline's flag barriers join every pair anyway;
//               it checks the signature once, as the all-gather does.
//
// The grid, the rounds and the scratch parity are the one-shot all-reduce's
// for a message of one piece (plan_all_reduce, count = piece elements).
#include <algorithm>
#include <type_traits>

#include "kernels/all_reduce.h"
#include "kernels/call_args.cuh"
#include "kernels/exchange.h"
#include "kernels/gather_scatter.h"
#include "kernels/launch.h"
#include "kernels/pieces.cuh"

namespace jaxll {
namespace {

struct PermuteArgs {
  AllReduceArgs base;
  int dst, src;  // this rank's destination and source (-1: none)
};

struct AllToAllArgs {
  AllReduceArgs base;
  int64_t in_segment, out_segment;
};

template <Proto P, class T>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    permute_kernel(PermuteArgs g) {
  constexpr int W = unit_bytes<P>();
  constexpr bool kOneWay = P != Proto::kBarrier;
  const AllReduceArgs& a = g.base;
  const RankView& v = a.view;
  const int rank = v.rank;
  const int n = v.nranks;
  const T* x = static_cast<const T*>(a.in);
  T* y = static_cast<T*>(a.out);
  const bool vx = reinterpret_cast<uintptr_t>(x) % W == 0;
  const bool vy = reinterpret_cast<uintptr_t>(y) % W == 0;
  const BlockShare share = block_share(a);
  collective_prologue(a);
  const BlockStart bs = block_begin(v, share.rounds, kOneWay ? share.rounds : 1u);
  if (bs.had_error) {
    poison_units<T, W>(y, share.u0, share.u1, a.count, vy);
    return;
  }
  const int sig_lane = !v.signatures || n == 1 ? 0 : signature_lane(n);
  const bool sends = g.dst >= 0 && g.dst != rank;
  bool ok = true;
  for (uint32_t r = 0; r < share.rounds; ++r) {
    const RoundPlace p = round_place(a, share, bs, r);
    const Channel<P, T> ch(v, 0, static_cast<int>(blockIdx.x), p.parity, p.epoch);
    if (kOneWay || r == 0) {
      const BlockStart rs = round_signature_start(bs, r);
      send_signature(a, sig_lane, n, rs);
      const ErrorKind gave_up = r == 0 ? ErrorKind::kNotStarted : ErrorKind::kTimeout;
      ok = signature_ok(a, sig_lane, n, rs, gave_up) && ok;
    }
    round_start<P>(v, p, &ok);
    if (sends) {
      for (int i = threadIdx.x; i < p.len; i += blockDim.x)
        ch.send(g.dst, i, ch.prepare(load_unit<T, W>(x, p.r0 + i, a.count, vx)));
    }
    round_sent<P>(v, p, &ok);
    for (int i = threadIdx.x; i < p.len; i += blockDim.x) {
      Unit<W> u{};
      if (g.src == rank) {
        u = load_unit<T, W>(x, p.r0 + i, a.count, vx);
      } else if (g.src >= 0) {
        if (ok) ok = channel_recv<P, T, W>(ch, g.src, i, &u);
        if (!ok) u = poison_unit<W>();
      }
      store_unit<T, W>(y, p.r0 + i, a.count, vy, u);
    }
    if (r + 1 < share.rounds && round_boundary(ok)) {
      poison_units<T, W>(y, share.u0, share.u1, a.count, vy);  // earlier rounds too
      return;
    }
  }
  if (n != 1 && block_failed(ok)) poison_units<T, W>(y, share.u0, share.u1, a.count, vy);
}

template <Proto P, class T, bool K>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    all_to_all_kernel(AllToAllArgs g) {
  constexpr int W = unit_bytes<P>();
  const AllReduceArgs& a = g.base;
  const RankView& v = a.view;
  const int n = v.nranks;
  const Pieces<const T, W, K> x(static_cast<const T*>(a.in), a.count, g.in_segment, n);
  const Pieces<T, W, K> y(static_cast<T*>(a.out), a.count, g.out_segment, n);
  const bool vx = x.vector();
  const bool vy = y.vector();
  const BlockShare share = block_share(a);
  collective_prologue(a);
  const BlockStart bs = block_begin(v, share.rounds);
  if (bs.had_error) {
    y.poison(share, vy);
    return;
  }
  const int sig_lane = !v.signatures || n == 1 ? 0 : signature_lane(n);
  send_signature(a, sig_lane, n, bs);
  bool ok = signature_ok(a, sig_lane, n, bs);
  for (uint32_t r = 0; r < share.rounds; ++r) {
    const RoundPlace p = round_place(a, share, bs, r);
    const Channel<P, T> ch(v, 0, static_cast<int>(blockIdx.x), p.parity, p.epoch);
    round_start<P>(v, p, &ok);
    // piece j of this rank's input goes to rank j (its own piece to its output)
    send_pieces<2, P, T, W, K>(ch, x, vx, p, &y, vy);
    round_sent<P>(v, p, &ok);
    receive_pieces<P, T, W, K>(ch, y, vy, p, &ok);
    if (r + 1 < share.rounds && round_boundary(ok)) {
      y.poison(share, vy);  // earlier rounds too
      return;
    }
  }
  if (n != 1 && block_failed(ok)) y.poison(share, vy);
}

// The kernel of `c` for protocol P over element type T (an all-to-all's
// pieces in the packed form where `packed`: Pieces, pieces.cuh).
template <Proto P, class T>
const void* kernel_of(Collective c, bool packed) {
  if (c == Collective::kPermute) return reinterpret_cast<const void*>(&permute_kernel<P, T>);
  if (c == Collective::kAllToAll) {
    return packed ? reinterpret_cast<const void*>(&all_to_all_kernel<P, T, true>)
                  : reinterpret_cast<const void*>(&all_to_all_kernel<P, T, false>);
  }
  return nullptr;
}

template <Proto P>
const void* kernel_of(Collective c, DType dtype, bool packed) {
  if constexpr (P == Proto::kSentinel) {
    // the pattern is a per-type NaN: one kernel per floating type, none for int32
    switch (dtype) {
      case DType::kF32: return kernel_of<P, float>(c, packed);
      case DType::kBF16: return kernel_of<P, __nv_bfloat16>(c, packed);
      case DType::kF16: return kernel_of<P, __half>(c, packed);
      default: return nullptr;
    }
  } else {
    // bits: one kernel per element size
    switch (dtype_bytes(dtype)) {
      case 4: return kernel_of<P, int32_t>(c, packed);
      case 2: return kernel_of<P, __half>(c, packed);
      default: return nullptr;
    }
  }
}

const void* kernel_for(Collective c, Algorithm algorithm, DType dtype, bool packed = false) {
  Proto p;
  if (!proto_of(algorithm, &p)) return nullptr;
  switch (p) {
    case Proto::kLL: return kernel_of<Proto::kLL>(c, dtype, packed);
    case Proto::kSentinel: return kernel_of<Proto::kSentinel>(c, dtype, packed);
    case Proto::kBarrier: return kernel_of<Proto::kBarrier>(c, dtype, packed);
  }
  return nullptr;
}

}  // namespace

bool has_exchange_kernel(Collective c, Algorithm algorithm, DType dtype) {
  return kernel_for(c, algorithm, dtype) != nullptr;
}

uint32_t permutation_tag(const int64_t* dests, int nranks) {
  uint64_t h = 0;
  bool any = false;
  for (int r = 0; r < nranks; ++r) {
    any = any || dests[r] >= 0;
    h = h * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(dests[r] + 2);
  }
  return any ? 1 + static_cast<uint32_t>((h ^ (h >> 29)) % 15) : 0;
}

Status launch_ppermute(Algorithm algorithm, DType dtype, const RankView& view, const void* in,
                       void* out, int64_t count, int dst, int src, uint32_t tag,
                       cudaStream_t stream) {
  const void* fn = kernel_for(Collective::kPermute, algorithm, dtype);
  if (fn == nullptr) return Status::NoKernel();
  if (dst >= view.nranks || src >= view.nranks) return Status::NoPlan();
  const bool one_way = algorithm != Algorithm::kOneShotBarrier;
  // (a one-way call exchanges signatures whether or not they are checked: with
  // the check off, every rank sends the same word)
  const bool signatures = view.signatures != 0 || one_way;
  const LaunchPlan plan = plan_all_reduce(algorithm, count, dtype_bytes(dtype), view.nranks,
                                          view.geo, view.max_blocks, signatures);
  if (plan.blocks == 0) return Status::NoPlan();
  const bool pdl = launches_early(view, plan.blocks);
  const uint64_t signature =
      view.signatures != 0
          ? encode_signature(static_cast<uint32_t>(Collective::kPermute),
                             static_cast<uint32_t>(algorithm), static_cast<uint32_t>(dtype),
                             tag & 0xF, count)
          : encode_signature(static_cast<uint32_t>(Collective::kPermute), 0, 0, 0, 0);
  RankView v = view;
  v.signatures = signatures ? 1 : 0;
  PermuteArgs args{
      {v, in, out, count, plan.units, plan.span, plan.round_units,
       static_cast<uint32_t>(plan.rounds), static_cast<uint32_t>(plan.last_rounds), pdl ? 1 : 0,
       signature},
      dst, src};
  return launch_collective(fn, plan.blocks, plan.threads, pdl, &args, stream);
}

Status launch_all_to_all(Algorithm algorithm, DType dtype, const RankView& view, const void* in,
                         void* out, int64_t count, int64_t in_segment, int64_t out_segment,
                         cudaStream_t stream) {
  if (kernel_for(Collective::kAllToAll, algorithm, dtype) == nullptr) return Status::NoKernel();
  if (!segments_fit(count, in_segment) || !segments_fit(count, out_segment)) {
    return Status::NoPlan();
  }
  const int unit = unit_bytes_of(algorithm);
  const void* fn = kernel_for(Collective::kAllToAll, algorithm, dtype,
                              pieces_packed(count, in_segment, dtype_bytes(dtype), unit) ||
                                  pieces_packed(count, out_segment, dtype_bytes(dtype), unit));
  LaunchPlan plan = plan_all_reduce(algorithm, count, dtype_bytes(dtype), view.nranks, view.geo,
                                    view.max_blocks, view.signatures != 0);
  if (plan.blocks == 0) return Status::NoPlan();
  plan.threads = piece_lane_threads(std::min(plan.span, plan.round_units), view.nranks,
                                    view.signatures != 0);
  const bool pdl = launches_early(view, plan.blocks);
  // (the layout of the pieces is part of what peers must agree on: folded into
  // the signature's reduction field)
  const uint32_t layout =
      in_segment == count && out_segment == count
          ? 0
          : 1 + static_cast<uint32_t>((in_segment * 31 + out_segment) % 15);
  AllToAllArgs args{
      {view, in, out, count, plan.units, plan.span, plan.round_units,
       static_cast<uint32_t>(plan.rounds), static_cast<uint32_t>(plan.last_rounds), pdl ? 1 : 0,
       encode_signature(static_cast<uint32_t>(Collective::kAllToAll),
                        static_cast<uint32_t>(algorithm), static_cast<uint32_t>(dtype), layout,
                        count)},
      in_segment, out_segment};
  return launch_collective(fn, plan.blocks, plan.threads, pdl, &args, stream);
}

std::vector<const void*> exchange_kernel_functions() {
  std::vector<const void*> out;
  for (Collective c : {Collective::kPermute, Collective::kAllToAll}) {
    for (Algorithm a : {Algorithm::kOneShotLL, Algorithm::kOneShotSentinel,
                        Algorithm::kOneShotBarrier}) {
      for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
        for (bool packed : {false, true}) {
          const void* fn = kernel_for(c, a, d, packed);
          if (fn != nullptr && std::find(out.begin(), out.end(), fn) == out.end()) {
            out.push_back(fn);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace jaxll
