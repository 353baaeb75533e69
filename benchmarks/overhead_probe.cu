// Where a small kernel's fixed cost comes from, on the GPU at hand.
//
// Each probe is a tiny kernel (1 block of 32 threads) launched 400 times back
// to back on one stream, captured in a CUDA graph and replayed under CUDA
// events; the median time per launch over the replays is printed, with and
// without programmatic dependent launch (PDL: the launch attribute plus
// griddepcontrol.wait / launch_dependents in the kernel). Differences between
// probes price one ingredient of an all-reduce kernel's prologue and epilogue:
// kernel parameters, a dependent global load, the epoch handshake through
// shared memory and __syncthreads, a 64-bit division, a system-scope fence.
//
//   nvcc -O3 -arch=sm_90 -std=c++17 benchmarks/overhead_probe.cu -o /tmp/probe && /tmp/probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                        \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,                    \
                   cudaGetErrorString(e_));                                             \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

// About the size of jaxll's AllReduceArgs (a RankView with 16 peer pointers).
struct Args {
  uint64_t* header;  // an "epoch" word per block
  const float* x;
  float* y;
  int64_t count;
  int64_t span;
  int64_t round_units;
  void* peers[16];
  uint64_t pad[12];  // geometry, rank, timeout...
  int pdl;
};

__device__ __forceinline__ void pdl_wait(const Args& a) {
#if __CUDA_ARCH__ >= 900
  if (a.pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger(const Args& a) {
#if __CUDA_ARCH__ >= 900
  if (a.pdl) asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

__global__ void k_empty(Args a) {
  pdl_wait(a);
  pdl_trigger(a);
}

// One store through a parameter.
__global__ void k_store(Args a) {
  pdl_wait(a);
  pdl_trigger(a);
  if (threadIdx.x == 0) a.y[0] = 1.0f;
}

// Parameters from five cache lines of the parameter block, then one store.
__global__ void k_params(Args a) {
  pdl_wait(a);
  pdl_trigger(a);
  if (threadIdx.x == 0) {
    uintptr_t s = reinterpret_cast<uintptr_t>(a.peers[0]) ^ reinterpret_cast<uintptr_t>(a.peers[8]) ^
                  reinterpret_cast<uintptr_t>(a.peers[15]) ^ a.pad[11] ^ a.pad[4];
    a.y[0] = static_cast<float>(s & 1);
  }
}

// y = x + 1 (a dependent global load, then a store), as an all-reduce of one rank.
__global__ void k_load_store(Args a) {
  pdl_wait(a);
  pdl_trigger(a);
  const int t = threadIdx.x;
  if (t < a.count) a.y[t] = a.x[t] + 1.0f;
}

// ... plus jaxll's epoch handshake: thread 0 loads and bumps the block's epoch,
// the block learns it through shared memory and __syncthreads.
__global__ void k_epoch_shared(Args a) {
  pdl_wait(a);
  pdl_trigger(a);
  __shared__ uint64_t s_epoch;
  const int t = threadIdx.x;
  const float v = t < a.count ? a.x[t] : 0.0f;
  if (t == 0) {
    const uint64_t e = a.header[blockIdx.x];
    a.header[blockIdx.x] = e + 1;
    s_epoch = e + 1;
  }
  __syncthreads();
  if (t < a.count) a.y[t] = v + static_cast<float>(s_epoch & 1);
}

// ... the same with every thread loading the epoch itself and lane 0 writing
// it back at the end (no shared memory, no block barrier).
__global__ void k_epoch_direct(Args a) {
  pdl_wait(a);
  pdl_trigger(a);
  const int t = threadIdx.x;
  const uint64_t e = a.header[blockIdx.x] + 1;
  const float v = t < a.count ? a.x[t] : 0.0f;
  if (t < a.count) a.y[t] = v + static_cast<float>(e & 1);
  __syncwarp();
  if (t == 0) a.header[blockIdx.x] = e;
}

// k_load_store plus a 64-bit division of parameters (the block's rounds).
__global__ void k_div64(Args a) {
  pdl_wait(a);
  pdl_trigger(a);
  const int t = threadIdx.x;
  const int64_t rounds = (a.span + a.round_units - 1) / a.round_units;
  if (t < a.count) a.y[t] = a.x[t] + static_cast<float>(rounds);
}

// k_load_store with a system-scope release fence before the store.
__global__ void k_fence(Args a) {
  pdl_wait(a);
  pdl_trigger(a);
  const int t = threadIdx.x;
  const float v = t < a.count ? a.x[t] : 0.0f;
  asm volatile("fence.acq_rel.sys;" ::: "memory");
  if (t < a.count) a.y[t] = v + 1.0f;
}

// k_load_store with the store made relaxed at system scope (how LL packets go out).
__global__ void k_sys_store(Args a) {
  pdl_wait(a);
  pdl_trigger(a);
  const int t = threadIdx.x;
  if (t < a.count) {
    const float v = a.x[t] + 1.0f;
    asm volatile("st.relaxed.sys.global.f32 [%0], %1;" ::"l"(a.y + t), "f"(v) : "memory");
  }
}

struct Probe {
  const char* name;
  void (*fn)(Args);
};

double time_probe(void (*fn)(Args), Args a, bool pdl, int iters, int reps) {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  a.pdl = pdl ? 1 : 0;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(32);
  cfg.stream = s;
  cfg.attrs = pdl ? attr : nullptr;
  cfg.numAttrs = pdl ? 1 : 0;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < iters; ++i) CHECK(cudaLaunchKernelEx(&cfg, fn, a));
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&ge, g, 0));
  CHECK(cudaGraphLaunch(ge, s));
  CHECK(cudaStreamSynchronize(s));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaEventRecord(e0, s));
    CHECK(cudaGraphLaunch(ge, s));
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    us.push_back(ms * 1000.0 / iters);
  }
  CHECK(cudaGraphExecDestroy(ge));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  CHECK(cudaStreamDestroy(s));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 400;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 31;
  Args a = {};
  CHECK(cudaMalloc(&a.header, 4096));
  CHECK(cudaMemset(a.header, 0, 4096));
  float* buf;
  CHECK(cudaMalloc(&buf, 4096));
  CHECK(cudaMemset(buf, 0, 4096));
  a.x = buf;
  a.y = buf;  // in place: each launch reads what the previous one wrote
  a.count = 2;
  a.span = 3;
  a.round_units = 1 << 20;
  for (int i = 0; i < 16; ++i) a.peers[i] = buf;
  const Probe probes[] = {
      {"empty kernel", k_empty},
      {"one store", k_store},
      {"params from 5 lines + store", k_params},
      {"load + store (dependent)", k_load_store},
      {"load + store, sys-scope store", k_sys_store},
      {"load + store + 64-bit divide", k_div64},
      {"load + store + fence.acq_rel.sys", k_fence},
      {"load + store + epoch via smem/__syncthreads", k_epoch_shared},
      {"load + store + epoch loaded by every thread", k_epoch_direct},
  };
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("overhead probe on %s: %d launches per graph, median of %d replays, us per launch\n",
              prop.name, iters, reps);
  std::printf("%-46s %8s %8s\n", "probe (1 block x 32 threads)", "plain", "PDL");
  for (int pass = 0; pass < 2; ++pass) {
    for (const Probe& p : probes) {
      const double plain = time_probe(p.fn, a, false, iters, reps);
      const double pdl = time_probe(p.fn, a, true, iters, reps);
      if (pass == 1) std::printf("%-46s %8.3f %8.3f\n", p.name, plain, pdl);
    }
  }
  return 0;
}
