// How the blocks of a row agree on its sum of squares: an exact SquareSum
// (square_sum.cuh), so that every block, every rank and every cut of the call
// gets the same bits, whichever blocks, warps and threads added which squares:
// within a block (block_sum), through this rank's header as tagged LL16 packets
// (row_total), or, on devices that launch thread-block clusters (compute
// capability 9.0 and newer), among the blocks of a row's cluster through
// distributed shared memory (cluster_row_total for the general kernel;
// wave_cluster_total, by st.async counted on an mbarrier, for the one-row-wave
// kernels).
#pragma once

#include <cooperative_groups.h>

#include "kernels/rmsnorm_rows.cuh"
#include "kernels/square_sum.cuh"

namespace jaxll {

static_assert(kSquareSumWords == kNormPartialWords, "the header's partials hold a SquareSum");

// The sum of `v` over the block (every thread gets it; every thread must call),
// and whether every thread's *ok held: false in every thread's *ok otherwise
// (so the one barrier also does what block_failed does). `again`: an earlier
// call of this block may still be reading the partials (a barrier first).
__device__ __forceinline__ SquareSum block_sum_ok(SquareSum v, bool* ok, bool again) {
  __shared__ SquareSum s_part[kBlockThreads / 32];
  __shared__ int s_bad[kBlockThreads / 32];
  v = warp_square_sum(v);
  const bool bad = __any_sync(0xffffffffu, !*ok);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (again) __syncthreads();
  if (lane == 0) {
    s_part[warp] = v;
    s_bad[warp] = bad ? 1 : 0;
  }
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;  // (at most 32)
  if (__any_sync(0xffffffffu, lane < warps && s_bad[lane])) *ok = false;
  return warp_square_sum(lane < warps ? s_part[lane] : SquareSum::empty());
}

// The sum of `v` over the block (every thread gets it; every thread must call).
__device__ __forceinline__ SquareSum block_sum(SquareSum v) {
  bool ok = true;
  return block_sum_ok(v, &ok, true);
}

// Packet `word` of block `block`'s partial sum for row-waves of parity `parity`.
__device__ __forceinline__ LL16* norm_partial(const RankView& v, int block, int parity, int word) {
  return reinterpret_cast<LL16*>(v.header->norm_partials[block][parity][word]);
}

// Publishes this block's partial sum of squares of row-wave `tag` and returns
// the row's total over its S blocks (the same bits in every block and on every
// rank). Warp 0 reads the S partials (lane l those of segments l, l + 32) and
// merges them; the block takes the total from it. False in *ok when a wait
// gave up.
__device__ __forceinline__ SquareSum row_total(const RmsNormArgs& a, const Segment& g,
                                               const SquareSum& part, uint64_t tag, int parity,
                                               uint64_t epoch, bool* ok) {
  __shared__ SquareSum s_total;
  __shared__ int s_failed;
  const RankView& v = a.base.view;
  const uint32_t flag = static_cast<uint32_t>(tag);
  const uint64_t high = tag >> 32;
  if (threadIdx.x < kSquareSumWords) {
    const int w = static_cast<int>(threadIdx.x);
    ll16_store(norm_partial(v, blockIdx.x, parity, w), (high << 32) | square_sum_word(part, w), flag);
  }
  if (threadIdx.x < 32) {
    const int first = static_cast<int>(g.group) * a.segments;
    SquareSum t = SquareSum::empty();
    bool failed = false;
    for (int j = threadIdx.x; j < a.segments; j += 32) {
      uint32_t words[kSquareSumWords];
#pragma unroll
      for (int w = 0; w < kSquareSumWords; ++w) {
        const LL16* slot = norm_partial(v, first + j, parity, w);
        LL16Value q = ll16_load(slot);
        auto ready = [&] { return ll16_ready(q, flag) && (ll16_payload(q) >> 32) == high; };
        bool got = ready();
        if (!got && *ok && !failed) {
          // (a timeout here names this rank and the block's last round: a
          // sibling block of this rank did not finish that round)
          const WaitContext ctx = wait_context(v, epoch);
          got = bounded_wait(ctx, static_cast<uint32_t>(v.rank), [&] {
            q = ll16_load(slot);
            return ready();
          });
        }
        failed |= !got;
        words[w] = static_cast<uint32_t>(ll16_payload(q));
      }
      t.merge(square_sum_of(words));
    }
    t = warp_square_sum(t);
    failed = __any_sync(0xffffffffu, failed);
    if (threadIdx.x == 0) {
      s_total = t;
      s_failed = failed ? 1 : 0;
    }
  }
  __syncthreads();
  if (s_failed) *ok = false;
  const SquareSum total = s_total;
  __syncthreads();  // s_total is read by every thread before the next row reuses it
  return total;
}

// The row's total when its S blocks are one cluster: every block writes its
// partial (and whether it failed) into slot [parity][segment] of each sibling's
// shared memory, and the cluster barrier (release/acquire at cluster scope)
// makes all S visible; every block then adds them in segment order. Every
// thread of every block of the cluster calls it once per row the blocks hold,
// failed or not (a block that gave up still takes part, so no sibling waits on
// it; its failure reaches the siblings, which then poison their segments). The
// drain is needed for correctness: a sibling that left early would not hang the
// barrier (it counts only threads that have not exited), but the others would
// read its slot from an earlier row or call and write a wrong, unpoisoned norm.
// Slot parity alternates by row: a sibling writes row k + 2's slot only after
// the barrier of row k + 1, which this block reaches after reading row k's.
// No block may touch a sibling's shared memory before the sibling has started:
// every thread arrives on the cluster barrier at kernel entry
// (cluster_entry_arrive) and waits on it before its first exchange (`entered`
// tracks that), so the wait costs nothing once the row is reduced. After its
// last exchange no block touches another's shared memory, so blocks may exit.
__device__ __forceinline__ void cluster_entry_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
#endif
}

