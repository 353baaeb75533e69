// All-reduce + residual add + RMSNorm in one kernel: one-shot on LL16 (any cut)
// or on the sentinel exchange, or two-shot (the decode-shape cuts; below).
//
// Rows (tokens) are cut into S segments of about 128 LL16 units, and each block
// owns one segment of one row per row-wave: block b takes segment b % S of rows
// b / S, b / S + W, ... (W = gridDim.x / S rows at once), so a decode step's
// few rows spread over as many SMs as the one-shot all-reduce would use. A
// segment goes in chunks of at most one LL16 region (one round, one epoch each):
// every rank pushes its chunk of x to every peer, reduces the N chunks in rank
// order (bitwise the result jaxll.all_reduce gives), adds the residual in
// float32 and rounds once (new_residual), and accumulates the squares of the
// rounded values. The S blocks of a row then combine their partial sums of
// squares, added in one fixed order so that every block and every rank gets the
// same sum: on devices that launch thread-block clusters (compute capability
// 9.0 and newer) the S blocks of a row form one cluster (S <= 8) and trade
// their partials through distributed shared memory (rmsnorm_kernel: block
// sums in segment order, the cluster barrier; the one-row-wave kernels: every
// warp's sum by st.async, counted by an mbarrier, see wave_cluster_total);
// elsewhere (or where the GPU cannot hold every rank's clusters at once)
// through this rank's header, as LL16 packets tagged with a per-call tag. Each
// block then writes normed = round(new_residual * rsqrt(mean + eps)) * weight
// for its own segment. Scratch alternates by epoch parity, as in the one-shot all-reduce
// (all_reduce_common.cuh); call signatures are checked the same way (jaxll/round.cuh,
// collective Collective::kRmsNorm). All blocks of the grid are co-resident (the grid bound), so a block
// waiting for its row's partial sums always ends.
//
// Where the grid of a block per 128 units would not launch early (more than half
// the rank's grid bound, see plan_cut) and one row-wave holds every row, fewer,
// longer segments are taken if that grid launches early.
//
// Three kernels do this: rmsnorm_kernel, for any cut, and rmsnorm_lean_kernel,
// for the cuts where every block holds one segment of one row that one round
// moves with at most one unit per thread (lean_plan(): the decode shapes), the
// same steps without the loops over rows and chunks (see its comment). The
// decode-shape kernel also runs on the sentinel exchange (16-byte units, half
// LL16's bytes), cut in 16-byte units. rmsnorm_twoshot_kernel takes the same
// kind of cut (one row-wave, up to 2 units a thread) with the segment's
// exchange in two shots (reduce-scatter, all-gather of the sums: about
// 2(N-1)/N of the bytes instead of N-1 times them). plan_all_reduce_rmsnorm's
// protocol (RmsNormProtocol in all_reduce.h) chooses.
#include <algorithm>

#include <cooperative_groups.h>
#ifdef JAXLL_FUSED_PHASES
#include <cstdio>
#include <cstdlib>
#endif

#include "all_reduce_common.cuh"
#include "all_reduce_kernels.h"

namespace jaxll {
namespace {

#ifdef JAXLL_FUSED_PHASES
// Timing instrumentation, compiled only into the standalone harness
// (tests/gpu_scripts/fused_rmsnorm_harness.cu, mode "phases"): thread 0 of
// every block stamps the global timer at kFusedPhases points of the latest
// call, per rank. Never built into the library.
}  // namespace
constexpr int kFusedPhases = 6;
__device__ unsigned long long g_fused_phases[kMaxRanks][kMaxBlocks][kFusedPhases];
// Copies the stamps to the host: [rank][block][phase], kMaxRanks x kMaxBlocks x 6.
cudaError_t read_fused_phases(unsigned long long* out) {
  return cudaMemcpyFromSymbol(out, g_fused_phases, sizeof(g_fused_phases));
}
namespace {
#define JAXLL_PHASE(i)                                                              \
  do {                                                                              \
    if (threadIdx.x == 0) {                                                         \
      unsigned long long t_;                                                        \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                        \
      g_fused_phases[a.base.view.rank][blockIdx.x][i] = t_;                        \
    }                                                                               \
  } while (0)
#else
#define JAXLL_PHASE(i) \
  do {                 \
  } while (0)
#endif

// Units a block's segment aims at (the one-shot all-reduce's block size).
constexpr int64_t kSegmentUnits = 128;
// Most blocks of a row in a cluster (the portable cluster size).
constexpr int kClusterSegments = 8;

struct RmsNormArgs {
  AllReduceArgs base;  // view, signature and trigger (the other fields unused)
  const void* x;
  const void* residual;
  const void* weight;
  void* normed;
  void* new_residual;
  int64_t tokens;
  int64_t hidden;
  int64_t row_units;    // units of a row (the protocol's: 8 bytes for LL16, 16 for sentinel)
  int64_t seg_span;     // units of a row one block owns (a row's last segment may have fewer)
  int64_t chunk_units;  // most units of a segment one round moves
  int segments;         // S: blocks per row
  int waves;            // row-waves of the call: ceil(tokens / (gridDim.x / S))
  int clustered;        // 1: the S blocks of a row are one thread-block cluster
  float eps;
#ifdef JAXLL_FUSED_PHASES
  int skip;  // (phases builds only) JAXLL_FUSED_SKIP, see JAXLL_SKIP
#endif
};
static_assert(sizeof(GroupArgs<RmsNormArgs>) <= kMaxKernelParamBytes,
              "a virtual group's fused-call arguments exceed a kernel's parameter space");

// (phases builds of the test harness only) JAXLL_FUSED_SKIP=bits leaves parts
// of the two-shot kernel (and bit 2 of the decode-shape kernel too) out, to
// time what each costs in back-to-back calls (harness mode "graph"; the
// results are then wrong): 2 the norm (the kernel ends after new_residual), 4
// the all-gather's waits, 8 the reduce-scatter's waits, 16 the stores of
// normed and new_residual.

#ifdef JAXLL_FUSED_PHASES
#define JAXLL_SKIP(bit) ((a.skip & (bit)) != 0)
#else
#define JAXLL_SKIP(bit) false
#endif

// This block's units [u0, u1) of every row it holds.
struct Segment {
  int64_t u0, u1;
  int64_t group;  // first row (rows group, group + W, ...)
  int64_t rows;   // how many rows it holds
};

__device__ __forceinline__ Segment segment_of(const RmsNormArgs& a) {
  Segment g;
  const int64_t seg = blockIdx.x % a.segments;
  const int64_t rows_at_once = gridDim.x / a.segments;
  g.group = blockIdx.x / a.segments;
  g.u0 = seg * a.seg_span;
  g.u1 = min(a.row_units, g.u0 + a.seg_span);
  g.rows = a.tokens > g.group ? (a.tokens - g.group + rows_at_once - 1) / rows_at_once : 0;
  return g;
}

// Whether all five of the call's arrays are aligned to `w` bytes (the units'
// vector loads and stores; else element by element).
__device__ __forceinline__ bool arrays_aligned(const RmsNormArgs& a, int w) {
  return ((reinterpret_cast<uintptr_t>(a.x) | reinterpret_cast<uintptr_t>(a.residual) |
           reinterpret_cast<uintptr_t>(a.weight) | reinterpret_cast<uintptr_t>(a.new_residual) |
           reinterpret_cast<uintptr_t>(a.normed)) % w) == 0;
}

// The block's part of a call of one row-wave (rmsnorm_lean_kernel,
// rmsnorm_twoshot_kernel): segment `seg` of row `row`, the row's units
// [u0, u0 + len); `slots`: the row's blocks add their partial sums through the
// header's slots, starting from tag `tag0` (read here, before any of this
// call's packets); `g` the same as rmsnorm_kernel's Segment, for the failure
// paths they share.
struct WaveBlock {
  int seg, row, u0, len;
  bool slots;
  uint64_t tag0;
  Segment g;
};

__device__ __forceinline__ WaveBlock wave_block(const RmsNormArgs& a, const RankView& v) {
  WaveBlock b;
  b.seg = static_cast<int>(blockIdx.x) % a.segments;
  b.row = static_cast<int>(blockIdx.x) / a.segments;
  const int span = static_cast<int>(a.seg_span);
  b.u0 = b.seg * span;
  b.len = min(static_cast<int>(a.row_units) - b.u0, span);
  b.slots = a.segments > 1 && !a.clustered;
  b.tag0 = b.slots ? *reinterpret_cast<volatile uint64_t*>(&v.header->norm_tag) : 0;
  b.g.u0 = b.u0;
  b.g.u1 = b.u0 + b.len;
  b.g.group = b.row;
  b.g.rows = 1;
  return b;
}

// The last block of the call moves the tag past this call's `waves`
// row-waves, so that the next call's packets never match a stale one (only
// calls that used the header's slots: the others leave both the slots and the
// tag as they were). Thread 0 of every block calls it after its last packet.
__device__ __forceinline__ void end_slot_waves(const RankView& v, bool slots, uint64_t tag0,
                                               uint64_t waves) {
  if (slots && threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&v.header->norm_done, 1ull) == gridDim.x - 1) {
      v.header->norm_done = 0;
      v.header->norm_tag = tag0 + waves;
    }
  }
}

