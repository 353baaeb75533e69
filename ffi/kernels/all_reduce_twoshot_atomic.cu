// Two-shot LL128-atomic all-reduce (sum; f32, f16, bf16): the reduce-scatter is
// done by vector atomic adds into the owner's scratch lines (see
// jaxll/ll128_atomic.cuh), the all-gather by the sentinel protocol.
//
// Units are 128-byte lines of 31 f32 / 63 f16 or bf16 elements. In each round a
// block's piece of L lines is cut into N chunks of c = ceil(L/N) lines (padded);
// a group of 8 threads moves one line, 16 bytes per thread. Every rank adds its
// chunk j into rank j's lines and then bumps their counters; rank j waits for
// counters equal to N, clears the lines, and pushes the sums to every peer.
// Sums depend on the order in which the adds land: not reproducible run to run,
// but identical on every rank (all ranks take the owner's result).
#include "all_reduce_common.cuh"
#include "all_reduce_kernels.h"

namespace jaxll {
namespace {

// Element of a line slice: lane `lane` (0..7) holds elements
// [lane*V, lane*V+V) of the line, the last one of lane 7 being the counter.
template <class T>
struct LineSlice {
  static constexpr int V = 16 / sizeof(T);
  static constexpr int kData = line_data_elems<T>();
  using Bits = typename ElemTraits<T>::Bits;

  // Loads the slice of line `line` of the message (zeros past `limit`
  // elements and in the counter slot).
  __device__ static uint4 load(const T* x, int64_t line, int lane, int64_t limit) {
    Bits b[V];
#pragma unroll
    for (int s = 0; s < V; ++s) {
      const int slot = lane * V + s;
      const int64_t e = line * kData + slot;
      b[s] = (slot < kData && e < limit) ? reinterpret_cast<const Bits*>(x)[e] : Bits(0);
    }
    uint4 q;
    memcpy(&q, b, 16);
    return q;
  }
  __device__ static void store(T* y, int64_t line, int lane, int64_t limit, uint4 q) {
    Bits b[V];
    memcpy(b, &q, 16);
#pragma unroll
    for (int s = 0; s < V; ++s) {
      const int slot = lane * V + s;
      const int64_t e = line * kData + slot;
      if (slot < kData && e < limit) reinterpret_cast<Bits*>(y)[e] = b[s];
    }
  }
};

__device__ __forceinline__ uint4 ld_relaxed_16(const void* p) {
  uint64_t a, b;
  ld_relaxed_v2u64(p, &a, &b);
  return make_uint4(static_cast<uint32_t>(a), static_cast<uint32_t>(a >> 32),
                    static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32));
}
__device__ __forceinline__ void st_relaxed_16(void* p, uint4 q) {
  st_relaxed_v2u64(p, static_cast<uint64_t>(q.x) | static_cast<uint64_t>(q.y) << 32,
                   static_cast<uint64_t>(q.z) | static_cast<uint64_t>(q.w) << 32);
}

template <class T>
__device__ __forceinline__ uint4 canonical_16(uint4 q) {
  uint64_t a = static_cast<uint64_t>(q.x) | static_cast<uint64_t>(q.y) << 32;
  uint64_t b = static_cast<uint64_t>(q.z) | static_cast<uint64_t>(q.w) << 32;
  a = sentinel_canonicalize<T>(a);
  b = sentinel_canonicalize<T>(b);
  return make_uint4(static_cast<uint32_t>(a), static_cast<uint32_t>(a >> 32),
                    static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32));
}