__device__ __forceinline__ SquareSum cluster_row_total(const SquareSum& part, int parity,
                                                       int segments, bool* ok, bool* entered) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  __shared__ SquareSum s_total_part[2][kClusterSegments];
  __shared__ int s_total_bad[2][kClusterSegments];
  if (!*entered) {
    asm volatile("barrier.cluster.wait;" ::: "memory");  // every sibling has started
    *entered = true;
  }
  cg::cluster_group cluster = cg::this_cluster();
  if (cluster.num_blocks() != static_cast<unsigned>(segments)) __trap();  // launch/plan disagree
  const unsigned seg = cluster.block_rank();
  if (threadIdx.x < static_cast<unsigned>(segments)) {
    *cluster.map_shared_rank(&s_total_part[parity][seg], threadIdx.x) = part;
    *cluster.map_shared_rank(&s_total_bad[parity][seg], threadIdx.x) = *ok ? 0 : 1;
  }
  cluster.sync();
  const int lane = threadIdx.x % 32;  // (segments <= kClusterSegments <= 32)
  if (__any_sync(0xffffffffu, lane < segments && s_total_bad[parity][lane])) *ok = false;
  return warp_square_sum(lane < segments ? s_total_part[parity][lane] : SquareSum::empty());
#else
  __trap();  // the host launches clusters only where the device has them
  return part;
#endif
}

// A clustered block that gave up before row `from`'s exchange: it still takes
// part in the exchanges of that row and the later ones, flagged as failed.
__device__ __forceinline__ void cluster_drain(const RmsNormArgs& a, const Segment& g,
                                              int64_t from, bool* entered) {
  for (int64_t k = from; k < g.rows; ++k) {
    bool ok = false;  // (sends its failure)
    cluster_row_total(SquareSum::empty(), static_cast<int>(k & 1), a.segments, &ok, entered);
  }
}

// --- The one-row-wave kernels' row total over a cluster ---------------------------
// In a one-row-wave call (the decode-shape and two-shot kernels) each block of
// a clustered row makes one exchange, so it can do without the cluster
// barrier (whose arrive releases every earlier store of the thread at cluster
// scope; it measured 0.1-0.5 us a call slower on one H200). Each block sums
// its squares (block_sum_ok), then sends its sum and whether it failed to
// every sibling with st.async into slot [segment] of the sibling's shared
// memory, and each block waits on its own mbarrier, which completes once all
// S slots have landed; every warp then merges them (exactly: every block and
// rank gets the same total).
// The mbarrier is initialised at kernel entry and made visible to the siblings
// by the entry arrive (wave_cluster_begin) and the wait before the first
// exchange; a block only waits for what lands in its own shared memory, and it
// leaves only once every sibling's stores into it have landed, so no store
// reaches a block that has left. Every block of the cluster sends exactly once
// (a block that gave up sends its failure: wave_give_up), else its siblings
// would wait forever (as on the cluster barrier it replaces).
// (a slot: the block's SquareSum's words, then 1 if it failed)
struct alignas(16) WaveClusterSlot {
  uint32_t w[kSquareSumWords + 1];
};
struct WaveClusterSlots {
  alignas(8) unsigned long long bar;
  WaveClusterSlot slot[kClusterSegments];
};