// (W: the bytes of the units g counts in)
template <class T, int W = 8>
__device__ __forceinline__ void poison_segments(const RmsNormArgs& a, const Segment& g) {
  T* nr = static_cast<T*>(a.new_residual);
  T* no = static_cast<T*>(a.normed);
  const int64_t rows_at_once = gridDim.x / a.segments;
  for (int64_t k = 0; k < g.rows; ++k) {
    const int64_t row = g.group + k * rows_at_once;
    for (int64_t u = g.u0 + threadIdx.x; u < g.u1; u += blockDim.x) {
      store_unit<T, W>(nr + row * a.hidden, u, a.hidden, false, poison_unit<W>());
      store_unit<T, W>(no + row * a.hidden, u, a.hidden, false, poison_unit<W>());
    }
  }
}

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

// --- The one-row-wave kernels' row total over a cluster -------------------------
// In a one-row-wave call (rmsnorm_lean_kernel, rmsnorm_twoshot_kernel) each
// block of a clustered row makes one exchange, so it can do without the block
// sum's two barriers and the cluster barrier (whose arrive releases every
// earlier store of the thread at cluster scope): 0.1-0.5 us a call less on
// one H200 (session 16, benchmarks/README.md). Every warp sends its partial
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

// new_residual's unit: the reduced sum plus the residual, added in float32
// and rounded once; the squares of the rounded values go into *squares.
template <class T, int W = 8>
__device__ __forceinline__ Unit<W> residual_add(const Unit<W>& sum, const Unit<W>& rv,
                                                float* squares) {
  using Tr = ElemTraits<T>;
  constexpr int E = W / static_cast<int>(sizeof(T));
  T s[E], q[E], o[E];
  memcpy(s, sum.p, W);
  memcpy(q, rv.p, W);
#pragma unroll
  for (int e = 0; e < E; ++e) {
    o[e] = Tr::from_acc(Tr::to_acc(s[e]) + Tr::to_acc(q[e]));
    const float h = Tr::to_acc(o[e]);
    *squares += h * h;
  }
  Unit<W> out;
  memcpy(out.p, o, W);
  return out;
}

// normed's unit: new_residual times the inverse root mean square, rounded,
// times the weight (in the element type).
template <class T, int W = 8>
__device__ __forceinline__ Unit<W> norm_unit(const Unit<W>& hv, const Unit<W>& wv, float inv) {
  using Tr = ElemTraits<T>;
  constexpr int E = W / static_cast<int>(sizeof(T));
  T h[E], wt[E], o[E];
  memcpy(h, hv.p, W);
  memcpy(wt, wv.p, W);
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const T scaled = Tr::from_acc(Tr::to_acc(h[e]) * inv);
    o[e] = Tr::from_acc(Tr::to_acc(scaled) * Tr::to_acc(wt[e]));
  }
  Unit<W> out;
  memcpy(out.p, o, W);
  return out;
}

