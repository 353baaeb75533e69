// All-gather and reduce-scatter on the one-shot path, written with the device
// API's channels (jaxll/channel.cuh) exactly as the one-shot all-reduce is:
//
//   all-gather      every rank pushes its piece (count elements) to every peer
//                   and writes it into its own slot of the output; then it reads
//                   each peer's piece from its scratch into that peer's slot.
//                   Bits move unchanged under LL16 and plain stores (they never
//                   look at the values), so one kernel per element size serves
//                   every dtype there. The sentinel protocol looks at the values:
//                   a peer's element whose bits are all ones (a NaN, the
//                   pattern) arrives as the canonical NaN, as in the sentinel
//                   all-reduce; this rank's own piece is copied unchanged.
//   reduce-scatter  every rank sends piece j of its input to rank j; then it
//                   reduces the N contributions to its own piece in rank order
//                   0..N-1 (the order jaxll.all_reduce uses).
//
// Along a dimension other than the first, the pieces interleave: the gathered
// result (the scattered input) holds piece r as `count / segment` segments of
// `segment` elements, segment s of piece r at (s * nranks + r) * segment. The
// kernels address those segments in place (Pieces, pieces.cuh); the host makes sure
// a segment is a whole number of transfer units, so no unit straddles two.
//
// Protocols: LL16 (data and flag in one 16-byte store, barrier-free), sentinel
// (data at full width into scratch that holds the pattern until written; the
// reader writes the pattern back; barrier-free; floating-point types only) and
// a baseline of plain stores between two cross-rank flag barriers. The grid, the
// rounds and the scratch parity are the one-shot all-reduce's for a message of
// one piece (plan_all_reduce with count = piece elements): in every round each
// rank sends to each peer, so parity reuse stays safe (call_args.cuh).
#include <algorithm>
#include <type_traits>

#include "kernels/all_reduce.h"
#include "kernels/call_args.cuh"
#include "kernels/gather_scatter.h"
#include "kernels/launch.h"
#include "kernels/pieces.cuh"

namespace jaxll {
namespace {

struct GatherScatterArgs {
  AllReduceArgs base;
  int64_t segment;  // elements of one segment of a piece (count: one segment)
};

template <Proto P, class T, bool K>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    gather_kernel(GatherScatterArgs g) {
  constexpr int W = unit_bytes<P>();
  const AllReduceArgs& a = g.base;
  const RankView& v = a.view;
  const int rank = v.rank;
  const int n = v.nranks;
  const T* x = static_cast<const T*>(a.in);
  const Pieces<T, W, K> y(static_cast<T*>(a.out), a.count, g.segment, n);
  const bool vx = reinterpret_cast<uintptr_t>(x) % W == 0;
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
    const int64_t r0 = p.r0;
    const int len = p.len;
    const Channel<P, T> ch(v, 0, static_cast<int>(blockIdx.x), p.parity, p.epoch);
    round_start<P>(v, p, &ok);
    const int threads = static_cast<int>(lane_threads(v));
    for (int i = threadIdx.x; i < len && static_cast<int>(threadIdx.x) < threads; i += threads) {
      const Unit<W> u = load_unit<T, W>(x, r0 + i, a.count, vx);
      send_to_peers<0>(ch, n, i, ch.prepare(u));
      y.store(rank, r0 + i, vy, u);
    }
    round_sent<P>(v, p, &ok);
    receive_pieces<P, T, W, K>(ch, y, vy, p, &ok);
    if (r + 1 < share.rounds && round_boundary(ok)) {
      y.poison(share, vy);  // earlier rounds too
      return;
    }
  }
  if (n != 1 && block_failed(ok)) y.poison(share, vy);
}

template <Proto P, class T, bool K>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    scatter_kernel(GatherScatterArgs g) {
  constexpr int W = unit_bytes<P>();
  const AllReduceArgs& a = g.base;
  const RankView& v = a.view;
  const int rank = v.rank;
  const int n = v.nranks;
  const Pieces<const T, W, K> x(static_cast<const T*>(a.in), a.count, g.segment, n);
  T* y = static_cast<T*>(a.out);
  const bool vx = x.vector();
  const bool vy = reinterpret_cast<uintptr_t>(y) % W == 0;
  const BlockShare share = block_share(a);
  collective_prologue(a);
  const BlockStart bs = block_begin(v, share.rounds);
  if (bs.had_error) {
    poison_units<T, W>(y, share.u0, share.u1, a.count, vy);
    return;
  }
  const int sig_lane = !v.signatures || n == 1 ? 0 : signature_lane(n);
  send_signature(a, sig_lane, n, bs);
  bool ok = signature_ok(a, sig_lane, n, bs);
  for (uint32_t r = 0; r < share.rounds; ++r) {
    const RoundPlace p = round_place(a, share, bs, r);
    const int64_t r0 = p.r0;
    const int len = p.len;
    const Channel<P, T> ch(v, 0, static_cast<int>(blockIdx.x), p.parity, p.epoch);
    round_start<P>(v, p, &ok);
    // piece j of this rank's input goes to rank j, next rank first
    send_pieces<1, P, T, W, K>(ch, x, vx, p, nullptr, false);
    round_sent<P>(v, p, &ok);
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
      const Unit<W> own = ch.prepare(x.load(rank, r0 + i, vx));
      Unit<W> res;
      if (ok) ok = reduce_slot<0, P, T, SumOp, W>(ch, n, i, own, &res);
      store_unit<T, W>(y, r0 + i, a.count, vy, ok ? res : poison_unit<W>());
    }
    if (r + 1 < share.rounds && round_boundary(ok)) {
      poison_units<T, W>(y, share.u0, share.u1, a.count, vy);
      return;
    }
  }
  if (n != 1 && block_failed(ok)) poison_units<T, W>(y, share.u0, share.u1, a.count, vy);
}