__device__ __forceinline__ WaveClusterSlots& wave_cluster_slots() {
  __shared__ WaveClusterSlots s;
  return s;
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Every thread of a clustered one-row-wave block calls it at kernel entry.
__device__ __forceinline__ void wave_cluster_begin(int segments) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t blocks;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(blocks));
  if (blocks != static_cast<uint32_t>(segments)) __trap();  // launch/plan disagree
  WaveClusterSlots& s = wave_cluster_slots();
  if (threadIdx.x == 0) {
    const uint32_t bar = shared_address(&s.bar);
    const uint32_t bytes = static_cast<uint32_t>(segments) * sizeof(WaveClusterSlot);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
#endif
  cluster_entry_arrive();
}

// The row's sum of squares from every thread's `squares` over the S blocks of
// the cluster; false in every thread's *ok of every block if any thread's *ok
// was false. Every thread of every block of the cluster calls it once.
__device__ __forceinline__ SquareSum wave_cluster_total(const SquareSum& squares, int segments,
                                                        bool* ok, bool* entered) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(sizeof(WaveClusterSlot) == 32, "two 16-byte stores a slot");
  WaveClusterSlots& s = wave_cluster_slots();
  const SquareSum v = block_sum_ok(squares, ok, false);
  const uint32_t bad = *ok ? 0u : 1u;
  if (!*entered) {
    asm volatile("barrier.cluster.wait;" ::: "memory");  // every sibling has started
    *entered = true;
  }
  uint32_t seg;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(seg));
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (threadIdx.x < static_cast<unsigned>(segments)) {
    uint32_t slot, bar;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(slot)
                 : "r"(shared_address(&s.slot[seg])), "r"(static_cast<uint32_t>(threadIdx.x)));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(bar)
                 : "r"(shared_address(&s.bar)), "r"(static_cast<uint32_t>(threadIdx.x)));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
                 ::"r"(slot), "r"(square_sum_word(v, 0)), "r"(square_sum_word(v, 1)),
                   "r"(square_sum_word(v, 2)), "r"(square_sum_word(v, 3)), "r"(bar)
                 : "memory");
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
                 ::"r"(slot + 16), "r"(square_sum_word(v, 4)), "r"(square_sum_word(v, 5)),
                   "r"(square_sum_word(v, 6)), "r"(bad), "r"(bar)
                 : "memory");
  }
  // (not a bounded wait, as the cluster barrier it replaces is not: every
  // sibling reaches its send above through bounded waits only, which end in a
  // failure it sends rather than in a return)
  const uint32_t bar = shared_address(&s.bar);
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0; "
        "selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar)
        : "memory");
  }
  // (segments <= kClusterSegments <= 32: lane l merges slot l)
  const bool mine = lane < segments;
  if (__any_sync(0xffffffffu, mine && s.slot[lane].w[kSquareSumWords] != 0)) *ok = false;
  return warp_square_sum(mine ? square_sum_of(s.slot[lane].w) : SquareSum::empty());
#else
  __trap();  // the host launches clusters only where the device has them
  return squares;
#endif
}

// A block of a one-row-wave call (wave_block) that gives up: poisons its
// segment and, clustered, still sends its siblings its failure
// (wave_cluster_total). The caller returns after it.
template <class T, int W>
__device__ __forceinline__ void wave_give_up(const RmsNormArgs& a, const Segment& g, bool* entered) {
  poison_segments<T, W>(a, g);
  if (a.clustered) {
    bool ok = false;  // (sends its failure)
    wave_cluster_total(SquareSum::empty(), a.segments, &ok, entered);
  }
}

// The row's sum of squares in a one-row-wave call from every thread's
// `squares`: the block's sum where the row is one segment, else from the
// cluster's siblings (wave_cluster_total) or through the header's slots (tag
// tag0 + 1, row_total); *ok false in every thread of the block (of the
// cluster, clustered) if it was false in any. False when the block must give
// up before the row's exchange (not clustered only: the caller poisons its
// segment and returns).
__device__ __forceinline__ bool wave_total(const RmsNormArgs& a, const Segment& g,
                                           const SquareSum& squares, uint64_t tag0, uint64_t epoch,
                                           bool* ok, bool* entered, float* total) {
  if (a.clustered) {
    *total = wave_cluster_total(squares, a.segments, ok, entered).to_float();
    return true;
  }
  const SquareSum part = block_sum_ok(squares, ok, false);
  if (!*ok) return false;
  *total = (a.segments == 1 ? part : row_total(a, g, part, tag0 + 1, 0, epoch, ok)).to_float();
  return true;
}

}  // namespace jaxll
