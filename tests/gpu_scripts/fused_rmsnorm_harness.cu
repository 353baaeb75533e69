// Standalone GPU check of the fused all-reduce + RMSNorm kernel on virtual ranks
// (one GPU, N rank workspaces, N streams), without the jaxll runtime: mixed
// shapes back to back with no host sync, PDL on and off, small scratch, a
// skipped rank then a reset, long sequences. Build and run from the repo root:
//   nvcc -std=c++17 -O2 -arch=sm_90 -Iffi/include -Iffi/kernels \
//     tests/gpu_scripts/fused_rmsnorm_harness.cu ffi/kernels/all_reduce_rmsnorm.cu \
//     ffi/kernels/launch.cu -o /tmp/h
//   /tmp/h small|err|stress|seq|all
// With -DJAXLL_FUSED_PHASES (on both files), mode "phases" prints where the
// fused kernel's time goes: each block's thread 0 stamps the global timer at six
// points (entry, epochs reserved, row reduced, row's sum of squares known, norm
// written, end); medians of the intervals over blocks, ranks and 200 calls (each
// synchronized, so the "reduced" interval includes the ranks' launch skew).
// HARNESS_SHAPES="16x8192,8x8192" sets its shapes (default six decode shapes);
// HARNESS_PROTOCOL=k runs every call of any mode on RmsNormProtocol k.
// JAXLL_FUSED_PLAN="S:C:R" (phases builds only) forces every call's cut: S
// segments a row, clusters of C blocks (1: the header's slots), R rows at once;
// the plan and its cluster allowance go to stderr. A cut of more blocks than the
// rank's grid bound times out (error kind 4) by design.
// Mode "graph" times calls in steady state instead: HARNESS_GRAPH_ITERS (200)
// calls of every rank back to back in one CUDA graph, medians of 7 replays, us
// a call above a graph of empty kernels, for HARNESS_GRAPH_N ranks (8),
// HARNESS_SHAPES (4, 8, 16 x 8192) and HARNESS_VARIANTS="protocol:skip,..."
// (skip: JAXLL_FUSED_SKIP of a phases build, see all_reduce_rmsnorm.cu; each
// variant's plan is printed: segments x rows at once, cluster, PDL); with
// phases, the medians of the last call's intervals and the ranks' spread;
// HARNESS_GRAPH_PDL=0 / HARNESS_GRAPH_SIG=0 turn PDL / signatures off; with
// HARNESS_WITH_ALL_REDUCE, the two-shot and one-shot sentinel and the one-shot LL16 all-reduce of x.
// With -DHARNESS_WITH_ALL_REDUCE and the all-reduce kernel files added
// (all_reduce.cu all_reduce_oneshot.cu all_reduce_twoshot.cu
// all_reduce_twoshot_atomic.cu gather_scatter.cu, beside all_reduce_rmsnorm.cu
// and launch.cu),
// mode "ar" runs the seq mode's bursts (random delays, no host sync) on the
// all-reduce kernels, exact float32 sums.
// Knobs of the seq mode (to bisect a failure), from the environment:
//   HARNESS_CONFIGS="n:pdl:scratch:sig,..."  only these configurations
//   HARNESS_SYNC=1        synchronize the device after every call (no overlap of calls)
//   HARNESS_DELAY=0       no random delay kernels
//   HARNESS_SLACK=k       k blocks fewer per rank than the co-residency bound allows
//   HARNESS_TIMEOUT_MS=t  the kernels' wait bound (default 3000)
//   HARNESS_DELAY_HOST=1  delays by a host callback in the stream (cudaLaunchHostFunc)
//                         instead of the one-thread delay kernel
//   HARNESS_CARVEOUT=p    cudaFuncAttributePreferredSharedMemoryCarveout = p (percent,
//                         0 = most L1) on every kernel the harness launches, the
//                         delay kernel included. The runtime sets one carveout on
//                         every kernel; without it the seq and all modes fail at
//                         n = 4 and 8 (a lagging rank's call that no SM takes:
//                         benchmarks/README.md), so check with HARNESS_CARVEOUT=0
//   HARNESS_SNAPSHOT_MS=s s ms after the burst is enqueued (set t well above s),
//                         copy every rank's header while the kernels run and
//                         print, per rank, the first call not started on every
//                         block of its grid and which blocks of it did start:
//                         a call started on some blocks only means the GPU did
//                         not schedule the rest (co-residency); calls started
//                         on every block everywhere mean the protocol waits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>
#include <cstddef>
#include <algorithm>
#include <array>
#include <chrono>
#include <thread>

#include "all_reduce.h"
#include "all_reduce_kernels.h"
#include "jaxll/workspace_layout.h"
#include "jaxll/error_word.h"
#include "jaxll/rank_view.h"

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      fprintf(stderr, "CUDA %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, \
              __LINE__, #x);                                                        \
      exit(2);                                                                      \
    }                                                                               \
  } while (0)


using namespace jaxll;
#ifdef JAXLL_FUSED_PHASES
namespace jaxll {
cudaError_t read_fused_phases(unsigned long long* out);
}
#endif

static void CUDART_CB host_sleep(void* ns) {
  std::this_thread::sleep_for(std::chrono::nanoseconds(reinterpret_cast<uintptr_t>(ns)));
}
static bool g_delay_host = false;
__global__ void delay_kernel(uint64_t ns);
// Holds `stream` back by about `ns` nanoseconds: a one-thread kernel that spins,
// or (HARNESS_DELAY_HOST=1) a host callback that sleeps.
static void delay(cudaStream_t stream, uint64_t ns) {
  if (g_delay_host) {
    CK(cudaLaunchHostFunc(stream, host_sleep, reinterpret_cast<void*>(static_cast<uintptr_t>(ns))));
  } else {
    delay_kernel<<<1, 1, 0, stream>>>(ns);
  }
}
__global__ void delay_kernel(uint64_t ns) {
  uint64_t t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > ns) break;
  }
}