template <class T>
__device__ __forceinline__ void rmsnorm_body(const RmsNormArgs& a) {
  const RankView& v = a.base.view;
  const int n = v.nranks;
  const T* x = static_cast<const T*>(a.x);
  const T* res = static_cast<const T*>(a.residual);
  const T* w = static_cast<const T*>(a.weight);
  T* nres = static_cast<T*>(a.new_residual);
  T* normed = static_cast<T*>(a.normed);
  const bool vec = arrays_aligned(a, 8);
  bool entered = false;  // (clustered: this thread has waited out the entry barrier)
  if (a.clustered) cluster_entry_arrive();
  collective_prologue(a.base);
  JAXLL_PHASE(0);

  const Segment g = segment_of(a);
  const int64_t rows_at_once = gridDim.x / a.segments;
  const int64_t chunks = (g.u1 - g.u0 + a.chunk_units - 1) / a.chunk_units;
  // Partial sums go through the header's slots (tagged) only for rows split
  // over blocks that are not one cluster.
  const bool slots = a.segments > 1 && !a.clustered;
  // The tag of this call's row-waves: the last call's last block advanced it
  // (and the kernel boundary made that visible to every block of this call).
  // Loaded before block_begin's loads so that the two latencies overlap.
  const uint64_t tag0 = slots ? *reinterpret_cast<volatile uint64_t*>(&v.header->norm_tag) : 0;
  const BlockStart bs = block_begin(v, static_cast<uint32_t>(g.rows * chunks));
  JAXLL_PHASE(1);
  if (bs.had_error) {
    poison_segments<T>(a, g);
    if (a.clustered) cluster_drain(a, g, 0, &entered);
    return;
  }
  // A segment that one round moves with one unit per thread keeps its unit of
  // new_residual and of the weight in registers for the norm (the weight is
  // loaded before the wait for the peers, so its latency hides behind theirs).
  const bool single = chunks == 1 && g.u1 - g.u0 <= static_cast<int64_t>(blockDim.x);
  Unit<8> kept_new{}, kept_w{};
  const int sig_lane = !v.signatures || n == 1 ? 0 : signature_lane(n);
  send_signature(a.base, sig_lane, n, bs);
  bool ok = signature_ok(a.base, sig_lane, n, bs);
  uint32_t round = 0;
  for (int64_t k = 0; k < g.rows; ++k) {
    const int64_t row = g.group + k * rows_at_once;
    const T* xr = x + row * a.hidden;
    const T* rr = res + row * a.hidden;
    T* nr = nres + row * a.hidden;
    float squares = 0.f;
    for (int64_t c = 0; c < chunks; ++c, ++round) {
      const uint64_t epoch = bs.epoch + round;
      const int parity = static_cast<int>(epoch & 1);
      const Channel<Proto::kLL, T> ch(v, 0, static_cast<int>(blockIdx.x), parity, epoch);
      ll_round_begin(v, epoch, parity);
      const int64_t c0 = g.u0 + c * a.chunk_units;
      const int len = static_cast<int>(min(g.u1 - c0, a.chunk_units));
      for (int i = threadIdx.x; i < len; i += blockDim.x)
        send_to_peers<0>(ch, n, i, load_unit<T, 8>(xr, c0 + i, a.hidden, vec));
      for (int i = threadIdx.x; i < len; i += blockDim.x) {
        const Unit<8> own = load_unit<T, 8>(xr, c0 + i, a.hidden, vec);
        // (the residual is loaded before the wait for the peers, so its
        // latency hides behind theirs)
        const Unit<8> rv = load_unit<T, 8>(rr, c0 + i, a.hidden, vec);
        if (single) kept_w = load_unit<T, 8>(w, c0 + i, a.hidden, vec);
        Unit<8> sum;
        if (ok) ok = reduce_slot<0, Proto::kLL, T, SumOp, 8>(ch, n, i, own, &sum);
        Unit<8> out = poison_unit<8>();
        if (ok) out = residual_add<T>(sum, rv, &squares);
        if (single) kept_new = out;
        store_unit<T, 8>(nr, c0 + i, a.hidden, vec, out);
      }
      // Between rounds the boundary orders this round's receives before the
      // next round's sends; after the call's last round the block only has to
      // agree on `ok` (and __syncthreads orders this block's new_residual
      // stores before the norm pass reads them): no system-scope fence.
      const bool last_round = k + 1 == g.rows && c + 1 == chunks;
      if (last_round ? block_failed(ok) : round_boundary(ok)) {
        poison_segments<T>(a, g);
        if (a.clustered) cluster_drain(a, g, k, &entered);
        return;
      }
    }
    // The row's sum of squares from its S blocks, then the norm of this
    // block's segment: new_residual (this block wrote it) times the inverse
    // root mean square, rounded, times the weight.
    JAXLL_PHASE(2);  // (the last row's: its all-reduce and residual add are done)
    const float part = block_sum(squares);
    const float total =
        a.segments == 1 ? part
        : a.clustered   ? cluster_row_total(part, static_cast<int>(k & 1), a.segments, &ok, &entered)
                        : row_total(a, g, part, tag0 + static_cast<uint64_t>(k) + 1,
                                    static_cast<int>(k & 1), bs.epoch + round - 1, &ok);
    const float inv = rsqrtf(total / static_cast<float>(a.hidden) + a.eps);
    JAXLL_PHASE(3);  // the row's sum of squares is known
    T* no = normed + row * a.hidden;
    for (int64_t u = g.u0 + threadIdx.x; u < g.u1; u += blockDim.x) {
      const Unit<8> hv = single ? kept_new : load_unit<T, 8>(nr, u, a.hidden, vec);
      const Unit<8> wv = single ? kept_w : load_unit<T, 8>(w, u, a.hidden, vec);
      const Unit<8> out = norm_unit<T>(hv, wv, inv);
      store_unit<T, 8>(no, u, a.hidden, vec, ok ? out : poison_unit<8>());
    }
  }
  JAXLL_PHASE(4);  // the norm is written
  end_slot_waves(v, slots, tag0, static_cast<uint64_t>(a.waves));
  if (block_failed(ok)) poison_segments<T>(a, g);
  JAXLL_PHASE(5);
}

template <class T>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) rmsnorm_kernel(RmsNormArgs a) {
  rmsnorm_body<T>(a);
}

// Every rank of a virtual group in one launch (GroupArgs, all_reduce_common.cuh).
template <class T>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    rmsnorm_group_kernel(const __grid_constant__ GroupArgs<RmsNormArgs> g) {
  rmsnorm_body<T>(g.rank[blockIdx.y]);
}

