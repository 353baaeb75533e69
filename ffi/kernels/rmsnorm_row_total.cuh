// How the blocks of a row agree on its sum of squares: every block, every
// rank and every cut of the call gets the same bits, the root of the row's
// tree of squares (square_tree.cuh). A block takes its passes' nodes
// (RowSquares), the tree over them (block_node), and the row's S
// blocks combine their nodes in the tree's order: through this rank's header
// as tagged LL16 packets (row_total), or, on devices that launch thread-block
// clusters (compute capability 9.0 and newer), among the blocks of a row's
// cluster through distributed shared memory (cluster_row_total for the general
// kernel; wave_cluster_total, by st.async counted on an mbarrier, for the
// one-row-wave kernels).
#pragma once

#include <cooperative_groups.h>

#include "kernels/rmsnorm_rows.cuh"
#include "kernels/square_tree.cuh"

namespace jaxll {

static_assert(kNormPartialWords == 1, "the header's partials hold a block's node (a float)");

// What a block keeps of a row's squares in shared memory: the warps' nodes of
// the last two passes and whether a warp failed there (by pass parity), and
// the pending nodes of its passes' tree, by level: pending[l] is the node of
// passes [p - 2^l, p) while bit l of the passes so far, p, is set (a binary
// counter: pass p's node is added to the pending ones of the levels where p's
// lowest bits are set, as the tree pairs them).
struct NormShared {
  float warp[2][kBlockThreads / 32];
  int bad[2][kBlockThreads / 32];
  float pending[kNormLevels];
};

__device__ __forceinline__ NormShared& norm_shared() {
  __shared__ NormShared s;
  return s;
}

__device__ __forceinline__ uint32_t node_bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ float node_of(uint32_t bits) { return __uint_as_float(bits); }

// A block's squares of one row, pass by pass. A pass: the block over units
// [first, first + len) of its segment, thread t unit first + t. Where a
// segment takes several passes, each starts at a multiple of its width, a
// power of two (the planner's rounds; 512 threads where a round takes
// several passes), so that a pass's node is a node of the row's tree.
struct RowSquares {
  float last = 0.f;  // the last pass's node (every thread)
  float run = 0.f;   // (JAXLL_NORM_FLOAT_SUM: this thread's running sum)
  int passes = 0;
  bool bad = false;  // some thread's ok was false in a pass

  // Every thread of the block calls it after each pass: `node`, the node of
  // its unit's squares (0: none), `ok` its state. One barrier: the warps'
  // nodes go to shared memory, and every warp takes the pass's node from them.
  __device__ __forceinline__ void pass(float node, int len, bool ok = true) {
    if constexpr (kFixedOrderNorm) {
      NormShared& s = norm_shared();
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
      const int warps = (blockDim.x + 31) / 32;  // (at most 16)
      const float g = warp_node(node);
      const bool b = __any_sync(0xffffffffu, !ok);
      const int buf = passes & 1;  // (pass p + 2 writes it after pass p + 1's barrier)
      if (lane == 0) {
        s.warp[buf][warp] = g;
        s.bad[buf][warp] = b ? 1 : 0;
      }
      __syncthreads();
      const int used = (len + 31) / 32;
      last = warp_node(lane < used && lane < warps ? s.warp[buf][lane] : 0.f);
      bad |= __any_sync(0xffffffffu, lane < warps && s.bad[buf][lane]);
      if (threadIdx.x == 0) {
        float v = last;
        int l = 0;
        for (int p = passes; p & 1; p >>= 1, ++l) v = tree_add(s.pending[l], v);
        s.pending[l] = v;
      }
    } else {
      run = tree_add(run, node);
      bad |= !ok;
    }
    ++passes;
  }