template <Proto P, bool K>
const void* gather_fn(DType dtype) {
  if constexpr (P == Proto::kSentinel) {
    // the pattern is a per-type NaN: one kernel per floating type, none for int32
    switch (dtype) {
      case DType::kF32: return reinterpret_cast<const void*>(&gather_kernel<P, float, K>);
      case DType::kBF16: return reinterpret_cast<const void*>(&gather_kernel<P, __nv_bfloat16, K>);
      case DType::kF16: return reinterpret_cast<const void*>(&gather_kernel<P, __half, K>);
      default: return nullptr;
    }
  } else {
    // bits: one kernel per element size
    switch (dtype_bytes(dtype)) {
      case 4: return reinterpret_cast<const void*>(&gather_kernel<P, int32_t, K>);
      case 2: return reinterpret_cast<const void*>(&gather_kernel<P, __half, K>);
      default: return nullptr;
    }
  }
}

template <Proto P, bool K>
const void* scatter_fn(DType dtype) {
  switch (dtype) {
    case DType::kF32: return reinterpret_cast<const void*>(&scatter_kernel<P, float, K>);
    case DType::kBF16: return reinterpret_cast<const void*>(&scatter_kernel<P, __nv_bfloat16, K>);
    case DType::kF16: return reinterpret_cast<const void*>(&scatter_kernel<P, __half, K>);
    case DType::kI32:
      if constexpr (P == Proto::kSentinel) {
        return nullptr;  // (all-ones is a valid int32)
      } else {
        return reinterpret_cast<const void*>(&scatter_kernel<P, int32_t, K>);
      }
  }
  return nullptr;
}

template <Proto P, bool K>
const void* kernel_of(Collective c, DType dtype) {
  if (c == Collective::kAllGather) return gather_fn<P, K>(dtype);
  if (c == Collective::kReduceScatter) return scatter_fn<P, K>(dtype);
  return nullptr;
}

template <Proto P>
const void* kernel_of(Collective c, DType dtype, bool packed) {
  return packed ? kernel_of<P, true>(c, dtype) : kernel_of<P, false>(c, dtype);
}

// The kernel of the combination, packed (Pieces) or not.
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

bool has_gather_scatter_kernel(Collective c, Algorithm algorithm, DType dtype) {
  return kernel_for(c, algorithm, dtype) != nullptr;
}

Status launch_gather_scatter(Collective c, Algorithm algorithm, DType dtype, const RankView& view,
                             const void* in, void* out, int64_t count, int64_t segment,
                             cudaStream_t stream) {
  if (kernel_for(c, algorithm, dtype) == nullptr) return Status::NoKernel();
  if (!segments_fit(count, segment)) return Status::NoPlan();
  const void* fn = kernel_for(
      c, algorithm, dtype,
      pieces_packed(count, segment, dtype_bytes(dtype), unit_bytes_of(algorithm)));
  LaunchPlan plan = plan_all_reduce(algorithm, count, dtype_bytes(dtype), view.nranks, view.geo,
                                    view.max_blocks, view.signatures != 0);
  if (plan.blocks == 0) return Status::NoPlan();
  plan.threads = piece_lane_threads(std::min(plan.span, plan.round_units), view.nranks,
                                    view.signatures != 0);
  const bool pdl = launches_early(view, plan.blocks);
  // (a call's segment is part of what its peers must agree on: folded into the
  // signature's reduction field, which these collectives do not use)
  const uint32_t layout = segment == count ? 0 : 1 + static_cast<uint32_t>(segment % 15);
  GatherScatterArgs args{
      {view, in, out, count, plan.units, plan.span, plan.round_units,
       static_cast<uint32_t>(plan.rounds), static_cast<uint32_t>(plan.last_rounds), pdl ? 1 : 0,
       encode_signature(static_cast<uint32_t>(c), static_cast<uint32_t>(algorithm),
                        static_cast<uint32_t>(dtype), layout, count)},
      segment};
  return launch_collective(fn, plan.blocks, plan.threads, pdl, &args, stream);
}

bool segments_fit(int64_t count, int64_t segment) {
  return segment > 0 && segment <= count && count % segment == 0;
}

std::vector<const void*> gather_scatter_kernel_functions() {
  std::vector<const void*> out;
  for (Collective c : {Collective::kAllGather, Collective::kReduceScatter}) {
    for (Algorithm a : {Algorithm::kOneShotLL, Algorithm::kOneShotSentinel,
                        Algorithm::kOneShotBarrier}) {
      for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
        for (bool packed : {false, true}) {
          const void* fn = kernel_for(c, a, d, packed);
          // (the bit-moving gathers serve several dtypes with one kernel)
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