// The decode shape's kernel: every block holds one segment of one row that
// one round moves with at most one unit per thread (one row-wave, one chunk:
// lean_plan()), the rest as rmsnorm_kernel does it, with the same
// exchanges, epochs, tags and failure handling, but none of its loops over
// rows and chunks, 32-bit index math, and the loops over peers unrolled for
// groups of 2, 4 and 8 (NR; 0: any n). Decode calls are latency-bound by the
// kernel's instruction path (ncu, 16 x 8192 on one rank: the general kernel
// executed about 980 instructions a warp, with register spills, where the
// one-shot all-reduce executes about 120).
//
// P is the exchange's protocol: LL16 (8-byte units, each with its flag), or
// sentinel (16-byte units stored straight into sentinel-filled scratch and
// reset after reading, as the one-shot sentinel all-reduce does: half the
// bytes of LL16 for the same data; a row's bytes must be a multiple of 16).
// The sentinel reset needs no fence here: the call has one round, and the
// kernel boundary orders the resets before this rank's next call's sends.
template <class T, int NR, Proto P>
__device__ __forceinline__ void rmsnorm_lean_body(const RmsNormArgs& a) {
  constexpr int W = unit_bytes<P>();
  const RankView& v = a.base.view;
  const int n = NR > 0 ? NR : v.nranks;
  const bool vec = arrays_aligned(a, W);
  bool entered = false;
  if (a.clustered) wave_cluster_begin(a.segments);
  collective_prologue(a.base);
  JAXLL_PHASE(0);
  const WaveBlock wb = wave_block(a, v);
  const int row = wb.row, u0 = wb.u0, len = wb.len;
  const bool slots = wb.slots;
  const uint64_t tag0 = wb.tag0;
  Segment g = wb.g;
  if (row >= a.tokens) __trap();  // (a lean plan has one row-wave: every block has its row)
  // This thread's unit of x, the residual and the weight, loaded before the
  // epochs so that the latencies overlap.
  const int i = static_cast<int>(threadIdx.x);
  const bool mine = i < len;
  const size_t at = static_cast<size_t>(row) * static_cast<size_t>(a.row_units) + u0 + i;
  const int64_t count = a.tokens * a.hidden;
  Unit<W> xv{}, rv{}, wv{};
  if (mine) {
    xv = load_unit<T, W>(static_cast<const T*>(a.x), at, count, vec);
    rv = load_unit<T, W>(static_cast<const T*>(a.residual), at, count, vec);
    wv = load_unit<T, W>(static_cast<const T*>(a.weight), u0 + i, a.hidden, vec);
  }
  const BlockStart bs = block_begin(v, 1u);
  JAXLL_PHASE(1);
  if (bs.had_error) {
    wave_give_up<T, W>(a, g, &entered);
    return;
  }
  const int sig_lane = !v.signatures || n == 1 ? 0 : signature_lane(n);
  send_signature(a.base, sig_lane, n, bs);
  const uint64_t epoch = bs.epoch;
  const int parity = static_cast<int>(epoch & 1);
  const Channel<P, T> ch(v, 0, static_cast<int>(blockIdx.x), parity, epoch);
  if constexpr (P == Proto::kLL) {
    ll_round_begin(v, epoch, parity);
  }
  // (sentinel: the value every rank adds is the one sent, canonicalized)
  if (mine) xv = ch.prepare(xv);
  if (mine) send_to_peers<NR>(ch, n, i, xv);
  // The signature lanes (the block's last n - 1 threads, which carry data here:
  // no spare warp) check the peers' signatures after their sends, so that
  // their data is not held back a cross-rank round trip; data sent on a call
  // whose signatures disagree only lands in scratch regions of this call's
  // shape, and the recorded mismatch keeps the workspace unusable until a
  // reset refills them (as in the all-reduce kernels, whose data threads never
  // wait for the check).
  bool ok = signature_ok(a.base, sig_lane, n, bs);
  float squares = 0.f;
  Unit<W> hv = poison_unit<W>();
  if (mine) {
    Unit<W> sum;
    if (ok) ok = reduce_slot<NR, P, T, SumOp, W>(ch, n, i, xv, &sum);
    if (ok) hv = residual_add<T, W>(sum, rv, &squares);
    store_unit<T, W>(static_cast<T*>(a.new_residual), at, count, vec, hv);
  }
  // (the call's only round: no fence, and no barrier to end it)
  JAXLL_PHASE(2);
  if (JAXLL_SKIP(2)) {  // (timing only: no norm)
    end_slot_waves(v, slots, tag0, 1);
    return;
  }
  float total;
  if (!wave_total(a, g, squares, tag0, epoch, &ok, &entered, &total)) {
    poison_segments<T, W>(a, g);
    return;
  }
  const float inv = rsqrtf(total / static_cast<float>(a.hidden) + a.eps);
  JAXLL_PHASE(3);
  if (mine) {
    const Unit<W> out = norm_unit<T, W>(hv, wv, inv);
    store_unit<T, W>(static_cast<T*>(a.normed), at, count, vec, ok ? out : poison_unit<W>());
  }
  JAXLL_PHASE(4);
  end_slot_waves(v, slots, tag0, 1);
  if (block_failed(ok)) poison_segments<T, W>(a, g);
  JAXLL_PHASE(5);
}

template <class T, int NR, Proto P>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) rmsnorm_lean_kernel(RmsNormArgs a) {
  rmsnorm_lean_body<T, NR, P>(a);
}

// Every rank of a virtual group in one launch (GroupArgs, all_reduce_common.cuh).
template <class T, int NR, Proto P>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    rmsnorm_lean_group_kernel(const __grid_constant__ GroupArgs<RmsNormArgs> g) {
  rmsnorm_lean_body<T, NR, P>(g.rank[blockIdx.y]);
}

// The signature lane (peer offset k, 0: none) of this thread in the two-shot
// kernel: the block's spare threads past the padded segment where it has n - 1
// of them (signature_lane), else the n - 1 threads from the next rank's chunk
// on, which only receive there. A lane waits for its peer's signature before
// its next step, and on a thread that reduces this rank's chunk that wait held
// back a sum every peer awaits (N=8 on one H200, 16 rows of 8192 bf16: 13.3 us
// a call with the block's last threads as lanes, 10.7 us with these).
__device__ __forceinline__ int twoshot_signature_lane(int rank, int n, int c, int padded) {
  const int threads = static_cast<int>(blockDim.x);
  if (padded + n - 1 <= threads) return signature_lane(n);
  const int first = ((rank + 1) % n) * c % threads;
  const int k = (static_cast<int>(threadIdx.x) - first + threads) % threads + 1;
  return k < n ? k : 0;
}

