// Ragged all-to-all on the LL16 protocol (ragged.h), written with the device
// API's channels as the other exchanges are (exchange.cu).
//
// The message from rank s to rank d is the concatenation of s's slices for d,
// each padded to whole 8-byte units (so a unit never holds two slices'
// elements, and a slice's units are contiguous rows of the operand and of the
// output). Block b of every rank moves its share of every message: of a
// message of L units, units [b x ceil(L / B), ...) for a grid of B blocks, in
// rounds of the region's data slots. Slot 0 of every (block, round, source)
// region carries the sender's round count, slots 1..S the (size, output
// offset) of each slice, and the units follow: a receiver learns the sizes,
// where the rows go and how many rounds the call takes from the packets it
// polls anyway. The round count is the most any pair of ranks needs, which
// every rank learns in round 0 (each sender sends the most its own messages
// need, and every rank hears from every rank), so every rank runs the same
// rounds; the epochs are reserved at the end (block_end_rounds). Every rank
// sends to every peer in every round (slot 0 at least), so the scratch
// alternates by epoch parity with no barrier (call_args.cuh).
#include <algorithm>

#include "kernels/call_args.cuh"
#include "kernels/launch.h"
#include "kernels/pieces.cuh"
#include "kernels/ragged.h"

namespace jaxll {
namespace {

struct RaggedArgs {
  RankView view;
  uint64_t signature;
  RaggedCall call;
  uint32_t round_units;  // data slots of a region per round (after the header's)
  int trigger;
};

// Units of a block: a grid of at most this many units a block (as the one-shot
// kernels: all_reduce.cc).
constexpr int64_t kBlockUnits = 128;
constexpr uint32_t kInvalidSlice = 0xFFFFFFFFu;

// What a block knows of its messages, in shared memory. Index t is a peer's
// offset from this rank less one (peer_at(rank, t + 1, n)); t = n - 1 is this
// rank itself. Slice k of a message starts at unit start[t][k].
struct Layout {
  uint32_t send_start[kMaxRanks][kMaxRaggedSlices + 1];
  int32_t send_row[kMaxRanks][kMaxRaggedSlices];    // first operand row of slice k
  uint32_t send_size[kMaxRanks][kMaxRaggedSlices];  // its rows (kInvalidSlice: out of range)
  int32_t send_out[kMaxRanks][kMaxRaggedSlices];    // its output_offsets entry
  int32_t expect[kMaxRanks][kMaxRaggedSlices];      // this rank's recv_sizes entry
  uint32_t recv_start[kMaxRanks][kMaxRaggedSlices + 1];
  int32_t recv_row[kMaxRanks][kMaxRaggedSlices];    // first output row of slice k
  uint32_t recv_size[kMaxRanks][kMaxRaggedSlices];
  // this round's units of each message: [first, first + count)
  uint32_t send_first[kMaxRanks], send_count[kMaxRanks];
  uint32_t recv_first[kMaxRanks], recv_count[kMaxRanks];
  uint32_t rounds;
};

// Units of a slice of `rows` rows.
template <int E>
__device__ __forceinline__ uint32_t slice_units(uint32_t rows, int64_t row_elems) {
  return static_cast<uint32_t>((static_cast<int64_t>(rows) * row_elems + E - 1) / E);
}

// This block's units of a message of `total` units in round r of R-unit rounds.
__device__ __forceinline__ void round_range(uint32_t total, uint32_t r, uint32_t R,
                                            uint32_t* first, uint32_t* count) {
  const uint32_t chunk = (total + gridDim.x - 1) / gridDim.x;
  const uint32_t lo = min(total, blockIdx.x * chunk);
  const uint32_t hi = min(total, lo + chunk);
  const uint32_t a = min(hi, lo + r * R);
  *first = a;
  *count = min(hi, a + R) - a;
}

// Rounds a message of `total` units takes (at least one: the header).
__device__ __forceinline__ uint32_t rounds_for(uint32_t total, uint32_t R) {
  const uint32_t chunk = (total + gridDim.x - 1) / gridDim.x;
  return max(1u, (chunk + R - 1) / R);
}

// The slice of a message holding unit u (starts[0] = 0 <= u < starts[S]).
__device__ __forceinline__ int slice_of(const uint32_t* starts, int S, uint32_t u) {
  int k = 0;
  while (k + 1 < S && starts[k + 1] <= u) ++k;
  return k;
}

// Unit u of slice k (elements past the slice read as zero bits); elements are
// raw bits B, E = 8 / sizeof(B) of them a unit.
template <class B>
__device__ __forceinline__ uint64_t load_slice_unit(const B* base, int64_t first_elem,
                                                    int64_t elems, int64_t j) {
  constexpr int E = 8 / static_cast<int>(sizeof(B));
  const B* p = base + first_elem + j * E;
  const int64_t left = elems - j * E;
  if (left >= E && reinterpret_cast<uintptr_t>(p) % 8 == 0) return *reinterpret_cast<const uint64_t*>(p);
  B b[E];
#pragma unroll
  for (int e = 0; e < E; ++e) b[e] = e < left ? p[e] : B(0);
  uint64_t out;
  memcpy(&out, b, 8);
  return out;
}

template <class B>
__device__ __forceinline__ void store_slice_unit(B* base, int64_t first_elem, int64_t elems,
                                                 int64_t j, uint64_t v) {
  constexpr int E = 8 / static_cast<int>(sizeof(B));
  B* p = base + first_elem + j * E;
  const int64_t left = elems - j * E;
  if (left >= E && reinterpret_cast<uintptr_t>(p) % 8 == 0) {
    *reinterpret_cast<uint64_t*>(p) = v;
    return;
  }
  B b[E];
  memcpy(b, &v, 8);
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (e < left) p[e] = b[e];
}

// The lane j of a round's flat lanes over peers t = 0..n-2 with `count[t]`
// units each: its peer offset and unit index; false past the last.
__device__ __forceinline__ bool lane_of(const uint32_t* count, int peers, uint32_t j, int* t,
                                        uint32_t* i) {
  for (int q = 0; q < peers; ++q) {
    if (j < count[q]) {
      *t = q;
      *i = j;
      return true;
    }
    j -= count[q];
  }
  return false;
}

// Every element of this block's share of the output becomes the poison.
template <class B>
__device__ __forceinline__ void poison_output(const RaggedCall& c) {
  const int64_t elems = c.output_rows * c.row_elems;
  const int64_t chunk = (elems + gridDim.x - 1) / gridDim.x;
  const int64_t lo = min(elems, blockIdx.x * chunk);
  const int64_t hi = min(elems, lo + chunk);
  B* y = static_cast<B*>(c.output);
  for (int64_t e = lo + threadIdx.x; e < hi; e += blockDim.x) y[e] = static_cast<B>(~B(0));
}

template <class B>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) ragged_kernel(RaggedArgs a) {
  constexpr int E = 8 / static_cast<int>(sizeof(B));
  __shared__ Layout s;
  const RankView& v = a.view;
  const RaggedCall& c = a.call;
  const int rank = v.rank;
  const int n = v.nranks;
  const int S = c.slices;
  const uint32_t R = a.round_units;
  const B* x = static_cast<const B*>(c.operand);
  B* y = static_cast<B*>(c.output);
  grid_dependency_wait();
  if (a.trigger) allow_dependent_launch();
  if (threadIdx.x == 0) s.rounds = 1;
  const BlockStart bs = block_begin(v, 0);  // (rounds reserved at the end)
  if (bs.had_error) {
    poison_output<B>(c);
    return;
  }
  const WaitContext ctx = wait_context(v, bs.epoch);
  const int sig_lane = !v.signatures || n == 1 ? 0 : signature_lane(n);
  send_signature(a, sig_lane, n, bs);
  bool ok = signature_ok(a, sig_lane, n, bs);

  // What this rank sends and expects: a lane per (peer, slice) loads the four
  // entries of its index together (peer d's slice k is entry d x S + k of this
  // rank's arrays, for the slice d sends it too); the slices are checked
  // against the operand (this rank's own against its output and recv_sizes too)
  const uint32_t threads = lane_threads(v);
  for (int j = threadIdx.x; j < n * S && threadIdx.x < threads; j += threads) {
    const int t = j / S;
    const int k = j - t * S;
    const int d = peer_at(rank, t + 1, n);
    const int i = d * S + k;
    const int32_t row = c.input_offsets[i];
    const int32_t rows = c.send_sizes[i];
    const int32_t out = c.output_offsets[i];
    const int32_t want = c.recv_sizes[i];
    bool valid = rows >= 0 && row >= 0 && static_cast<int64_t>(row) + rows <= c.operand_rows;
    if (!valid) {
      report_error(ctx, ErrorKind::kRagged, static_cast<uint32_t>(d),
                   ragged_record(RaggedProblem::kInputRange, k, static_cast<uint32_t>(row)),
                   ragged_values(static_cast<uint32_t>(rows), static_cast<uint32_t>(c.operand_rows)));
    } else if (d == rank && want != rows) {
      valid = false;
      report_error(ctx, ErrorKind::kRagged, static_cast<uint32_t>(d),
                   ragged_record(RaggedProblem::kSizes, k, static_cast<uint32_t>(want)),
                   ragged_values(static_cast<uint32_t>(rows), 0));
    } else if (d == rank && (out < 0 || static_cast<int64_t>(out) + rows > c.output_rows)) {
      valid = false;
      report_error(ctx, ErrorKind::kRagged, static_cast<uint32_t>(d),
                   ragged_record(RaggedProblem::kOutputRange, k, static_cast<uint32_t>(out)),
                   ragged_values(static_cast<uint32_t>(rows), static_cast<uint32_t>(c.output_rows)));
    }
    ok = ok && valid;
    s.send_row[t][k] = row;
    s.send_size[t][k] = valid ? static_cast<uint32_t>(rows) : kInvalidSlice;
    s.send_out[t][k] = out;
    s.expect[t][k] = want;
    if (d == rank) s.recv_row[t][k] = out;
  }
  __syncthreads();
  // each message's slices in units, and the rounds this rank's messages need
  if (threadIdx.x < n) {
    const int t = threadIdx.x;
    uint32_t units = 0;
    for (int k = 0; k < S; ++k) {
      s.send_start[t][k] = units;
      if (s.send_size[t][k] != kInvalidSlice) units += slice_units<E>(s.send_size[t][k], c.row_elems);
    }
    s.send_start[t][S] = units;
    if (t < n - 1) atomicMax(&s.rounds, rounds_for(units, R));
  }
  __syncthreads();
  const uint32_t my_rounds = s.rounds;
  uint32_t rounds = 1;
  for (uint32_t r = 0; r < rounds; ++r) {
    const uint64_t epoch = bs.epoch + r;
    const int parity = static_cast<int>(epoch & 1);
    const Channel<Proto::kLL, int32_t> ch(v, 0, static_cast<int>(blockIdx.x), parity, epoch);
    ll_round_begin(v, epoch, parity);
    if (threadIdx.x < n - 1) {
      const int t = threadIdx.x;
      round_range(s.send_start[t][S], r, R, &s.send_first[t], &s.send_count[t]);
    }
    __syncthreads();
    // the header: the round count, then (size, output offset) of every slice
    // (round 0 only: later rounds send slot 0 alone, which keeps the scratch's
    // parity argument)
    const int slots = r == 0 ? S + 1 : 1;
    for (int j = threadIdx.x; j < (n - 1) * slots && threadIdx.x < threads; j += threads) {
      const int t = j / slots;
      const int k = j - t * slots;
      const int d = peer_at(rank, t + 1, n);
      uint64_t word = my_rounds;
      if (k > 0) {
        word = static_cast<uint64_t>(static_cast<uint32_t>(s.send_out[t][k - 1])) << 32 |
               s.send_size[t][k - 1];
      }
      ch.send(d, k, Unit<8>{{word}});
    }
    // the units
    uint32_t lanes = 0;
    for (int t = 0; t < n - 1; ++t) lanes += s.send_count[t];
    for (uint32_t j = threadIdx.x; j < lanes && threadIdx.x < threads; j += threads) {
      int t;
      uint32_t i;
      lane_of(s.send_count, n - 1, j, &t, &i);
      const uint32_t u = s.send_first[t] + i;
      const int k = slice_of(s.send_start[t], S, u);
      const int64_t elems = static_cast<int64_t>(s.send_size[t][k]) * c.row_elems;
      const uint64_t bits = load_slice_unit<B>(x, static_cast<int64_t>(s.send_row[t][k]) * c.row_elems,
                                               elems, u - s.send_start[t][k]);
      ch.send(peer_at(rank, t + 1, n), S + 1 + static_cast<int>(i), Unit<8>{{bits}});
    }
    if (r == 0) {
      // this rank's own slices: its share of them, copied in this round
      const uint32_t total = s.send_start[n - 1][S];
      const uint32_t chunk = (total + gridDim.x - 1) / gridDim.x;
      const uint32_t first = min(total, blockIdx.x * chunk);
      const uint32_t count = min(total, first + chunk) - first;
      for (uint32_t j = threadIdx.x; j < count && threadIdx.x < threads; j += threads) {
        const uint32_t u = first + j;
        const int k = slice_of(s.send_start[n - 1], S, u);
        const int64_t elems = static_cast<int64_t>(s.send_size[n - 1][k]) * c.row_elems;
        const int64_t jk = u - s.send_start[n - 1][k];
        store_slice_unit<B>(y, static_cast<int64_t>(s.recv_row[n - 1][k]) * c.row_elems, elems, jk,
                            load_slice_unit<B>(x, static_cast<int64_t>(s.send_row[n - 1][k]) *
                                                      c.row_elems, elems, jk));
      }
    }
    // every peer's header (round 0: checked against recv_sizes and the output)
    for (int j = threadIdx.x; j < (n - 1) * slots && threadIdx.x < threads; j += threads) {
      const int t = j / slots;
      const int k = j - t * slots;
      const int src = peer_at(rank, t + 1, n);
      Unit<8> w{};
      if (ok) ok = channel_recv<Proto::kLL, int32_t, 8>(ch, src, k, &w);
      if (!ok || r > 0) continue;
      if (k == 0) {
        atomicMax(&s.rounds, static_cast<uint32_t>(w.p[0]));
        continue;
      }
      const uint32_t rows = static_cast<uint32_t>(w.p[0]);
      const int32_t out = static_cast<int32_t>(w.p[0] >> 32);
      const int32_t want = s.expect[t][k - 1];
      s.recv_row[t][k - 1] = out;
      s.recv_size[t][k - 1] = 0;
      if (rows == kInvalidSlice) {
        ok = false;
        report_error(ctx, ErrorKind::kRagged, static_cast<uint32_t>(src),
                     ragged_record(RaggedProblem::kPeerSlice, k - 1, 0), 0);
      } else if (static_cast<uint32_t>(want) != rows) {
        ok = false;
        report_error(ctx, ErrorKind::kRagged, static_cast<uint32_t>(src),
                     ragged_record(RaggedProblem::kSizes, k - 1, static_cast<uint32_t>(want)),
                     ragged_values(rows, 0));
      } else if (out < 0 || static_cast<int64_t>(out) + rows > c.output_rows) {
        ok = false;
        report_error(ctx, ErrorKind::kRagged, static_cast<uint32_t>(src),
                     ragged_record(RaggedProblem::kOutputRange, k - 1, static_cast<uint32_t>(out)),
                     ragged_values(rows, static_cast<uint32_t>(c.output_rows)));
      } else {
        s.recv_size[t][k - 1] = rows;
      }
    }
    __syncthreads();
    if (threadIdx.x < n - 1) {
      const int t = threadIdx.x;
      if (r == 0) {
        uint32_t units = 0;
        for (int k = 0; k < S; ++k) {
          s.recv_start[t][k] = units;
          units += slice_units<E>(s.recv_size[t][k], c.row_elems);
        }
        s.recv_start[t][S] = units;
      }
      round_range(s.recv_start[t][S], r, R, &s.recv_first[t], &s.recv_count[t]);
    }
    __syncthreads();
    rounds = s.rounds;
    // every peer's units into their rows of the output
    lanes = 0;
    for (int t = 0; t < n - 1; ++t) lanes += s.recv_count[t];
    for (uint32_t j = threadIdx.x; j < lanes && threadIdx.x < threads; j += threads) {
      int t;
      uint32_t i;
      lane_of(s.recv_count, n - 1, j, &t, &i);
      const uint32_t u = s.recv_first[t] + i;
      const int k = slice_of(s.recv_start[t], S, u);
      Unit<8> w{};
      if (ok) ok = channel_recv<Proto::kLL, int32_t, 8>(ch, peer_at(rank, t + 1, n),
                                                      S + 1 + static_cast<int>(i), &w);
      if (!ok) break;
      store_slice_unit<B>(y, static_cast<int64_t>(s.recv_row[t][k]) * c.row_elems,
                          static_cast<int64_t>(s.recv_size[t][k]) * c.row_elems,
                          u - s.recv_start[t][k], w.p[0]);
    }
    if (r + 1 < rounds && round_boundary(ok)) {
      block_end_rounds(v, bs, r + 1);
      poison_output<B>(c);
      return;
    }
  }
  block_end_rounds(v, bs, rounds);
  if (block_failed(ok)) poison_output<B>(c);
}

const void* kernel_for(Algorithm algorithm, DType dtype) {
  if (algorithm != Algorithm::kOneShotLL) return nullptr;
  switch (dtype_bytes(dtype)) {  // (bits: one kernel per element size)
    case 4: return reinterpret_cast<const void*>(&ragged_kernel<uint32_t>);
    case 2: return reinterpret_cast<const void*>(&ragged_kernel<uint16_t>);
    default: return nullptr;
  }
}

}  // namespace

