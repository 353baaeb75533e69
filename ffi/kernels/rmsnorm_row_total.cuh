// How the blocks of a row agree on its sum of squares, added in one fixed order
// so that every block and every rank gets the same bits: within a block
// (block_sum), through this rank's header as tagged LL16 packets (row_total),
// or, on devices that launch thread-block clusters (compute capability 9.0 and
// newer), among the blocks of a row's cluster through distributed shared
// memory (cluster_row_total for the general kernel; wave_cluster_total, by
// st.async counted on an mbarrier, for the one-row-wave kernels).
#pragma once

#include <cooperative_groups.h>

#include "kernels/rmsnorm_rows.cuh"

namespace jaxll {

// The sum of `v` over the block (every thread gets it; every thread must call),
// and whether every thread's *ok held: false in every thread's *ok otherwise
// (so the one barrier also does what block_failed does). `again`: an earlier
// call of this block may still be reading the partials (a barrier first).
__device__ __forceinline__ float block_sum_ok(float v, bool* ok, bool again) {
  __shared__ float s_part[kBlockThreads / 32];
  __shared__ int s_bad[kBlockThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const bool bad = __any_sync(0xffffffffu, !*ok);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (again) __syncthreads();
  if (lane == 0) {
    s_part[warp] = v;
    s_bad[warp] = bad ? 1 : 0;
  }
  __syncthreads();
  float t = 0.f;
  int any_bad = 0;
  const int warps = (blockDim.x + 31) / 32;
  for (int w = 0; w < warps; ++w) {  // the same order in every thread
    t += s_part[w];
    any_bad |= s_bad[w];
  }
  if (any_bad) *ok = false;
  return t;
}

// The sum of `v` over the block (every thread gets it; every thread must call).
__device__ __forceinline__ float block_sum(float v) {
  bool ok = true;
  return block_sum_ok(v, &ok, true);
}

// The partial-sum packet of block `block` for row-waves of parity `parity`.
__device__ __forceinline__ LL16* norm_partial(const RankView& v, int block, int parity) {
  return reinterpret_cast<LL16*>(v.header->norm_partials[block][parity]);
}

// Publishes this block's partial sum of squares of row-wave `tag` and returns
// the row's total: the partials of its S blocks added in segment order (the
// same bits in every block and on every rank). False in *ok when a wait gave up.
__device__ __forceinline__ float row_total(const RmsNormArgs& a, const Segment& g, float part,
                                           uint64_t tag, int parity, uint64_t epoch, bool* ok) {
  __shared__ float s_seg[kMaxBlocks];
  __shared__ int s_failed;
  const RankView& v = a.base.view;
  const uint32_t flag = static_cast<uint32_t>(tag);
  const uint64_t high = tag >> 32;
  if (threadIdx.x == 0) {
    s_failed = 0;
    ll16_store(norm_partial(v, blockIdx.x, parity), (high << 32) | __float_as_uint(part), flag);
  }
  __syncthreads();
  const int first = static_cast<int>(g.group) * a.segments;
  for (int j = threadIdx.x; j < a.segments; j += blockDim.x) {
    const LL16* slot = norm_partial(v, first + j, parity);
    LL16Value q = ll16_load(slot);
    auto ready = [&] { return ll16_ready(q, flag) && (ll16_payload(q) >> 32) == high; };
    bool got = ready();
    if (!got && *ok) {
      // (a timeout here names this rank and the block's last round: a sibling
      // block of this rank did not finish that round)
      const WaitContext ctx = wait_context(v, epoch);
      got = bounded_wait(ctx, static_cast<uint32_t>(v.rank), [&] {
        q = ll16_load(slot);
        return ready();
      });
    }
    if (!got) s_failed = 1;
    s_seg[j] = __uint_as_float(static_cast<uint32_t>(ll16_payload(q)));
  }
  __syncthreads();
  if (s_failed) *ok = false;
  float total = 0.f;
  for (int j = 0; j < a.segments; ++j) total += s_seg[j];
  __syncthreads();  // s_seg is read by every thread before the next row reuses it
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

__device__ __forceinline__ float cluster_row_total(float part, int parity, int segments,
                                                   bool* ok, bool* entered) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  __shared__ float s_total_part[2][kClusterSegments];
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
  float total = 0.f;
  int bad = 0;
  for (int j = 0; j < segments; ++j) {
    total += s_total_part[parity][j];
    bad |= s_total_bad[parity][j];
  }
  if (bad) *ok = false;
  return total;
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
    cluster_row_total(0.f, static_cast<int>(k & 1), a.segments, &ok, entered);
  }
}

// --- The one-row-wave kernels' row total over a cluster ---------------------------
// In a one-row-wave call (the decode-shape and two-shot kernels) each block of
// a clustered row makes one exchange, so it can do without the block sum's two
// barriers and the cluster barrier (whose arrive releases every earlier store
// of the thread at cluster scope; it measured 0.1-0.5 us a call slower on one
// H200). Every warp sends its partial
// sum of squares and whether it failed to every sibling with st.async into
// slot [segment][warp] of the sibling's shared memory, and each block waits
// on its own mbarrier, which completes once all S x warps slots have landed.
// Every thread then adds the same slots in the same order (per lane, then the
// warp's xor tree, which gives every lane the same bits), so every block and
// rank gets the same total.
// The mbarrier is initialised at kernel entry and made visible to the siblings
// by the entry arrive (wave_cluster_begin) and the wait before the first
// exchange; a block only waits for what lands in its own shared memory, and it
// leaves only once every sibling's stores into it have landed, so no store
// reaches a block that has left. Every block of the cluster sends exactly once
// (a block that gave up sends its failure: wave_give_up), else its siblings
// would wait forever (as on the cluster barrier it replaces).
struct WaveClusterSlots {
  alignas(8) unsigned long long bar;
  float2 slot[kClusterSegments][kBlockThreads / 32];  // (partial, failed as float bits)
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
    const uint32_t bytes = static_cast<uint32_t>(segments) * (blockDim.x / 32) * sizeof(float2);
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
__device__ __forceinline__ float wave_cluster_total(float squares, int segments, bool* ok,
                                                    bool* entered) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  WaveClusterSlots& s = wave_cluster_slots();
  float v = squares;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const float bad = __any_sync(0xffffffffu, !*ok) ? 1.f : 0.f;
  if (!*entered) {
    asm volatile("barrier.cluster.wait;" ::: "memory");  // every sibling has started
    *entered = true;
  }
  uint32_t seg;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(seg));
  const int warps = static_cast<int>(blockDim.x / 32);
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  if (lane < segments) {
    uint32_t slot, bar;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(slot)
                 : "r"(shared_address(&s.slot[seg][warp])), "r"(lane));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(bar) : "r"(shared_address(&s.bar)), "r"(lane));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];"
                 ::"r"(slot), "r"(__float_as_uint(v)), "r"(__float_as_uint(bad)), "r"(bar)
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
  float t = 0.f, b = 0.f;
  for (int e = lane; e < segments * warps; e += 32) {  // slots in [segment][warp] order
    const float2 q = s.slot[e / warps][e % warps];
    t += q.x;
    b += q.y;
  }
  for (int o = 16; o > 0; o >>= 1) {
    t += __shfl_xor_sync(0xffffffffu, t, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  if (b != 0.f) *ok = false;
  return t;
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
    wave_cluster_total(0.f, a.segments, &ok, entered);
  }
}

// The row's sum of squares in a one-row-wave call from every thread's
// `squares`: the block's sum where the row is one segment, else from the
// cluster's siblings (wave_cluster_total) or through the header's slots (tag
// tag0 + 1, row_total); *ok false in every thread of the block (of the
// cluster, clustered) if it was false in any. False when the block must give
// up before the row's exchange (not clustered only: the caller poisons its
// segment and returns).
__device__ __forceinline__ bool wave_total(const RmsNormArgs& a, const Segment& g, float squares,
                                           uint64_t tag0, uint64_t epoch, bool* ok, bool* entered,
                                           float* total) {
  if (a.clustered) {
    *total = wave_cluster_total(squares, a.segments, ok, entered);
    return true;
  }
  const float part = block_sum_ok(squares, ok, false);
  if (!*ok) return false;
  *total = a.segments == 1 ? part : row_total(a, g, part, tag0 + 1, 0, epoch, ok);
  return true;
}

}  // namespace jaxll