// The two-shot fused kernel: rmsnorm_lean_kernel's cut (one row-wave, a
// block per segment of a row, the row's blocks combined as there), with the
// segment's exchange done in two shots, as the two-shot all-reduce does with a
// round. The segment's len units are cut into N chunks of c = ceil(len / N)
// (the last padded with zeros, so every rank sends every peer something in
// both phases); rank j owns chunk j. Every rank stores chunk j of its x into
// rank j's phase-0 scratch; rank j reduces the N contributions in rank order
// (the same bits the one-shot kernels get) and stores the sum into every
// peer's phase-1 scratch; every rank then holds the whole segment's sum and
// adds its own residual (so new_residual is what the one-shot kernel gives,
// even where residuals differ across ranks). The bytes a rank moves are about
// 2(N-1)/N of the segment's instead of N-1 times it, which is what wins at
// N = 8 on one GPU's memory. A thread holds units i, i + blockDim.x, ... of
// the padded segment (K of them: 1, or kRmsNormTwoShotUnits for segments of
// more units than threads; K = 1 has no register spills on sm_90). Every
// thread does all its reductions before any of its receives: a receive waits
// for an owner's reduction, a reduction only for the sends that precede every
// wait, so no wait cycles.
// One round per call: the sentinel resets need no fence (as in the lean kernel).
template <class T, int NR, Proto P, int K>
__device__ __forceinline__ void rmsnorm_twoshot_body(const RmsNormArgs& a) {
  constexpr int W = unit_bytes<P>();
  const RankView& v = a.base.view;
  const int n = NR > 0 ? NR : v.nranks;
  const int rank = v.rank;
  const bool vec = arrays_aligned(a, W);
  bool entered = false;
  if (a.clustered) wave_cluster_begin(a.segments);
  collective_prologue(a.base);
  JAXLL_PHASE(0);
  const WaveBlock wb = wave_block(a, v);
  const int row = wb.row, u0 = wb.u0, len = wb.len;
  const bool slots = wb.slots;
  const uint64_t tag0 = wb.tag0;
  Segment g = wb.g;
  const int c = (len + n - 1) / n;  // units per chunk (the last chunks padded)
  const int padded = n * c;
  if (row >= a.tokens || padded > K * static_cast<int>(blockDim.x)) __trap();  // (plan and launch disagree)
  const size_t at = static_cast<size_t>(row) * static_cast<size_t>(a.row_units) + u0;
  const int64_t count = a.tokens * a.hidden;
  // x and the residual are loaded before the epochs, so that the latencies
  // overlap; the weight after the exchange (registers: a thread holds two units).
  Unit<W> xv[K], rv[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    xv[k] = rv[k] = Unit<W>{};
    if (u < len) {
      xv[k] = load_unit<T, W>(static_cast<const T*>(a.x), at + u, count, vec);
      rv[k] = load_unit<T, W>(static_cast<const T*>(a.residual), at + u, count, vec);
    }
  }
  const BlockStart bs = block_begin(v, 1u);
  JAXLL_PHASE(1);
  if (bs.had_error) {
    wave_give_up<T, W>(a, g, &entered);
    return;
  }
  const int sig_lane = !v.signatures || n == 1 ? 0 : twoshot_signature_lane(rank, n, c, padded);
  send_signature(a.base, sig_lane, n, bs);
  const uint64_t epoch = bs.epoch;
  const int parity = static_cast<int>(epoch & 1);
  const Channel<P, T> rs(v, 0, static_cast<int>(blockIdx.x), parity, epoch);
  const Channel<P, T> ag(v, 1, static_cast<int>(blockIdx.x), parity, epoch);
  if constexpr (P == Proto::kLL) {
    ll_round_begin(v, epoch, parity);
  }
  // Reduce-scatter: unit u goes to its owner's slot u - owner * c.
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    xv[k] = rs.prepare(xv[k]);  // (sentinel: the value every rank adds is the one sent)
    const int owner = u / c;
    if (u < padded && owner != rank) rs.send(owner, u - owner * c, xv[k]);
  }
  // (the signature lanes check after their sends, as in rmsnorm_lean_kernel)
  bool ok = signature_ok(a.base, sig_lane, n, bs);
  // This rank's chunk: reduce in rank order, send the sum to every peer.
  Unit<W> hv[K];  // the sums, then new_residual
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    if (u < padded && u / c == rank && ok) {
      if (JAXLL_SKIP(8)) {
        hv[k] = xv[k];
      } else {
        ok = reduce_slot<NR, P, T, SumOp, W>(rs, n, u - rank * c, xv[k], &hv[k]);
      }
      if (ok) {
        hv[k] = ag.prepare(hv[k]);
        send_to_peers<NR>(ag, n, u - rank * c, hv[k]);
      }
    }
  }
  // The other chunks' sums from their owners.
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    const int owner = u / c;
    if (JAXLL_SKIP(4)) {
      if (owner != rank) hv[k] = xv[k];
    } else if (u < padded && owner != rank && ok) {
      ok = channel_recv<P, T, W>(ag, owner, u - owner * c, &hv[k]);
    }
  }
  JAXLL_PHASE(2);
  // The residual, added in unit order (so the squares add up in the same order
  // on every rank, whichever units it owned).
  Unit<W> wv[K];
  float squares = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    wv[k] = u < len ? load_unit<T, W>(static_cast<const T*>(a.weight), u0 + u, a.hidden, vec) : Unit<W>{};
    if (u < len) {
      hv[k] = ok ? residual_add<T, W>(hv[k], rv[k], &squares) : poison_unit<W>();
      if (!JAXLL_SKIP(16)) store_unit<T, W>(static_cast<T*>(a.new_residual), at + u, count, vec, hv[k]);
    }
  }
  if (JAXLL_SKIP(2)) {  // (timing only: no norm)
    if (a.clustered) asm volatile("barrier.cluster.wait;" ::: "memory");
    block_failed(ok);
    JAXLL_PHASE(3);
    JAXLL_PHASE(4);
    JAXLL_PHASE(5);
    return;
  }
  // (the call's only round: no fence)
  float total;
  if (!wave_total(a, g, squares, tag0, epoch, &ok, &entered, &total)) {
    poison_segments<T, W>(a, g);
    return;
  }
  const float inv = rsqrtf(total / static_cast<float>(a.hidden) + a.eps);
  JAXLL_PHASE(3);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    if (u < len) {
      const Unit<W> out = norm_unit<T, W>(hv[k], wv[k], inv);
      if (!JAXLL_SKIP(16)) store_unit<T, W>(static_cast<T*>(a.normed), at + u, count, vec, ok ? out : poison_unit<W>());
    }
  }
  JAXLL_PHASE(4);
  end_slot_waves(v, slots, tag0, 1);
  if (block_failed(ok)) poison_segments<T, W>(a, g);
  JAXLL_PHASE(5);
}

template <class T, int NR, Proto P, int K>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) rmsnorm_twoshot_kernel(RmsNormArgs a) {
  rmsnorm_twoshot_body<T, NR, P, K>(a);
}

// Every rank of a virtual group in one launch (GroupArgs, all_reduce_common.cuh).
template <class T, int NR, Proto P, int K>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    rmsnorm_twoshot_group_kernel(const __grid_constant__ GroupArgs<RmsNormArgs> g) {
  rmsnorm_twoshot_body<T, NR, P, K>(g.rank[blockIdx.y]);
}

// (each lookup below: `group` names the kernel's group twin instead)
template <class T>
const void* rmsnorm_fn(bool group = false) {
  return group ? reinterpret_cast<const void*>(&rmsnorm_group_kernel<T>)
               : reinterpret_cast<const void*>(&rmsnorm_kernel<T>);
}

const void* rmsnorm_kernel_for(DType dtype, bool group = false) {
  switch (dtype) {
    case DType::kF32: return rmsnorm_fn<float>(group);
    case DType::kBF16: return rmsnorm_fn<__nv_bfloat16>(group);
    case DType::kF16: return rmsnorm_fn<__half>(group);
    default: return nullptr;
  }
}

template <class T, int NR, Proto P>
const void* lean_fn(bool group) {
  return group ? reinterpret_cast<const void*>(&rmsnorm_lean_group_kernel<T, NR, P>)
               : reinterpret_cast<const void*>(&rmsnorm_lean_kernel<T, NR, P>);
}

template <class T, Proto P>
const void* lean_fn(int nranks, bool group) {
  switch (nranks) {
    case 2: return lean_fn<T, 2, P>(group);
    case 4: return lean_fn<T, 4, P>(group);
    case 8: return lean_fn<T, 8, P>(group);
    default: return lean_fn<T, 0, P>(group);
  }
}

template <class T>
const void* lean_fn(int nranks, Proto p, bool group) {
  return p == Proto::kSentinel ? lean_fn<T, Proto::kSentinel>(nranks, group)
                               : lean_fn<T, Proto::kLL>(nranks, group);
}