struct VRank {
  char* base = nullptr;
  WorkspaceHeader* header = nullptr;
  unsigned long long* host_err = nullptr;
  RankView view{};
  cudaStream_t s{};
};

static int g_bound = 0;
static int g_slack = 0;
static long env_long(const char* name, long fallback) {
  const char* v = getenv(name);
  return v && *v ? strtol(v, nullptr, 10) : fallback;
}
static int g_fail = 0;

struct Group {
  int n = 0;
  ScratchGeometry geo;
  std::vector<VRank> r;
  void clear_rank(VRank& k) {
    CK(cudaMemset(k.base, 0, geo.total_bytes));
    CK(cudaMemset(k.base + geo.sentinel_offset, kSentinelByte, geo.plain_offset - geo.sentinel_offset));
    CK(cudaMemset(k.header, 0, offsetof(WorkspaceHeader, peer_bases)));
    const size_t packets = static_cast<size_t>(geo.blocks) * 2 * geo.nranks;
    std::vector<uint64_t> idle(2 * packets);
    for (size_t i = 0; i < packets; ++i) { idle[2 * i] = 0; idle[2 * i + 1] = 1ull << 32; }
    CK(cudaMemcpy(k.base + geo.sig_offset, idle.data(), idle.size() * 8, cudaMemcpyHostToDevice));
    for (int i = 0; i < kHostErrorWords; ++i) ((volatile unsigned long long*)k.host_err)[i] = 0;
    CK(cudaDeviceSynchronize());
  }
  void init(int nranks, size_t scratch, int pdl, int signatures, uint64_t timeout_ms) {
    n = nranks;
    int max_blocks = std::min(kMaxBlocks, g_bound / n - g_slack);
    size_t region = (scratch + max_blocks - 1) / max_blocks;
    geo = make_geometry(n, max_blocks, region);
    r.resize(n);
    for (int i = 0; i < n; ++i) {
      CK(cudaMalloc(&r[i].base, geo.total_bytes));
      CK(cudaMalloc(&r[i].header, 4096));
      CK(cudaMemset(r[i].header, 0, 4096));
      CK(cudaHostAlloc(&r[i].host_err, kHostErrorWords * 8, cudaHostAllocMapped));
      CK(cudaStreamCreateWithFlags(&r[i].s, cudaStreamNonBlocking));
    }
    for (int i = 0; i < n; ++i) {
      RankView& v = r[i].view;
      v.header = r[i].header;
      unsigned long long* dev_err = nullptr;
      CK(cudaHostGetDevicePointer((void**)&dev_err, r[i].host_err, 0));
      v.host_error = dev_err;
      for (int p = 0; p < n; ++p) v.peers.base[p] = r[p].base;
      v.geo = geo;
      v.rank = i;
      v.nranks = n;
      v.max_blocks = max_blocks;
      v.pdl = pdl;
      v.timeout_ns = timeout_ms * 1000000ull;
      v.trap = 0;
      v.signatures = signatures;
      clear_rank(r[i]);
    }
  }
  void destroy() {
    for (auto& k : r) {
      cudaFree(k.base);
      cudaFree(k.header);
      cudaFreeHost(k.host_err);
      cudaStreamDestroy(k.s);
    }
    r.clear();
  }
  void reset() {
    CK(cudaDeviceSynchronize());
    for (auto& k : r) clear_rank(k);
  }
};