  // The block's node of the row (every thread gets it; every thread must
  // call); false in every thread's *ok if a pass saw a thread's ok false.
  // `reused`: the block goes on to another row, whose passes must wait until
  // every thread has read what this one left in shared memory.
  __device__ __forceinline__ float block_node(bool* ok, bool reused) {
    NormShared& s = norm_shared();
    float v;
    if constexpr (kFixedOrderNorm) {
      if (passes > 1) {
        // the root of the passes' tree, zeros padding it to a power of two:
        // the pending nodes, the smallest level's first
        __syncthreads();
        bool have = false;
        v = 0.f;
        for (int l = 0; (passes >> l) != 0; ++l) {
          if ((passes >> l) & 1) {
            v = have ? tree_add(s.pending[l], v) : s.pending[l];
            have = true;
          }
        }
      } else {
        v = last;  // (one pass: its barrier made every warp's node visible)
      }
    } else {
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
      const int warps = (blockDim.x + 31) / 32;
      const float w = warp_node(run);
      const bool b = __any_sync(0xffffffffu, bad);
      if (lane == 0) {
        s.warp[0][warp] = w;
        s.bad[0][warp] = b ? 1 : 0;
      }
      __syncthreads();
      bad = __any_sync(0xffffffffu, lane < warps && s.bad[0][lane]);
      v = warp_node(lane < warps ? s.warp[0][lane] : 0.f);
    }
    if (bad) *ok = false;
    if (reused) __syncthreads();
    return v;
  }
};

// Packet of block `block`'s node for row-waves of parity `parity`.
__device__ __forceinline__ LL16* norm_partial(const RankView& v, int block, int parity) {
  return reinterpret_cast<LL16*>(v.header->norm_partials[block][parity][0]);
}

// Publishes this block's node of row-wave `tag` and returns the row's root
// over its S blocks (the same bits in every block and on every rank). Warp 0
// reads the S nodes (lane l those of segments l, or 2l and 2l + 1 past 32
// segments) and takes their tree; the block takes the root from it. False in
// *ok when a wait gave up.
__device__ __forceinline__ float row_total(const RmsNormArgs& a, const Segment& g, float part,
                                           uint64_t tag, int parity, uint64_t epoch, bool* ok) {
  __shared__ float s_total;
  __shared__ int s_failed;
  const RankView& v = a.base.view;
  const uint32_t flag = static_cast<uint32_t>(tag);
  const uint64_t high = tag >> 32;
  if (threadIdx.x == 0) {
    ll16_store(norm_partial(v, blockIdx.x, parity), (high << 32) | node_bits(part), flag);
  }
  if (threadIdx.x < 32) {
    const int first = static_cast<int>(g.group) * a.segments;
    const int per = a.segments > 32 ? 2 : 1;  // (segments <= kMaxBlocks = 64)
    float t = 0.f;
    bool failed = false;
    for (int q = 0; q < per; ++q) {
      const int j = static_cast<int>(threadIdx.x) * per + q;
      if (j >= a.segments) break;
      const LL16* slot = norm_partial(v, first + j, parity);
      LL16Value p = ll16_load(slot);
      auto ready = [&] { return ll16_ready(p, flag) && (ll16_payload(p) >> 32) == high; };
      bool got = ready();
      if (!got && *ok && !failed) {
        // (a timeout here names this rank and the block's last round: a
        // sibling block of this rank did not finish that round)
        const WaitContext ctx = wait_context(v, epoch);
        got = bounded_wait(ctx, static_cast<uint32_t>(v.rank), [&] {
          p = ll16_load(slot);
          return ready();
        });
      }
      failed |= !got;
      const float node = node_of(static_cast<uint32_t>(ll16_payload(p)));
      t = q == 0 ? node : tree_add(t, node);
    }
    t = warp_node(t);
    failed = __any_sync(0xffffffffu, failed);
    if (threadIdx.x == 0) {
      s_total = t;
      s_failed = failed ? 1 : 0;
    }
  }
  __syncthreads();
  if (s_failed) *ok = false;
  const float total = s_total;
  __syncthreads();  // s_total is read by every thread before the next row reuses it
  return total;
}

// The row's total when its S blocks are one cluster: every block writes its
// partial (and whether it failed) into slot [parity][segment] of each sibling's
// shared memory, and the cluster barrier (release/acquire at cluster scope)
// makes all S visible; every block then takes their tree (segment order). Every
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

__device__ __forceinline__ float cluster_row_total(float part, int parity, int segments, bool* ok,
                                                   bool* entered) {
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
  const int lane = threadIdx.x % 32;  // (segments <= kClusterSegments <= 32)
  if (__any_sync(0xffffffffu, lane < segments && s_total_bad[parity][lane])) *ok = false;
  return warp_node(lane < segments ? s_total_part[parity][lane] : 0.f);
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
// a clustered row makes one exchange, so it can do without the cluster
// barrier (whose arrive releases every earlier store of the thread at cluster
// scope; it measured 0.1-0.5 us a call slower on one H200). Each block takes
// its node (RowSquares::block_node), then sends it and whether it failed to
// every sibling with st.async into slot [segment] of the sibling's shared
// memory, and each block waits on its own mbarrier, which completes once all
// S slots have landed; every warp then takes their tree (every block and rank
// gets the same root).
// The mbarrier is initialised at kernel entry and made visible to the siblings
// by the entry arrive (wave_cluster_begin) and the wait before the first
// exchange; a block only waits for what lands in its own shared memory, and it
// leaves only once every sibling's stores into it have landed, so no store
// reaches a block that has left. Every block of the cluster sends exactly once
// (a block that gave up sends its failure: wave_give_up), else its siblings
// would wait forever (as on the cluster barrier it replaces).
// (a slot: the block's node's bits, then 1 if it failed)
struct alignas(8) WaveClusterSlot {
  uint32_t w[2];
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

// The row's root from the blocks' squares `sq` over the S blocks of the
// cluster; false in every thread's *ok of every block if any thread's *ok (or
// ok in a pass) was false. Every thread of every block of the cluster calls it
// once.
__device__ __forceinline__ float wave_cluster_total(RowSquares& sq, int segments, bool* ok,
                                                    bool* entered) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(sizeof(WaveClusterSlot) == 8, "one 8-byte store a slot");
  WaveClusterSlots& s = wave_cluster_slots();
  const float v = sq.block_node(ok, false);
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
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];"
                 ::"r"(slot), "r"(node_bits(v)), "r"(bad), "r"(bar)
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
  // (segments <= kClusterSegments <= 32: lane l holds slot l)
  const bool mine = lane < segments;
  if (__any_sync(0xffffffffu, mine && s.slot[lane].w[1] != 0)) *ok = false;
  return warp_node(mine ? node_of(s.slot[lane].w[0]) : 0.f);
#else
  __trap();  // the host launches clusters only where the device has them
  return 0.f;
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
    RowSquares none;
    wave_cluster_total(none, a.segments, &ok, entered);
  }
}

// The row's sum of squares in a one-row-wave call from the block's squares
// `sq`: the block's node where the row is one segment, else from the
// cluster's siblings (wave_cluster_total) or through the header's slots (tag
// tag0 + 1, row_total); *ok false in every thread of the block (of the
// cluster, clustered) if it was false in any. False when the block must give
// up before the row's exchange (not clustered only: the caller poisons its
// segment and returns).
__device__ __forceinline__ bool wave_total(const RmsNormArgs& a, const Segment& g, RowSquares& sq,
                                           uint64_t tag0, uint64_t epoch, bool* ok, bool* entered,
                                           float* total) {
  if (a.clustered) {
    *total = wave_cluster_total(sq, a.segments, ok, entered);
    return true;
  }
  const float part = sq.block_node(ok, false);
  if (!*ok) return false;
  *total = a.segments == 1 ? part : row_total(a, g, part, tag0 + 1, 0, epoch, ok);
  return true;
}


}  // namespace jaxll