// The decode-shape kernel for `nranks` ranks on protocol `p` (see rmsnorm_lean_kernel).
const void* lean_kernel_for(DType dtype, int nranks, Proto p, bool group = false) {
  switch (dtype) {
    case DType::kF32: return lean_fn<float>(nranks, p, group);
    case DType::kBF16: return lean_fn<__nv_bfloat16>(nranks, p, group);
    case DType::kF16: return lean_fn<__half>(nranks, p, group);
    default: return nullptr;
  }
}

template <class T, int NR, Proto P, int K>
const void* twoshot_fn(bool group) {
  return group ? reinterpret_cast<const void*>(&rmsnorm_twoshot_group_kernel<T, NR, P, K>)
               : reinterpret_cast<const void*>(&rmsnorm_twoshot_kernel<T, NR, P, K>);
}

template <class T, Proto P, int K>
const void* twoshot_fn(int nranks, bool group) {
  switch (nranks) {
    case 4: return twoshot_fn<T, 4, P, K>(group);
    case 8: return twoshot_fn<T, 8, P, K>(group);
    default: return twoshot_fn<T, 0, P, K>(group);
  }
}

template <class T>
const void* twoshot_fn(int nranks, Proto p, int units, bool group) {
  if (units > 1) {
    return p == Proto::kSentinel ? twoshot_fn<T, Proto::kSentinel, 2>(nranks, group)
                                 : twoshot_fn<T, Proto::kLL, 2>(nranks, group);
  }
  return p == Proto::kSentinel ? twoshot_fn<T, Proto::kSentinel, 1>(nranks, group)
                               : twoshot_fn<T, Proto::kLL, 1>(nranks, group);
}

// The two-shot kernel for `nranks` ranks on protocol `p` whose threads hold
// `units` units (1 or kRmsNormTwoShotUnits; see rmsnorm_twoshot_kernel).
const void* twoshot_kernel_for(DType dtype, int nranks, Proto p, int units, bool group = false) {
  switch (dtype) {
    case DType::kF32: return twoshot_fn<float>(nranks, p, units, group);
    case DType::kBF16: return twoshot_fn<__nv_bfloat16>(nranks, p, units, group);
    case DType::kF16: return twoshot_fn<__half>(nranks, p, units, group);
    default: return nullptr;
  }
}

}  // namespace

const char* rmsnorm_protocol_name(int code) {
  static const char* const names[kRmsNormProtocolCount] = {"auto", "ll", "sentinel", "twoshot_ll",
                                                           "twoshot_sentinel"};
  return code >= 0 && code < kRmsNormProtocolCount ? names[code] : nullptr;
}

const char* rmsnorm_refusal(RmsNormProtocol p) {
  switch (p) {
    case RmsNormProtocol::kSentinel:
      return "sentinel needs rows whose bytes are a multiple of 16 and a call that the "
             "decode-shape kernel moves in one round, a 16-byte unit a thread";
    case RmsNormProtocol::kTwoShotLL:
      return "twoshot_ll needs a call of one row-wave of the kernel's cut, at most 2 units a "
             "thread, an owner's chunk within a scratch region";
    case RmsNormProtocol::kTwoShotSentinel:
      return "twoshot_sentinel needs rows whose bytes are a multiple of 16 and a call of one "
             "row-wave of the kernel's cut, at most 2 units a thread, an owner's chunk within a "
             "scratch region";
    default:
      return "auto and LL16 serve every call the kernel supports";
  }
}

std::vector<const void*> rmsnorm_kernel_functions(bool group) {
  std::vector<const void*> out;
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    out.push_back(rmsnorm_kernel_for(d, group));
    for (Proto p : {Proto::kLL, Proto::kSentinel}) {
      for (int nr : {0, 2, 4, 8}) out.push_back(lean_kernel_for(d, nr, p, group));
      for (int nr : {0, 4, 8})
        for (int units : {1, kRmsNormTwoShotUnits})
          out.push_back(twoshot_kernel_for(d, nr, p, units, group));
    }
  }
  return out;
}

const char* rmsnorm_unsupported(DType dtype, int64_t hidden, const RankView& view) {
  if (rmsnorm_kernel_for(dtype) == nullptr) return "element type (float32, bfloat16, float16)";
  if (hidden <= 0 || (hidden * dtype_bytes(dtype)) % 8 != 0) {
    return "hidden size (its bytes must be a multiple of 8)";
  }
  if (view.geo.region_bytes < 8 || view.max_blocks < 1) return "workspace geometry";
  return nullptr;
}

uint32_t rmsnorm_plan_code(const RmsNormPlan& p) {
  // 4 bits: whether clustered, and the segments and rows at once folded in
  const uint64_t h = static_cast<uint64_t>(p.segments) * 131 +
                     static_cast<uint64_t>(p.rows_at_once) * 7 + (p.cluster > 1 ? 1 : 0);
  return static_cast<uint32_t>(h % 15);
}