// ---- host element conversion ----
static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
static float bf2f(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static float round_dt(DType dt, float f) {
  if (dt == DType::kF32) return f;
  if (dt == DType::kBF16) return bf2f(f2bf(f));
  return __half2float(__float2half_rn(f));
}
static void store_dt(DType dt, void* buf, size_t i, float f) {
  if (dt == DType::kF32) ((float*)buf)[i] = f;
  else if (dt == DType::kBF16) ((uint16_t*)buf)[i] = f2bf(f);
  else { __half h = __float2half_rn(f); memcpy((char*)buf + 2 * i, &h, 2); }
}
static float load_dt(DType dt, const void* buf, size_t i) {
  if (dt == DType::kF32) return ((const float*)buf)[i];
  if (dt == DType::kBF16) return bf2f(((const uint16_t*)buf)[i]);
  __half h; memcpy(&h, (const char*)buf + 2 * i, 2); return __half2float(h);
}

// The library's plan of a call (plan_all_reduce_rmsnorm): its segments and
// blocks, and how far the call moves the header's norm tag (its row-waves where
// the partial sums go through the tagged slots, else 0).
// HARNESS_PROTOCOL=k: every call on RmsNormProtocol k (default 0, auto).
static RmsNormProtocol harness_protocol() {
  const char* e = std::getenv("HARNESS_PROTOCOL");
  return static_cast<RmsNormProtocol>(e ? std::atoi(e) : 0);
}

static int64_t plan_waves(const RankView& view, int64_t tokens, int64_t hidden, DType dt,
                          int64_t* segs_out, int64_t* blocks_out) {
  const RmsNormPlan p = plan_all_reduce_rmsnorm(dt, view, tokens, hidden, harness_protocol());
  *segs_out = p.segments;
  *blocks_out = p.blocks;
  return p.slots ? p.waves : 0;
}

struct Call {
  DType dt;
  int64_t tokens, hidden;
  float eps;
  std::vector<std::vector<char>> x;  // per rank
  std::vector<char> res, w;
  char *dx = nullptr, *dres = nullptr, *dw = nullptr, *dnormed = nullptr, *dnew = nullptr;
  size_t block_bytes = 0;
};

static void make_call(Call& c, int n, DType dt, int64_t tokens, int64_t hidden, uint64_t seed) {
  c.dt = dt; c.tokens = tokens; c.hidden = hidden; c.eps = 1e-5f;
  const size_t eb = dtype_bytes(dt);
  const size_t cnt = tokens * hidden;
  c.block_bytes = cnt * eb;
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  c.x.assign(n, std::vector<char>(c.block_bytes));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < cnt; ++i) store_dt(dt, c.x[r].data(), i, nd(g));
  c.res.resize(c.block_bytes);
  for (size_t i = 0; i < cnt; ++i) store_dt(dt, c.res.data(), i, nd(g));
  c.w.resize(hidden * eb);
  for (int64_t i = 0; i < hidden; ++i) store_dt(dt, c.w.data(), i, 1.f + 0.1f * nd(g));
  CK(cudaMalloc(&c.dx, c.block_bytes * n));
  CK(cudaMalloc(&c.dres, c.block_bytes));
  CK(cudaMalloc(&c.dw, hidden * eb));
  CK(cudaMalloc(&c.dnormed, c.block_bytes * n));
  CK(cudaMalloc(&c.dnew, c.block_bytes * n));
  for (int r = 0; r < n; ++r)
    CK(cudaMemcpy(c.dx + r * c.block_bytes, c.x[r].data(), c.block_bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(c.dres, c.res.data(), c.block_bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(c.dw, c.w.data(), hidden * eb, cudaMemcpyHostToDevice));
  CK(cudaMemset(c.dnormed, 0x5a, c.block_bytes * n));
  CK(cudaMemset(c.dnew, 0x5a, c.block_bytes * n));
}

static void launch_call(Group& G, Call& c, int skip_rank = -1) {
  for (int r = 0; r < G.n; ++r) {
    if (r == skip_rank) continue;
    CK(launch_all_reduce_rmsnorm(c.dt, G.r[r].view, c.dx + r * c.block_bytes, c.dres, c.dw,
                                 c.dnormed + r * c.block_bytes, c.dnew + r * c.block_bytes,
                                 c.tokens, c.hidden, c.eps, G.r[r].s, harness_protocol()));
  }
}

// Returns number of problems.
static int check_call(Group& G, Call& c, const char* what) {
  const int n = G.n;
  const size_t cnt = c.tokens * c.hidden;
  std::vector<char> normed(c.block_bytes * n), nw(c.block_bytes * n);
  CK(cudaMemcpy(normed.data(), c.dnormed, normed.size(), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(nw.data(), c.dnew, nw.size(), cudaMemcpyDeviceToHost));
  int bad = 0;
  // reference new_residual
  std::vector<float> ref_new(cnt);
  for (size_t i = 0; i < cnt; ++i) {
    float s = load_dt(c.dt, c.x[0].data(), i);
    for (int r = 1; r < n; ++r) s = s + load_dt(c.dt, c.x[r].data(), i);
    s = round_dt(c.dt, s);
    ref_new[i] = round_dt(c.dt, s + load_dt(c.dt, c.res.data(), i));
  }
  double maxrel = 0;
  const double tol = c.dt == DType::kF32 ? 4e-6 : (c.dt == DType::kBF16 ? 3.2e-2 : 4e-3);
  for (int r = 0; r < n && bad < 5; ++r) {
    if (memcmp(normed.data() + r * c.block_bytes, normed.data(), c.block_bytes) != 0) {
      printf("  FAIL %s: normed of rank %d differs bitwise from rank 0\n", what, r);
      ++bad;
    }
    for (size_t i = 0; i < cnt; ++i) {
      float got = load_dt(c.dt, nw.data() + r * c.block_bytes, i);
      if (memcmp(&got, &ref_new[i], 4) != 0 && !(std::isnan(got) && std::isnan(ref_new[i]))) {
        printf("  FAIL %s: new_residual rank %d elem %zu (row %zu col %zu) got %g want %g\n", what,
               r, i, i / c.hidden, i % c.hidden, got, ref_new[i]);
        ++bad;
        break;
      }
    }
  }
  for (int64_t t = 0; t < c.tokens && bad < 5; ++t) {
    double ss = 0;
    for (int64_t h = 0; h < c.hidden; ++h) ss += double(ref_new[t * c.hidden + h]) * ref_new[t * c.hidden + h];
    double inv = 1.0 / std::sqrt(ss / c.hidden + c.eps);
    for (int64_t h = 0; h < c.hidden; ++h) {
      size_t i = t * c.hidden + h;
      float want = round_dt(c.dt, round_dt(c.dt, float(ref_new[i] * inv)) * load_dt(c.dt, c.w.data(), h));
      float got = load_dt(c.dt, normed.data(), i);
      double rel = std::fabs(double(got) - want) / (std::fabs(double(want)) + 1.0);
      if (!(rel <= tol)) {
        printf("  FAIL %s: normed row %ld col %ld got %g want %g\n", what, (long)t, (long)h, got, want);
        ++bad;
        break;
      }
      maxrel = std::max(maxrel, rel);
    }
  }
  return bad;
}

static void free_call(Call& c) {
  cudaFree(c.dx); cudaFree(c.dres); cudaFree(c.dw); cudaFree(c.dnormed); cudaFree(c.dnew);
}

static int check_errors(Group& G, const char* what) {
  int bad = 0;
  for (int r = 0; r < G.n; ++r) {
    unsigned long long e = ((volatile unsigned long long*)G.r[r].host_err)[0];
    if (e) {
      const DecodedError d = decode_error(e);
      printf("  FAIL %s: rank %d error word %#llx (kind %u, rank %u waited for %u, block %u, epoch %u)\n",
             what, r, e, static_cast<unsigned>(d.kind), d.rank, d.peer, d.block, d.epoch);
      ++bad;
    }
  }
  return bad;
}

// See HARNESS_SNAPSHOT_MS above. grids[i]: blocks of the burst's call i.
// Its stream and pinned buffer are made before any burst (snapshot_setup): made
// while kernels spin, they could wait for the device to go idle.
static cudaStream_t g_snap_stream = nullptr;
static WorkspaceHeader* g_snap_host = nullptr;
static void snapshot_setup() {
  CK(cudaStreamCreateWithFlags(&g_snap_stream, cudaStreamNonBlocking));
  CK(cudaHostAlloc(&g_snap_host, sizeof(WorkspaceHeader) * kMaxRanks, cudaHostAllocDefault));
}
static void snapshot(Group& G, const std::vector<int64_t>& grids) {
  cudaStream_t cs = g_snap_stream;
  WorkspaceHeader* h = g_snap_host;
  for (int r = 0; r < G.n; ++r)
    CK(cudaMemcpyAsync(h + r, G.r[r].header, sizeof(WorkspaceHeader), cudaMemcpyDeviceToHost, cs));
  CK(cudaStreamSynchronize(cs));
  for (int r = 0; r < G.n; ++r) {
    std::vector<uint32_t> cum(kMaxBlocks, 0);
    size_t i = 0;
    for (; i < grids.size(); ++i) {
      bool all = true;
      for (int64_t b = 0; b < grids[i]; ++b) all &= h[r].calls[b] >= cum[b] + 1;
      if (!all) break;
      for (int64_t b = 0; b < grids[i]; ++b) ++cum[b];
    }
    if (i == grids.size()) {
      printf("  snapshot rank %d: all %zu calls started on every block\n", r, grids.size());
      continue;
    }
    std::string missing;
    int started = 0;
    for (int64_t b = 0; b < grids[i]; ++b) {
      if (h[r].calls[b] >= cum[b] + 1) {
        ++started;
      } else {
        missing += " " + std::to_string(b);
      }
    }
    printf("  snapshot rank %d: calls 0..%zu started everywhere; call %zu (%ld blocks): %d started, not:%s; error %#llx\n",
           r, i == 0 ? 0 : i - 1, i, (long)grids[i], started, missing.c_str(), (unsigned long long)h[r].error);
  }
  fflush(stdout);
}

static void read_hdr(Group& G, int r, uint64_t* tag, uint64_t* done) {
  CK(cudaMemcpy(tag, &G.r[r].header->norm_tag, 8, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(done, &G.r[r].header->norm_done, 8, cudaMemcpyDeviceToHost));
}

int main(int argc, char** argv) {
  int dev = 0;
  CK(cudaSetDevice(dev));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  int occ = 1 << 30;
  for (const void* fn : rmsnorm_kernel_functions()) {
    int b = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, fn, kBlockThreads, 0));
    occ = std::min(occ, b);
  }
  g_bound = sms * occ;
  g_slack = static_cast<int>(env_long("HARNESS_SLACK", 0));
  g_delay_host = env_long("HARNESS_DELAY_HOST", 0) != 0;
  const long carveout = env_long("HARNESS_CARVEOUT", -2);
  if (carveout >= -1) {
    std::vector<const void*> fns = rmsnorm_kernel_functions();
#ifdef HARNESS_WITH_ALL_REDUCE
    fns = all_kernel_functions();
#endif
    fns.push_back(reinterpret_cast<const void*>(&delay_kernel));
    for (const void* fn : fns)
      CK(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, static_cast<int>(carveout)));
    printf("carveout preference %ld on %zu kernels\n", carveout, fns.size());
  }
  const bool sync_each = env_long("HARNESS_SYNC", 0) != 0;
  const bool delays = env_long("HARNESS_DELAY", 1) != 0;
  const uint64_t timeout_ms = static_cast<uint64_t>(env_long("HARNESS_TIMEOUT_MS", 3000));
  const long snapshot_ms = env_long("HARNESS_SNAPSHOT_MS", 0);
  if (snapshot_ms > 0) snapshot_setup();
  const char* only = getenv("HARNESS_CONFIGS");
  auto selected = [&](int n, int pdl, size_t scratch, int sig) {
    if (!only || !*only) return true;
    char key[64];
    snprintf(key, sizeof key, "%d:%d:%zu:%d", n, pdl, scratch, sig);
    std::string list = std::string(",") + only + ",";
    return list.find(std::string(",") + key + ",") != std::string::npos;
  };
  printf("slack %d, sync each call %d, delays %d, timeout %llu ms\n", g_slack, (int)sync_each,
         (int)delays, (unsigned long long)timeout_ms);
  printf("SMs %d, occupancy %d, bound %d, sizeof(WorkspaceHeader) %zu, offsetof norm_partials %zu\n", sms,
         occ, g_bound, sizeof(WorkspaceHeader), offsetof(WorkspaceHeader, norm_partials));
  const char* mode = argc > 1 ? argv[1] : "all";
  const std::string m(mode);
  const DType dts[3] = {DType::kBF16, DType::kF32, DType::kF16};
  const int64_t toks[] = {1, 2, 3, 5, 7, 16, 33, 64, 100, 257};
  const int64_t hids[] = {12, 128, 1000, 4096, 5120, 8192, 16384};
  int total_bad = 0;
  uint64_t seed = 1;

  if (m == "all" || m == "seq") {
    for (int n : {1, 2, 3, 4, 8}) {
      for (int pdl : {0, 1}) {
        for (size_t scratch : {size_t(512 * 1024), size_t(2048)}) {
          for (int sig : {1, 0}) {
            if (!only && sig == 0 && (pdl == 0 || scratch == 2048)) continue;
            if (!selected(n, pdl, scratch, sig)) continue;
            Group G;
            G.init(n, scratch, pdl, sig, timeout_ms);
            uint64_t expect_tag = 0;
            int calls = 0;
            // A burst of back-to-back calls of different shapes (no host sync in between).
            std::vector<Call> burst;
            int k = 0;
            for (int64_t t : toks)
              for (int64_t h : hids) {
                if (t * h * n > 40'000'000) continue;
                DType dt = dts[(k++) % 3];
                if (dt == DType::kF16 && h == 12) dt = DType::kF32;
                burst.emplace_back();
                make_call(burst.back(), n, dt, t, h, seed++);
              }
            CK(cudaDeviceSynchronize());
            std::mt19937 rg(n * 100 + pdl * 10 + (scratch == 2048));
            for (auto& c : burst) {
              // random delay on a random rank
              if (delays && n > 1 && rg() % 4 == 0) {
                const int who = static_cast<int>(rg() % n);
                delay(G.r[who].s, rg() % 200000);
              }
              launch_call(G, c);
              if (sync_each) CK(cudaDeviceSynchronize());
              int64_t S, B;
              expect_tag += plan_waves(G.r[0].view, c.tokens, c.hidden, c.dt, &S, &B);
              ++calls;
            }
            if (snapshot_ms > 0) {
              std::vector<int64_t> grids;
              for (auto& c : burst) {
                int64_t S, B;
                plan_waves(G.r[0].view, c.tokens, c.hidden, c.dt, &S, &B);
                grids.push_back(B);
              }
              std::this_thread::sleep_for(std::chrono::milliseconds(snapshot_ms));
              snapshot(G, grids);
            }
            for (auto& k2 : G.r) CK(cudaStreamSynchronize(k2.s));
            CK(cudaGetLastError());
            char what[256];
            int bad = check_errors(G, "burst");
            int first_bad = -1;
            for (size_t i = 0; i < burst.size(); ++i) {
              const int before = bad;
              snprintf(what, sizeof what, "n=%d pdl=%d scratch=%zu sig=%d tokens=%ld hidden=%ld dt=%d", n,
                       pdl, scratch, sig, (long)burst[i].tokens, (long)burst[i].hidden, (int)burst[i].dt);
              bad += check_call(G, burst[i], what);
              if (bad > before && first_bad < 0) first_bad = static_cast<int>(i);
            }
            if (first_bad >= 0) {
              // the plan of the first failing call and of the one before it
              for (int i = std::max(0, first_bad - 1); i <= first_bad; ++i) {
                int64_t S, B;
                const int64_t waves = plan_waves(G.r[0].view, burst[i].tokens, burst[i].hidden, burst[i].dt, &S, &B);
                printf("  call %d of %zu: %ld x %ld dt %d, segments %ld, blocks %ld, tag advance %ld%s\n", i,
                       burst.size(), (long)burst[i].tokens, (long)burst[i].hidden, (int)burst[i].dt, (long)S,
                       (long)B, (long)waves, i == first_bad ? " (first failing)" : "");
              }
            }
            for (auto& c : burst) free_call(c);
            for (int r = 0; r < n; ++r) {
              uint64_t tag, done;
              read_hdr(G, r, &tag, &done);
              if (tag != expect_tag || done != 0) {
                printf("  FAIL header rank %d: norm_tag %llu (want %llu) norm_done %llu\n", r,
                       (unsigned long long)tag, (unsigned long long)expect_tag, (unsigned long long)done);
                ++bad;
              }
            }
            printf("n=%d pdl=%d scratch=%zu sig=%d: %d calls, %s\n", n, pdl, scratch, sig, calls,
                   bad ? "FAILED" : "ok");
            fflush(stdout);
            total_bad += bad;
            G.destroy();
          }
        }
      }
    }
  }

#ifdef JAXLL_FUSED_PHASES
  if (m == "phases") {
    constexpr int kPhases6 = 6;
    // HARNESS_SHAPES="16x8192,8x8192" picks the shapes (tokens x hidden)
    std::vector<std::array<int64_t, 2>> shapes = {{1, 4096}, {8, 4096}, {1, 8192}, {8, 8192},
                                                  {16, 8192}, {32, 8192}};
    if (const char* e = std::getenv("HARNESS_SHAPES")) {
      shapes.clear();
      for (const char* q = e; *q;) {
        long t = 0, h = 0;
        int used = 0;
        if (std::sscanf(q, "%ldx%ld%n", &t, &h, &used) != 2 || t < 1 || h < 1) {
          fprintf(stderr, "HARNESS_SHAPES: expected TOKENSxHIDDEN,..., got %s\n", e);
          return 2;
        }
        shapes.push_back({t, h});
        q += used;
        if (*q == ',') ++q;
      }
    }
    const char* names[5] = {"entry->epochs", "epochs->reduced", "reduced->sumsq", "sumsq->normed",
                            "normed->end"};
    for (int n : {2, 8}) {
      Group G;
      G.init(n, 512 * 1024, 0, 1, 3000);
      for (const auto& sh : shapes) {
        Call c;
        make_call(c, n, DType::kBF16, sh[0], sh[1], seed++);
        int64_t S, B;
        plan_waves(G.r[0].view, c.tokens, c.hidden, c.dt, &S, &B);
        std::vector<double> iv[5], span;
        std::vector<unsigned long long> st(static_cast<size_t>(kMaxRanks) * kMaxBlocks * kPhases6);
        for (int it = 0; it < 230; ++it) {
          launch_call(G, c);
          CK(cudaDeviceSynchronize());
          if (it < 30) continue;
          CK(read_fused_phases(st.data()));
          for (int r = 0; r < n; ++r) {
            unsigned long long lo = ~0ull, hi = 0;
            for (int64_t b = 0; b < B; ++b) {
              const unsigned long long* t = &st[(static_cast<size_t>(r) * kMaxBlocks + b) * kPhases6];
              for (int p = 0; p < 5; ++p) iv[p].push_back((t[p + 1] - t[p]) * 1e-3);
              lo = std::min(lo, t[0]);
              hi = std::max(hi, t[5]);
            }
            span.push_back((hi - lo) * 1e-3);
          }
        }
        auto med = [](std::vector<double>& v) {
          std::sort(v.begin(), v.end());
          return v.empty() ? 0.0 : v[v.size() / 2];
        };
        printf("phases n=%d %ld x %ld bf16 (segments %ld, blocks %ld, cluster %d), us:", n,
               (long)c.tokens, (long)c.hidden, (long)S, (long)B,
               plan_all_reduce_rmsnorm(c.dt, G.r[0].view, c.tokens, c.hidden, harness_protocol()).cluster);
        for (int p = 0; p < 5; ++p) printf(" %s %.2f;", names[p], med(iv[p]));
        printf(" kernel span %.2f\n", med(span));
        total_bad += check_errors(G, "phases") + check_call(G, c, "phases");
        free_call(c);
        fflush(stdout);
      }
      G.destroy();
    }
  }
#endif

  if (m == "graph") {
    // Steady-state time per call: HARNESS_GRAPH_ITERS calls of every rank back to
    // back in one CUDA graph (as jaxll.testing's kernel timers do), replayed 7
    // times; medians, us per call, minus the same graph of empty kernels.
    // HARNESS_GRAPH_N ranks (default 8), HARNESS_SHAPES as for phases,
    // HARNESS_VARIANTS="protocol:skip,..." (skip: JAXLL_FUSED_SKIP, phases
    // builds only); with HARNESS_WITH_ALL_REDUCE also the two-shot and one-shot
    // sentinel and the one-shot LL16 all-reduce of x.
    const int n = static_cast<int>(env_long("HARNESS_GRAPH_N", 8));
    const int iters = static_cast<int>(env_long("HARNESS_GRAPH_ITERS", 200));
    std::vector<std::array<int64_t, 2>> shapes = {{4, 8192}, {8, 8192}, {16, 8192}};
    if (const char* e = std::getenv("HARNESS_SHAPES")) {
      shapes.clear();
      long t = 0, h = 0;
      int used = 0;
      for (const char* q = e; std::sscanf(q, "%ldx%ld%n", &t, &h, &used) == 2; q += used + (q[used] == ',')) {
        shapes.push_back({t, h});
        if (!q[used]) break;
      }
    }
    std::vector<std::array<int, 2>> variants;
    {
      const char* e = std::getenv("HARNESS_VARIANTS");
      std::string list = e ? e : "4:0";
      int pr = 0, sk = 0, used = 0;
      for (const char* q = list.c_str(); std::sscanf(q, "%d:%d%n", &pr, &sk, &used) == 2;
           q += used + (q[used] == ',')) {
        variants.push_back({pr, sk});
        if (!q[used]) break;
      }
    }
    Group G;
    G.init(n, 512 * 1024, static_cast<int>(env_long("HARNESS_GRAPH_PDL", 1)),
           static_cast<int>(env_long("HARNESS_GRAPH_SIG", 1)), timeout_ms);
    cudaStream_t origin;
    cudaEvent_t fork, e0, e1;
    std::vector<cudaEvent_t> done(n);
    CK(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    for (auto& d : done) CK(cudaEventCreateWithFlags(&d, cudaEventDisableTiming));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto timed = [&](auto&& enqueue) {
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CK(cudaStreamBeginCapture(origin, cudaStreamCaptureModeThreadLocal));
      CK(cudaEventRecord(fork, origin));
      for (int r = 0; r < n; ++r) CK(cudaStreamWaitEvent(G.r[r].s, fork, 0));
      for (int k = 0; k < iters; ++k) enqueue();
      for (int r = 0; r < n; ++r) {
        CK(cudaEventRecord(done[r], G.r[r].s));
        CK(cudaStreamWaitEvent(origin, done[r], 0));
      }
      CK(cudaStreamEndCapture(origin, &graph));
      CK(cudaGraphInstantiate(&exec, graph, 0));
      CK(cudaGraphLaunch(exec, origin));
      CK(cudaStreamSynchronize(origin));
      std::vector<double> t;
      for (int rep = 0; rep < 7; ++rep) {
        CK(cudaEventRecord(e0, origin));
        CK(cudaGraphLaunch(exec, origin));
        CK(cudaEventRecord(e1, origin));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms * 1000.0 / iters);
      }
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(graph));
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    const double floor = timed([&] {
      for (int r = 0; r < n; ++r) delay_kernel<<<1, 32, 0, G.r[r].s>>>(0);
    });
    printf("graph n=%d, %d calls a graph, floor %.2f us (subtracted below)\n", n, iters, floor);
    for (const auto& sh : shapes) {
      Call c;
      make_call(c, n, DType::kBF16, sh[0], sh[1], seed++);
      printf("%ld x %ld bf16:", (long)c.tokens, (long)c.hidden);
#ifdef HARNESS_WITH_ALL_REDUCE
      for (Algorithm alg : {Algorithm::kTwoShotSentinel, Algorithm::kOneShotSentinel, Algorithm::kOneShotLL}) {
        const double us = timed([&] {
          for (int r = 0; r < n; ++r)
            CK(launch_all_reduce(alg, DType::kBF16, ReduceOp::kSum, G.r[r].view, c.dx + r * c.block_bytes,
                                 c.dnew + r * c.block_bytes, c.tokens * c.hidden, G.r[r].s));
        });
        printf(" all_reduce %s %.2f;",
               alg == Algorithm::kTwoShotSentinel   ? "twoshot_sentinel"
               : alg == Algorithm::kOneShotSentinel ? "oneshot_sentinel"
                                                    : "oneshot_ll",
               us - floor);
      }
#endif
      for (const auto& vr : variants) {
        setenv("HARNESS_PROTOCOL", std::to_string(vr[0]).c_str(), 1);
        setenv("JAXLL_FUSED_SKIP", std::to_string(vr[1]).c_str(), 1);
        int64_t S, B;
        plan_waves(G.r[0].view, c.tokens, c.hidden, c.dt, &S, &B);
        if (B == 0) {
          printf(" fused %d:%d n/a;", vr[0], vr[1]);
          continue;
        }
        const double us = timed([&] { launch_call(G, c); });
        const RmsNormPlan pl = plan_all_reduce_rmsnorm(c.dt, G.r[0].view, c.tokens, c.hidden, harness_protocol());
        printf(" fused %d:%d (%s%ldx%ld%s%s) %.2f", vr[0], vr[1], pl.twoshot ? "2s " : "", (long)pl.segments,
               (long)pl.rows_at_once, pl.cluster > 1 ? " cl" : "", pl.pdl ? " pdl" : "", us - floor);
#ifdef JAXLL_FUSED_PHASES
        {
          // The graph's last call: medians over blocks and ranks of the intervals
          // between the stamps, the ranks' spread of first entries and the call's span.
          std::vector<unsigned long long> st(static_cast<size_t>(kMaxRanks) * kMaxBlocks * 6);
          CK(read_fused_phases(st.data()));
          std::vector<double> iv[5];
          unsigned long long lo = ~0ull, hi = 0, first_hi = 0;
          for (int r = 0; r < n; ++r) {
            unsigned long long rlo = ~0ull;
            for (int64_t b = 0; b < B; ++b) {
              const unsigned long long* t = &st[(static_cast<size_t>(r) * kMaxBlocks + b) * 6];
              for (int q = 0; q < 5; ++q) iv[q].push_back(t[q + 1] >= t[q] ? (t[q + 1] - t[q]) * 1e-3 : -1);
              rlo = std::min(rlo, t[0]);
              hi = std::max(hi, t[5]);
            }
            lo = std::min(lo, rlo);
            first_hi = std::max(first_hi, rlo);
          }
          printf(" [");
          for (int q = 0; q < 5; ++q) {
            std::sort(iv[q].begin(), iv[q].end());
            printf("%.2f%s", iv[q][iv[q].size() / 2], q < 4 ? " " : "");
          }
          printf(" | skew %.2f span %.2f]", (first_hi - lo) * 1e-3, (hi - lo) * 1e-3);
        }
#endif
        printf(";");
      }
      unsetenv("JAXLL_FUSED_SKIP");
      unsetenv("HARNESS_PROTOCOL");
      printf("\n");
      fflush(stdout);
      total_bad += check_errors(G, "graph");
      free_call(c);
      G.reset();
    }
    G.destroy();
  }

  if (m == "cfg") {
    // One rank: calls of a few block sizes and a delay kernel, to read under ncu
    // (--metrics launch__shared_mem_config_size,launch__block_size,launch__grid_size)
    // which shared-memory configuration the driver gives each kernel.
    Group G;
    G.init(1, 512 * 1024, 0, 1, 3000);
    const int64_t sh[4][2] = {{1, 128}, {1, 4096}, {64, 16384}, {3, 1000}};
    for (int i = 0; i < 4; ++i) {
      Call c;
      make_call(c, 1, DType::kBF16, sh[i][0], sh[i][1], seed++);
      launch_call(G, c);
      CK(cudaDeviceSynchronize());
      free_call(c);
    }
    delay_kernel<<<1, 1, 0, G.r[0].s>>>(1000);
#ifdef HARNESS_WITH_ALL_REDUCE
    float* buf = nullptr;
    CK(cudaMalloc(&buf, 500000 * 4 * 2));
    for (int64_t cnt : {256, 4096, 500000})
      CK(launch_all_reduce(Algorithm::kOneShotLL, DType::kF32, ReduceOp::kSum, G.r[0].view, buf,
                           buf + 500000, cnt, G.r[0].s));
    CK(cudaDeviceSynchronize());
    cudaFree(buf);
#endif
    CK(cudaDeviceSynchronize());
    total_bad += check_errors(G, "cfg");
    printf("cfg done\n");
    G.destroy();
  }

  if (m == "small") {
    for (int n : {1, 2}) {
      Group G;
      G.init(n, 2048, 0, 1, 60000);
      const int64_t sh[4][2] = {{1, 4096}, {3, 1000}, {70, 128}, {2, 8192}};
      for (int i = 0; i < 4; ++i) {
        Call c;
        make_call(c, n, i % 2 ? DType::kF32 : DType::kBF16, sh[i][0], sh[i][1], seed++);
        launch_call(G, c);
        CK(cudaDeviceSynchronize());
        total_bad += check_errors(G, "small") + check_call(G, c, "small");
        free_call(c);
      }
      printf("small n=%d done\n", n);
      G.destroy();
    }
  }

  if (m == "all" || m == "err") {
    // Error path: one rank never arrives; then reset and run again.
    for (int n : {2, 4}) {
      Group G;
      G.init(n, 512 * 1024, 1, 1, 300);
      Call c;
      make_call(c, n, DType::kBF16, 2, 4096, seed++);
      launch_call(G, c, /*skip_rank=*/n - 1);
      CK(cudaDeviceSynchronize());
      int errs = 0;
      for (int r = 0; r < n - 1; ++r) errs += ((volatile unsigned long long*)G.r[r].host_err)[0] != 0;
      uint64_t tag, done;
      read_hdr(G, 0, &tag, &done);
      printf("err n=%d: ranks with error %d/%d, rank0 norm_tag %llu norm_done %llu\n", n, errs, n - 1,
             (unsigned long long)tag, (unsigned long long)done);
      // outputs of rank 0 must be poisoned (all-ones bytes)
      std::vector<unsigned char> o(c.block_bytes);
      CK(cudaMemcpy(o.data(), c.dnormed, c.block_bytes, cudaMemcpyDeviceToHost));
      size_t not_poison = 0;
      for (auto b : o) not_poison += b != 0xFF;
      printf("err n=%d: rank0 normed bytes not poisoned: %zu of %zu\n", n, not_poison, o.size());
      if (errs != n - 1 || not_poison) ++total_bad;
      free_call(c);
      // a later call before reset: every rank poisons
      G.reset();
      for (int i = 0; i < 5; ++i) {
        Call c2;
        make_call(c2, n, i % 2 ? DType::kF32 : DType::kBF16, 1 + i * 3, 4096, seed++);
        launch_call(G, c2);
        CK(cudaDeviceSynchronize());
        int bad = check_errors(G, "after reset") + check_call(G, c2, "after reset");
        free_call(c2);
        total_bad += bad;
        if (bad) printf("err n=%d: after reset call %d FAILED\n", n, i);
      }
      printf("err n=%d: after reset ok\n", n);
      G.destroy();
    }
  }

  if (m == "all" || m == "stress") {
    // Many back-to-back calls of alternating shapes (tags, parities, PDL) for n = 8 and 2.
    for (int n : {8, 2}) {
      Group G;
      G.init(n, 512 * 1024, 1, 1, 3000);
      std::vector<Call> cs(6);
      const int64_t shapes[6][2] = {{1, 4096}, {3, 8192}, {64, 4096}, {1, 128}, {100, 1000}, {2, 16384}};
      for (int i = 0; i < 6; ++i) make_call(cs[i], n, DType::kBF16, shapes[i][0], shapes[i][1], seed++);
      CK(cudaDeviceSynchronize());
      uint64_t expect_tag = 0;
      int bad = 0;
      for (int rep = 0; rep < 300; ++rep) {
        for (int i = 0; i < 6; ++i) {
          launch_call(G, cs[i]);
          int64_t S, B;
          expect_tag += plan_waves(G.r[0].view, cs[i].tokens, cs[i].hidden, cs[i].dt, &S, &B);
        }
      }
      CK(cudaDeviceSynchronize());
      bad += check_errors(G, "stress");
      for (int i = 0; i < 6; ++i) bad += check_call(G, cs[i], "stress");
      uint64_t tag, done;
      read_hdr(G, 0, &tag, &done);
      if (tag != expect_tag || done) ++bad;
      printf("stress n=%d: 1800 calls, norm_tag %llu (want %llu): %s\n", n, (unsigned long long)tag,
             (unsigned long long)expect_tag, bad ? "FAILED" : "ok");
      for (auto& c : cs) free_call(c);
      total_bad += bad;
      G.destroy();
    }
  }
#ifdef HARNESS_WITH_ALL_REDUCE
  if (m == "ar") {
    const int64_t counts[] = {256, 1000, 2048, 4096, 12288, 32768, 65536, 131072, 500000};
    const Algorithm algs[] = {Algorithm::kOneShotLL, Algorithm::kOneShotSentinel, Algorithm::kTwoShotLL,
                              Algorithm::kTwoShotSentinel, Algorithm::kTwoShotLL128Atomic};
    for (int n : {2, 3, 4, 8}) {
      for (int pdl : {0, 1}) {
        const size_t scratch = 512 * 1024;
        if (!selected(n, pdl, scratch, 1)) continue;
        Group G;
        G.init(n, scratch, pdl, 1, timeout_ms);
        struct ArCall { Algorithm alg; int64_t count; float* in; float* out; };
        std::vector<ArCall> calls;
        std::mt19937 rg(n * 100 + pdl * 10 + 7);
        for (int rep = 0; rep < 3; ++rep)
          for (int64_t cnt : counts)
            for (Algorithm alg : algs) {
              ArCall c{alg, cnt, nullptr, nullptr};
              CK(cudaMalloc(&c.in, cnt * 4 * n));
              CK(cudaMalloc(&c.out, cnt * 4 * n));
              std::vector<float> h(cnt * n);
              for (int r = 0; r < n; ++r)
                for (int64_t i = 0; i < cnt; ++i) h[r * cnt + i] = static_cast<float>((i * 7 + r * 13 + rep) % 97);
              CK(cudaMemcpy(c.in, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
              CK(cudaMemset(c.out, 0x5a, cnt * 4 * n));
              calls.push_back(c);
            }
        std::shuffle(calls.begin(), calls.end(), rg);
        CK(cudaDeviceSynchronize());
        for (auto& c : calls) {
          if (delays && rg() % 4 == 0) {
            const int who = static_cast<int>(rg() % n);
            delay(G.r[who].s, rg() % 200000);
          }
          for (int r = 0; r < n; ++r)
            CK(launch_all_reduce(c.alg, DType::kF32, ReduceOp::kSum, G.r[r].view, c.in + r * c.count,
                                 c.out + r * c.count, c.count, G.r[r].s));
          if (sync_each) CK(cudaDeviceSynchronize());
        }
        if (snapshot_ms > 0) {
          std::vector<int64_t> grids;
          for (auto& c : calls)
            grids.push_back(plan_all_reduce(c.alg, c.count, 4, n, G.geo, G.r[0].view.max_blocks).blocks);
          std::this_thread::sleep_for(std::chrono::milliseconds(snapshot_ms));
          snapshot(G, grids);
        }
        for (auto& k2 : G.r) CK(cudaStreamSynchronize(k2.s));
        CK(cudaGetLastError());
        int bad = check_errors(G, "ar burst");
        int first_bad = -1;
        for (size_t i = 0; i < calls.size(); ++i) {
          auto& c = calls[i];
          std::vector<float> in(c.count * n), out(c.count * n);
          CK(cudaMemcpy(in.data(), c.in, in.size() * 4, cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(out.data(), c.out, out.size() * 4, cudaMemcpyDeviceToHost));
          bool wrong = false;
          for (int64_t j = 0; j < c.count && !wrong; ++j) {
            float want = 0.f;
            for (int r = 0; r < n; ++r) want += in[r * c.count + j];
            for (int r = 0; r < n; ++r) wrong |= out[r * c.count + j] != want;
          }
          if (wrong) {
            ++bad;
            if (first_bad < 0) first_bad = static_cast<int>(i);
          }
          cudaFree(c.in);
          cudaFree(c.out);
        }
        if (first_bad >= 0)
          for (int i = std::max(0, first_bad - 1); i <= first_bad; ++i)
            printf("  call %d of %zu: algorithm %d, count %ld%s\n", i, calls.size(), (int)calls[i].alg,
                   (long)calls[i].count, i == first_bad ? " (first wrong)" : "");
        printf("ar n=%d pdl=%d: %zu calls, %d wrong, %s\n", n, pdl, calls.size(), bad, bad ? "FAILED" : "ok");
        fflush(stdout);
        total_bad += bad;
        G.destroy();
      }
    }
  }
#endif
  printf("TOTAL %s (%d problems)\n", total_bad ? "FAILED" : "OK", total_bad);
  return total_bad ? 1 : 0;
}