template <class T>
__device__ __forceinline__ void twoshot_atomic_body(const AllReduceArgs& a) {
  using S = LineSlice<T>;
  const RankView& v = a.view;
  const int rank = v.rank;
  const int n = v.nranks;
  const T* x = static_cast<const T*>(a.in);
  T* y = static_cast<T*>(a.out);
  const int lane = threadIdx.x & 7;
  const int group = threadIdx.x >> 3;
  const int groups = blockDim.x >> 3;
  const int b = static_cast<int>(blockIdx.x);
  const BlockShare share = block_share(a);
  const uint4 poison = make_uint4(~0u, ~0u, ~0u, ~0u);
  collective_prologue(a);

  const BlockStart bs = block_begin(v, share.rounds);
  if (bs.had_error) {
    for (int64_t l = share.u0 + group; l < share.u1; l += groups)
      S::store(y, l, lane, a.count, poison);
    return;
  }
  const int sig_lane = v.signatures ? signature_lane(n) : 0;
  send_signature(a, sig_lane, n, bs);
  const uint32_t arrived = counter_bits<T>(n);
  const uint4 one = counter_slice<T>(counter_bits<T>(1));
  bool ok = signature_ok(a, sig_lane, n, bs);
  for (uint32_t r = 0; r < share.rounds; ++r) {
    const uint64_t epoch = bs.epoch + r;
    const int parity = static_cast<int>(epoch & 1);
    const int64_t r0 = share.u0 + static_cast<int64_t>(r) * a.round_units;
    const int64_t r1 = min(share.u1, r0 + a.round_units);
    const int64_t c = (r1 - r0 + n - 1) / n;
    const WaitContext ctx = wait_context(v, epoch);

    // Reduce-scatter: add chunk j (lines r0 + j*c + k) into rank j's lines k,
    // then, once those adds are ordered, count this rank in.
    for (int64_t i = group; i < n * c; i += groups) {
      const int k = static_cast<int>(i / c);
      const int owner = peer_at(rank, k, n);
      const int64_t t = i - k * c;
      const int64_t line = r0 + owner * c + t;
      const uint4 q = line < r1 ? S::load(x, line, lane, a.count) : make_uint4(0, 0, 0, 0);
      red_add_16<T>(atomic_region(v, owner, b, parity) + t * kLineBytes + lane * 16, q);
    }
    // Every lane's adds are ordered before the warp barrier; lane 7's fence
    // after it is cumulative over them, so the counter bump releases them all.
    __syncwarp();
    if (lane == 7) {
      fence_sys();
      for (int64_t i = group; i < n * c; i += groups) {
        const int k = static_cast<int>(i / c);
        const int owner = peer_at(rank, k, n);
        const int64_t t = i - k * c;
        red_add_16<T>(atomic_region(v, owner, b, parity) + t * kLineBytes + 7 * 16, one);
      }
    }

    // Owner: wait for N arrivals per line, take the sum, clear the line, send it on.
    for (int64_t t = group; t < c; t += groups) {
      char* line_base = atomic_region(v, rank, b, parity) + t * kLineBytes;
      const uint32_t* counter = reinterpret_cast<const uint32_t*>(line_base + kLineBytes - 4);
      if (ok) {
        ok = bounded_wait(ctx, static_cast<uint32_t>(rank), [&] {
          return (ld_acquire_u32(counter) & counter_mask<T>()) == arrived;
        });
      }
      uint4 q = poison;
      if (ok) {
        q = ld_relaxed_16(line_base + lane * 16);
        st_relaxed_16(line_base + lane * 16, make_uint4(0, 0, 0, 0));
        if (lane == 7) q.w &= ~counter_mask<T>();
        q = canonical_16<T>(q);
        for (int k = 1; k < n; ++k)
          st_relaxed_16(sentinel_region(v, peer_at(rank, k, n), 1, b, parity, rank) +
                            t * kLineBytes + lane * 16,
                        q);
      }
      const int64_t line = r0 + rank * c + t;
      if (line < r1) S::store(y, line, lane, a.count, q);
    }

    // All-gather: the other owners' sums, through sentinel scratch.
    for (int64_t i = group; i < (n - 1) * c; i += groups) {
      const int k = static_cast<int>(i / c) + 1;
      const int owner = peer_at(rank, k, n);
      const int64_t t = i - (k - 1) * c;
      char* p = sentinel_region(v, rank, 1, b, parity, owner) + t * kLineBytes + lane * 16;
      uint64_t lo = 0, hi = 0;
      if (ok) {
        ok = bounded_wait(ctx, static_cast<uint32_t>(owner), [&] {
          ld_relaxed_v2u64(p, &lo, &hi);
          return !sentinel_present<T>(lo) && !sentinel_present<T>(hi);
        });
        if (ok) st_relaxed_v2u64(p, kSentinelWord, kSentinelWord);
      }
      const uint4 q = ok ? make_uint4(static_cast<uint32_t>(lo), static_cast<uint32_t>(lo >> 32),
                                      static_cast<uint32_t>(hi), static_cast<uint32_t>(hi >> 32))
                         : poison;
      const int64_t line = r0 + owner * c + t;
      if (line < r1) S::store(y, line, lane, a.count, q);
    }
    if (r + 1 < share.rounds && round_boundary(ok)) {
      // (earlier rounds too)
      for (int64_t l = share.u0 + group; l < share.u1; l += groups) S::store(y, l, lane, a.count, poison);
      return;
    }
  }
  if (block_failed(ok)) {
    for (int64_t l = share.u0 + group; l < share.u1; l += groups)
      S::store(y, l, lane, a.count, poison);
  }
}

template <class T>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) twoshot_atomic_kernel(AllReduceArgs a) {
  twoshot_atomic_body<T>(a);
}

// Every rank of a virtual group in one launch (GroupArgs, all_reduce_common.cuh).
template <class T>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    twoshot_atomic_group_kernel(const __grid_constant__ GroupArgs<AllReduceArgs> g) {
  twoshot_atomic_body<T>(g.rank[blockIdx.y]);
}

template <class T>
void add(KernelTable& t) {
  t.add(Family::kTwoShotAtomic, Proto::kSentinel, dtype_of<T>(), ReduceOp::kSum, 0,
        reinterpret_cast<const void*>(&twoshot_atomic_kernel<T>),
        reinterpret_cast<const void*>(&twoshot_atomic_group_kernel<T>));
}

}  // namespace

void register_atomic_kernels(KernelTable& t) {
  add<float>(t);
  add<__nv_bfloat16>(t);
  add<__half>(t);
}

}  // namespace jaxll