namespace {

// The cut of a call into units of `unit` bytes (8: LL16, 16: sentinel).
RmsNormPlan plan_cut(DType dtype, const RankView& view, int64_t tokens, int64_t hidden, int unit) {
  RmsNormPlan plan;
  const void* fn = rmsnorm_kernel_for(dtype);
  if (fn == nullptr || tokens <= 0 || hidden <= 0) return plan;
  const int64_t row_units = hidden * dtype_bytes(dtype) / unit;
  // The grid the one-shot all-reduce would take for the whole message (a block
  // per kSegmentUnits units, up to the bound); few rows are cut into segments
  // to fill it, many rows go a whole row per block in several row-waves.
  const int64_t cap = std::min<int64_t>({view.max_blocks, view.geo.blocks, kMaxBlocks});
  const int64_t target =
      std::min<int64_t>(cap, (tokens * row_units + kSegmentUnits - 1) / kSegmentUnits);
  int64_t segments = 1;
  if (tokens < target) {
    segments = std::min<int64_t>((row_units + kSegmentUnits - 1) / kSegmentUnits, target / tokens);
    segments = std::max<int64_t>(segments, 1);
  }
  const int64_t sig_warp = view.nranks > 1 && view.signatures ? 32 : 0;
  // The cut for `s` segments per row, as many rows at once as the cap allows.
  auto shape = [&](int64_t s) {
    RmsNormPlan p;
    p.seg_span = (row_units + s - 1) / s;
    p.segments = (row_units + p.seg_span - 1) / p.seg_span;  // no segment left empty
    p.rows_at_once = std::max<int64_t>(1, std::min<int64_t>(tokens, cap / p.segments));
    p.chunk_units = std::min<int64_t>(p.seg_span, view.geo.region_bytes / unit);
    const int64_t work = std::min<int64_t>(p.chunk_units, kBlockThreads);
    p.threads = static_cast<int>(std::min<int64_t>(kBlockThreads, ((work + 31) / 32) * 32 + sig_warp));
    return p;
  };
  // The rest of the plan for a cut `p`: rows split over blocks go as one
  // cluster per row where the device launches clusters and holds every rank's
  // at once (at most kClusterSegments blocks a row), else through the header's
  // slots; then the grid, its row-waves and whether it launches early.
  auto finish = [&](RmsNormPlan p) {
    int64_t allowed = 0;
    if (p.segments > 1) {
      const RmsNormPlan c = shape(std::min<int64_t>(p.segments, kClusterSegments));
      if (c.segments > 1) {
        allowed = cluster_allowance(fn, static_cast<int>(c.segments), c.threads, view);
        // (only where the rank may hold a cluster for every row of the wave: fewer
        // rows at once would cost row-waves the slot path does not need)
        if (allowed >= c.rows_at_once) {
          p = c;
          p.cluster = static_cast<int>(p.segments);
        }
      }
    }
#ifdef JAXLL_FUSED_PHASES
    // (phases builds of the test harness only) JAXLL_FUSED_PLAN="S:C:R" forces
    // S segments a row, clusters of C (1: slots) and R rows at once, to time
    // cuts the plan above would not choose; the allowances go to stderr.
    if (const char* e = std::getenv("JAXLL_FUSED_PLAN")) {
      long fs = 0, fc = 0, fr = 0;
      if (std::sscanf(e, "%ld:%ld:%ld", &fs, &fc, &fr) == 3 && fs >= 1 && fr >= 1) {
        p = shape(fs);
        p.rows_at_once = std::min<int64_t>(fr, tokens);
        p.cluster = fc > 1 ? static_cast<int>(p.segments) : 1;
        allowed = p.cluster > 1 ? cluster_allowance(fn, p.cluster, p.threads, view) : 0;
        static int64_t told = -1;  // (once per shape and rank count)
        if (told != tokens * 64 + view.nranks) {
          fprintf(stderr,
                  "JAXLL_FUSED_PLAN %s: segments %ld, rows %ld, cluster %d, threads %d; "
                  "allowance %ld (max_blocks %d)\n",
                  e, (long)p.segments, (long)p.rows_at_once, p.cluster, p.threads,
                  (long)allowed, view.max_blocks);
          told = tokens * 64 + view.nranks;
        }
      }
    }
#endif
    p.blocks = p.segments * p.rows_at_once;
    p.waves = (tokens + p.rows_at_once - 1) / p.rows_at_once;
    p.slots = p.segments > 1 && p.cluster == 1;
    // PDL lets two of this rank's grids be resident: for clusters, only where
    // twice the grid's clusters stay within the rank's share too.
    p.pdl = launches_early(view, p.blocks) && (p.cluster == 1 || 2 * p.rows_at_once <= allowed);
    return p;
  };
  plan = finish(shape(segments));
  // A grid of more than half the rank's bound does not launch early, and the
  // next call then starts only when this one has ended (N=8 on one H200, 4 rows
  // of 8192 bf16: 32 blocks of 128 sentinel units, 6.8 us a call; 16 blocks of
  // 256 that launch early, 5.9 us; two-shot 8.1 vs 6.3 us). Where one row-wave
  // takes every row and fewer, longer segments still leave a unit a thread and
  // the signature warp spare (and one round moves a segment), the cut takes as
  // many segments a row as keep the grid within half the bound, if that grid
  // then launches early.
  bool coarse = true;
#ifdef JAXLL_FUSED_PHASES
  coarse = std::getenv("JAXLL_FUSED_NO_COARSE") == nullptr;  // (to time both cuts)
#endif
  if (coarse && !plan.pdl && view.pdl && plan.waves == 1) {
    const int64_t s = view.max_blocks / 2 / tokens;
    if (s >= 1 && s < plan.segments && (row_units + s - 1) / s + sig_warp <= kBlockThreads) {
      const RmsNormPlan c = finish(shape(s));
      if (c.pdl && c.waves == 1 && c.chunk_units >= c.seg_span) plan = c;
    }
  }
  return plan;
}

// Whether a plan's cut fits rmsnorm_lean_kernel: one row-wave, one round a
// segment, at most one unit a thread.
bool lean_plan(const RmsNormPlan& p) {
  return p.blocks > 0 && p.waves == 1 && p.chunk_units >= p.seg_span && p.seg_span <= p.threads;
}

// The sentinel exchange's cut, where the decode-shape kernel can take it (a
// row's bytes a multiple of 16, one round, a unit a thread); else no plan.
RmsNormPlan sentinel_cut(DType dtype, const RankView& view, int64_t tokens, int64_t hidden) {
  if ((hidden * dtype_bytes(dtype)) % 16 != 0) return RmsNormPlan{};
  RmsNormPlan p = plan_cut(dtype, view, tokens, hidden, 16);
  if (!lean_plan(p)) return RmsNormPlan{};
  p.proto = Proto::kSentinel;
  p.lean = true;
  return p;
}

// The two-shot kernel's cut on protocol `proto`, where it can take it (a row's
// bytes a multiple of the unit, one row-wave, an owner's chunk within a
// region, at most kRmsNormTwoShotUnits units a thread); else no plan.
RmsNormPlan twoshot_cut(DType dtype, const RankView& view, int64_t tokens, int64_t hidden,
                        Proto proto) {
  const int unit = proto == Proto::kSentinel ? 16 : 8;
  if ((hidden * dtype_bytes(dtype)) % unit != 0) return RmsNormPlan{};
  RmsNormPlan p = plan_cut(dtype, view, tokens, hidden, unit);
  if (p.blocks == 0 || p.waves != 1) return RmsNormPlan{};
  const int64_t n = view.nranks;
  const int64_t c = (p.seg_span + n - 1) / n;
  if (c * unit > view.geo.region_bytes || n * c > int64_t{kRmsNormTwoShotUnits} * p.threads) {
    return RmsNormPlan{};
  }
  p.proto = proto;
  p.twoshot = true;
  p.units = n * c > p.threads ? kRmsNormTwoShotUnits : 1;
  return p;
}

}  // namespace