bool has_ragged_kernel(Algorithm algorithm, DType dtype) {
  return kernel_for(algorithm, dtype) != nullptr;
}

Status launch_ragged_all_to_all(Algorithm algorithm, DType dtype, const RankView& view,
                                const RaggedCall& call, cudaStream_t stream) {
  const void* fn = kernel_for(algorithm, dtype);
  if (fn == nullptr) return Status::NoKernel();
  const int n = view.nranks;
  const int S = call.slices;
  if (S < 1 || S > kMaxRaggedSlices || call.row_elems <= 0 || call.operand_rows < 0 ||
      call.output_rows < 0) {
    return Status::NoPlan();
  }
  const int E = 8 / dtype_bytes(dtype);
  const int64_t region_units = view.geo.region_bytes / 8;
  const int64_t R = region_units - (S + 1);
  if (R < 1 || view.max_blocks <= 0) return Status::NoPlan();
  // (the most units one message may hold: every slice as long as the operand
  // or the output allows)
  const int64_t slice_cap = (std::min(call.operand_rows, call.output_rows) * call.row_elems + E - 1) / E;
  const int64_t cap = slice_cap * S;
  if (cap > 0xFFFFFFFFll) return Status::NoPlan();
  const int64_t bound = std::min<int64_t>({view.max_blocks, kMaxBlocks, view.geo.blocks});
  const int64_t blocks = std::max<int64_t>(1, std::min(bound, (cap + kBlockUnits - 1) / kBlockUnits));
  const bool signatures = view.signatures != 0;
  const int64_t work = std::max<int64_t>(1, std::min(R, (cap + blocks - 1) / blocks));
  const int header_lanes = (n > 1 ? n - 1 : 1) * (S + 1);
  const int threads = std::max(piece_lane_threads(work, n, signatures),
                               std::min(kBlockThreads, (header_lanes + 31) / 32 * 32 +
                                                           (n > 1 && signatures ? 32 : 0)));
  const bool pdl = launches_early(view, blocks);
  // (the slices a peer and the row size fold into the signature's reduction
  // field, the most units of a message into its count: peers with other
  // shapes would cut their messages otherwise)
  const uint32_t layout = 1 + static_cast<uint32_t>((S * 31 + call.row_elems) % 15);
  RaggedArgs args{view,
                  encode_signature(static_cast<uint32_t>(Collective::kRaggedAllToAll),
                                   static_cast<uint32_t>(algorithm), static_cast<uint32_t>(dtype),
                                   layout, cap),
                  call, static_cast<uint32_t>(std::min<int64_t>(R, 0xFFFFFFFFll)), pdl ? 1 : 0};
  return launch_collective(fn, blocks, threads, pdl, &args, stream);
}

std::vector<const void*> ragged_kernel_functions() {
  return {reinterpret_cast<const void*>(&ragged_kernel<uint32_t>),
          reinterpret_cast<const void*>(&ragged_kernel<uint16_t>)};
}

}  // namespace jaxll