RmsNormPlan plan_all_reduce_rmsnorm(DType dtype, const RankView& view, int64_t tokens,
                                    int64_t hidden, RmsNormProtocol protocol) {
  if (protocol == RmsNormProtocol::kSentinel) return sentinel_cut(dtype, view, tokens, hidden);
  if (protocol == RmsNormProtocol::kTwoShotLL) return twoshot_cut(dtype, view, tokens, hidden, Proto::kLL);
  if (protocol == RmsNormProtocol::kTwoShotSentinel) {
    return twoshot_cut(dtype, view, tokens, hidden, Proto::kSentinel);
  }
  const int64_t row_bytes = hidden * dtype_bytes(dtype);
  if (protocol == RmsNormProtocol::kAuto && view.nranks >= kFusedTwoShotFromRanks &&
      tokens * row_bytes >= kFusedTwoShotFromBytes) {
    const RmsNormPlan p = twoshot_cut(dtype, view, tokens, hidden, Proto::kSentinel);
    if (p.blocks > 0) return p;
  }
  if (protocol == RmsNormProtocol::kAuto &&
      (view.nranks == kFusedSentinelAnySizeRanks || tokens * row_bytes >= kFusedSentinelFromBytes ||
       row_bytes >= kFusedSentinelFromRowBytes)) {
    const RmsNormPlan p = sentinel_cut(dtype, view, tokens, hidden);
    if (p.blocks > 0) return p;
  }
  RmsNormPlan p = plan_cut(dtype, view, tokens, hidden, 8);
  p.lean = lean_plan(p);
  if (protocol == RmsNormProtocol::kAuto && !p.lean && tokens * row_bytes >= kFusedSentinelFromBytes) {
    // (beyond the decode-shape cut the general kernel's rounds cost more than
    // the two-shot kernel's two exchanges)
    const RmsNormPlan t = twoshot_cut(dtype, view, tokens, hidden, Proto::kSentinel);
    if (t.blocks > 0) return t;
  }
  return p;
}

namespace {

// One rank's plan and arguments of the fused call (launch_all_reduce_rmsnorm's
// errors; a plan of no blocks and cudaSuccess: no tokens, nothing to launch).
cudaError_t prepare_rmsnorm(DType dtype, const RankView& view, const void* x,
                            const void* residual, const void* weight, void* normed,
                            void* new_residual, int64_t tokens, int64_t hidden, float eps,
                            RmsNormProtocol protocol, RmsNormPlan* out, RmsNormArgs* args) {
  *out = RmsNormPlan{};
  if (rmsnorm_kernel_for(dtype) == nullptr || rmsnorm_unsupported(dtype, hidden, view) != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (tokens <= 0) return cudaSuccess;
  const RmsNormPlan plan = plan_all_reduce_rmsnorm(dtype, view, tokens, hidden, protocol);
  if (plan.blocks == 0) return cudaErrorNotSupported;  // (a protocol asked for a cut it cannot take)
  *out = plan;
  RmsNormArgs& a = *args;
  a = RmsNormArgs{};
  a.base.view = view;
  a.x = x;
  a.residual = residual;
  a.weight = weight;
  a.normed = normed;
  a.new_residual = new_residual;
  a.tokens = tokens;
  a.hidden = hidden;
  a.row_units = hidden * dtype_bytes(dtype) / (plan.proto == Proto::kSentinel ? 16 : 8);
  a.eps = eps;
#ifdef JAXLL_FUSED_PHASES
  if (const char* e = std::getenv("JAXLL_FUSED_SKIP")) a.skip = std::atoi(e);
#endif
  // The plan rides in the signature's reduction field: it depends on device
  // queries (cluster support and capacity), so ranks on unlike devices could cut
  // a call differently; that must be a reported mismatch, never a wrong row.
  const Algorithm exchange =
      plan.twoshot ? (plan.proto == Proto::kSentinel ? Algorithm::kTwoShotSentinel : Algorithm::kTwoShotLL)
                   : (plan.proto == Proto::kSentinel ? Algorithm::kOneShotSentinel : Algorithm::kOneShotLL);
  a.base.signature = encode_signature(static_cast<uint32_t>(Collective::kRmsNorm), static_cast<uint32_t>(exchange),
                                      static_cast<uint32_t>(dtype), rmsnorm_plan_code(plan),
                                      rmsnorm_signature_shape(tokens, hidden));
  a.seg_span = plan.seg_span;
  a.segments = static_cast<int>(plan.segments);
  a.waves = static_cast<int>(plan.waves);
  a.chunk_units = plan.chunk_units;
  a.clustered = plan.cluster > 1 ? 1 : 0;
  a.base.trigger = plan.pdl ? 1 : 0;
  return cudaSuccess;
}

// The kernel that runs `plan` (its group twin where `group`). (The plan's
// cluster allowance and the grid bound, taken from rmsnorm_kernel, hold for all
// three kernels and their twins: the same launch bounds, and static shared
// memory, 0.5-1.6 KB a block, far below what would limit them.)
const void* rmsnorm_kernel_of(const RmsNormPlan& plan, DType dtype, int nranks, bool group) {
  return plan.twoshot ? twoshot_kernel_for(dtype, nranks, plan.proto, plan.units, group)
         : plan.lean  ? lean_kernel_for(dtype, nranks, plan.proto, group)
                      : rmsnorm_kernel_for(dtype, group);
}

}  // namespace

cudaError_t launch_all_reduce_rmsnorm(DType dtype, const RankView& view, const void* x,
                                      const void* residual, const void* weight, void* normed,
                                      void* new_residual, int64_t tokens, int64_t hidden,
                                      float eps, cudaStream_t stream, RmsNormProtocol protocol) {
  RmsNormPlan plan;
  RmsNormArgs a;
  cudaError_t e = prepare_rmsnorm(dtype, view, x, residual, weight, normed, new_residual, tokens,
                                  hidden, eps, protocol, &plan, &a);
  if (e != cudaSuccess || plan.blocks == 0) return e;
  return launch_collective(rmsnorm_kernel_of(plan, dtype, view.nranks, false), plan.blocks,
                           plan.threads, plan.pdl, &a, stream, plan.cluster);
}

cudaError_t launch_all_reduce_rmsnorm_group(DType dtype, const RankView* views, int n,
                                            const RmsNormOperands* ops, int64_t tokens,
                                            int64_t hidden, float eps, cudaStream_t stream,
                                            RmsNormProtocol protocol) {
  if (n < 1 || n > kMaxRanks || views[0].nranks != n) return cudaErrorInvalidValue;
  GroupArgs<RmsNormArgs> group{};
  RmsNormPlan plan;
  for (int i = 0; i < n; ++i) {
    RmsNormPlan p;
    cudaError_t e = prepare_rmsnorm(dtype, views[i], ops[i].x, ops[i].residual, ops[i].weight,
                                    ops[i].normed, ops[i].new_residual, tokens, hidden, eps,
                                    protocol, &p, &group.rank[i]);
    if (e != cudaSuccess || p.blocks == 0) return e;
    // (one grid for all: every rank's plan must be rank 0's)
    if (i > 0 && (p.blocks != plan.blocks || p.threads != plan.threads || p.cluster != plan.cluster ||
                  p.pdl != plan.pdl || p.lean != plan.lean || p.twoshot != plan.twoshot ||
                  p.proto != plan.proto || p.units != plan.units)) {
      return cudaErrorInvalidValue;
    }
    plan = p;
  }
  return launch_collective(rmsnorm_kernel_of(plan, dtype, n, true), plan.blocks, plan.threads,
                           plan.pdl, &group, stream, plan.cluster, n);
}

}  // namespace jaxll
