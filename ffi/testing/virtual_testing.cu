#include "virtual_testing.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <type_traits>
#include <stdexcept>
#include <thread>

#include "jaxll/elements.cuh"
#include "jaxll/spin_wait.cuh"

namespace jaxll {
namespace {

constexpr int64_t kGuardFront = 8;
constexpr int64_t kGuardBack = 16;

__host__ __device__ inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ inline uint64_t value_hash(uint64_t seed, uint64_t call, int rank, int64_t i) {
  return mix64(seed ^ mix64(call * 0x100000001B3ull + static_cast<uint64_t>(rank) * 0x51ED27ull) ^
               mix64(static_cast<uint64_t>(i)));
}

template <class T>
__device__ inline T gen_value(uint64_t h) {
  // Uniform in [-4, 4), rounded to T.
  const float f = (static_cast<float>(h >> 40) * (1.0f / 16777216.0f)) * 8.0f - 4.0f;
  return ElemTraits<T>::from_acc(f);
}
template <>
__device__ inline int32_t gen_value<int32_t>(uint64_t h) {
  return static_cast<int32_t>(h % 2001) - 1000;
}

template <class T>
__device__ inline uint32_t bits_of(T v) {
  typename ElemTraits<T>::Bits b;
  memcpy(&b, &v, sizeof(T));
  return b;
}

template <class T>
__global__ void fill_bits_kernel(T* buf, int64_t len, uint32_t pattern) {
  using Bits = typename ElemTraits<T>::Bits;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < len;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x)
    reinterpret_cast<Bits*>(buf)[j] = static_cast<Bits>(pattern);
}

template <class T>
__global__ void gen_kernel(T* in, int64_t count, uint64_t seed, uint64_t call, int rank) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    in[i] = gen_value<T>(value_hash(seed, call, rank, i));
}

struct Mismatch {
  unsigned long long count;
  int claimed;
  int rank;
  long long call;
  long long index;
  uint32_t got;
  uint32_t want;
};

template <class T, class Op>
__global__ void check_kernel(const T* buf, int64_t buf_len, int64_t off, int64_t count, int nranks,
                             uint64_t seed, uint64_t call, int rank, uint32_t guard,
                             Mismatch* mm) {
  using Bits = typename ElemTraits<T>::Bits;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < buf_len;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t got = bits_of(buf[j]);
    uint32_t want;
    const int64_t i = j - off;
    if (i >= 0 && i < count) {
      typename ElemTraits<T>::Acc acc =
          ElemTraits<T>::to_acc(gen_value<T>(value_hash(seed, call, 0, i)));
      for (int r = 1; r < nranks; ++r)
        acc = Op::apply(acc, ElemTraits<T>::to_acc(gen_value<T>(value_hash(seed, call, r, i))));
      want = bits_of(ElemTraits<T>::from_acc(acc));
    } else {
      want = static_cast<Bits>(guard);
    }
    if (got != want) {
      atomicAdd(&mm->count, 1ull);
      if (atomicCAS(&mm->claimed, 0, 1) == 0) {
        mm->rank = rank;
        mm->call = static_cast<long long>(call);
        mm->index = i;
        mm->got = got;
        mm->want = want;
      }
    }
  }
}

// Output pointers of every rank, passed by value.
template <class T>
struct RankOutputs {
  const T* out[kMaxRanks];
};

// Check for algorithms whose sums are not reproducible (LL128-atomic): every
// rank's output must equal rank 0's bit for bit, and rank 0's must be within
// n * eps(T) * sum|x| of the float64 sum.
template <class T>
__global__ void check_close_kernel(RankOutputs<T> outs, int64_t buf_len, int64_t off,
                                   int64_t count, int nranks, uint64_t seed, uint64_t call,
                                   uint32_t guard, float eps, Mismatch* mm) {
  using Bits = typename ElemTraits<T>::Bits;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < buf_len;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t got0 = bits_of(outs.out[0][j]);
    const int64_t i = j - off;
    int bad_rank = -1;
    uint32_t got = got0, want = got0;
    if (i >= 0 && i < count) {
      double sum = 0, mag = 0;
      for (int r = 0; r < nranks; ++r) {
        const double xv = ElemTraits<T>::to_acc(gen_value<T>(value_hash(seed, call, r, i)));
        sum += xv;
        mag += fabs(xv);
      }
      const double g = ElemTraits<T>::to_acc(outs.out[0][j]);
      if (!(fabs(g - sum) <= nranks * static_cast<double>(eps) * mag + 1e-30)) {
        bad_rank = 0;
        want = bits_of(ElemTraits<T>::from_acc(static_cast<float>(sum)));
      }
    } else if (got0 != static_cast<Bits>(guard)) {
      bad_rank = 0;
      want = static_cast<Bits>(guard);
    }
    for (int r = 1; r < nranks && bad_rank < 0; ++r) {
      const uint32_t b = bits_of(outs.out[r][j]);
      if (b != got0) {
        bad_rank = r;
        got = b;
        want = got0;
      }
    }
    if (bad_rank >= 0) {
      atomicAdd(&mm->count, 1ull);
      if (atomicCAS(&mm->claimed, 0, 1) == 0) {
        mm->rank = bad_rank;
        mm->call = static_cast<long long>(call);
        mm->index = i;
        mm->got = got;
        mm->want = want;
      }
    }
  }
}

// Counts elements of `buf` (elem_bytes wide) whose bits are all ones.
__global__ void count_poison_kernel(const unsigned char* buf, int64_t count, int elem_bytes,
                                    unsigned long long* out) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    bool all = true;
    for (int b = 0; b < elem_bytes; ++b) all = all && buf[i * elem_bytes + b] == 0xFF;
    local += all ? 1 : 0;
  }
  if (local) atomicAdd(out, local);
}

__global__ void delay_kernel(uint64_t ns) {
  const uint64_t start = globaltimer_ns();
  while (globaltimer_ns() - start < ns) {
  }
}

// Device buffers freed on scope exit.
class Buffers {
 public:
  void* alloc(size_t bytes) {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), "allocating test buffers");
    ptrs_.push_back(p);
    return p;
  }
  ~Buffers() {
    for (void* p : ptrs_) cudaFree(p);
  }

 private:
  std::vector<void*> ptrs_;
};

std::string first_error(Workspace& ws) {
  for (int i = 0; i < ws.group_size(); ++i) {
    Rank& r = ws.rank(0, i);
    if (uint64_t w = ws.error_word(r)) return ws.describe_error(r, w);
  }
  return "";
}

void sync_ranks(Workspace& ws) {
  for (int i = 0; i < ws.group_size(); ++i)
    check_cuda(cudaStreamSynchronize(ws.rank(0, i).stream), "waiting for a virtual rank");
}

bool reproducible(Algorithm a) { return a != Algorithm::kTwoShotLL128Atomic; }

template <class T>
float accumulation_eps() {
  return sizeof(T) == 4 ? 1.0f / (1 << 23) : (std::is_same<T, __half>::value ? 1.0f / 1024 : 1.0f / 128);
}

template <class T, class Op>
StressResult stress_typed(Workspace& ws, const std::vector<Algorithm>& algorithms, DType dtype,
                          ReduceOp op, const std::vector<int64_t>& counts, uint64_t seed,
                          int max_delay_us) {
  const int n = ws.group_size();
  const int64_t max_count = counts.empty() ? 1 : *std::max_element(counts.begin(), counts.end());
  const int64_t buf_len = kGuardFront + max_count + 1 + kGuardBack;
  const uint32_t guard = sizeof(T) == 2 ? 0xA5A5u : 0xA5A5A5A5u;
  Buffers bufs;
  std::vector<T*> in(n), out(n);
  RankOutputs<T> outs{};
  for (int r = 0; r < n; ++r) {
    in[r] = static_cast<T*>(bufs.alloc(buf_len * sizeof(T)));
    out[r] = static_cast<T*>(bufs.alloc(buf_len * sizeof(T)));
    outs.out[r] = out[r];
  }
  Mismatch* mm = static_cast<Mismatch*>(bufs.alloc(sizeof(Mismatch)));
  check_cuda(cudaMemset(mm, 0, sizeof(Mismatch)), "clearing the mismatch record");
  std::vector<cudaEvent_t> events(n + 1);
  for (auto& e : events) check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating an event");
  struct EventGuard {
    std::vector<cudaEvent_t>& ev;
    ~EventGuard() { for (auto e : ev) cudaEventDestroy(e); }
  } event_guard{events};
  check_cuda(cudaDeviceSynchronize(), "preparing the stress test");

  const int threads = 256;
  const int grid = static_cast<int>(std::min<int64_t>(1024, (buf_len + threads - 1) / threads));
  // Each call is issued breadth-first, phase by phase across the ranks. Virtual
  // ranks' streams can share a hardware queue (CUDA_DEVICE_MAX_CONNECTIONS), and
  // a queue stalls at a command that waits on its own stream's spinning
  // all-reduce; issuing every rank's all-reduce before any rank's check keeps
  // such a stall from ever holding back a peer's all-reduce.
  for (size_t c = 0; c < counts.size(); ++c) {
    const int64_t count = counts[c];
    const Algorithm algorithm = algorithms[c % algorithms.size()];
    const int64_t off = kGuardFront + ((c % 4 == 3) ? 1 : 0);  // every 4th call misaligned
    for (int r = 0; r < n; ++r) {
      cudaStream_t s = ws.rank(0, r).stream;
      fill_bits_kernel<T><<<grid, threads, 0, s>>>(out[r], buf_len, guard);
      gen_kernel<T><<<grid, threads, 0, s>>>(in[r] + off, count, seed, c, r);
      const uint64_t h = mix64(seed ^ (c * 131 + r));
      if (max_delay_us > 0 && (h & 3) == 0) {
        delay_kernel<<<1, 1, 0, s>>>((h >> 8) % (static_cast<uint64_t>(max_delay_us) * 1000 + 1));
      }
    }
    for (int r = 0; r < n; ++r) {
      check_cuda(launch_all_reduce(algorithm, dtype, op, ws.rank(0, r).view, in[r] + off,
                                   out[r] + off, count, ws.rank(0, r).stream),
                 "launching an all-reduce of " + std::to_string(count) + " elements");
    }
    if (reproducible(algorithm)) {
      for (int r = 0; r < n; ++r) {
        check_kernel<T, Op><<<grid, threads, 0, ws.rank(0, r).stream>>>(
            out[r], buf_len, off, count, n, seed, c, r, guard, mm);
      }
    } else {
      // Compare all ranks' outputs on rank 0's stream, then let every rank go on.
      cudaStream_t s0 = ws.rank(0, 0).stream;
      for (int r = 1; r < n; ++r) {
        check_cuda(cudaEventRecord(events[r], ws.rank(0, r).stream), "recording an event");
        check_cuda(cudaStreamWaitEvent(s0, events[r], 0), "joining the ranks");
      }
      check_close_kernel<T><<<grid, threads, 0, s0>>>(outs, buf_len, off, count, n, seed, c,
                                                        guard, accumulation_eps<T>(), mm);
      check_cuda(cudaEventRecord(events[n], s0), "recording an event");
      for (int r = 1; r < n; ++r)
        check_cuda(cudaStreamWaitEvent(ws.rank(0, r).stream, events[n], 0), "forking the ranks");
    }
    check_cuda(cudaGetLastError(), "launching the stress kernels");
  }
  sync_ranks(ws);
  Mismatch h{};
  check_cuda(cudaMemcpy(&h, mm, sizeof(h), cudaMemcpyDeviceToHost), "reading the mismatch record");
  StressResult res;
  res.calls = counts.size();
  res.mismatches = h.count;
  if (h.count) {
    res.first_call = h.call;
    res.first_rank = h.rank;
    res.first_index = h.index;
    res.got_bits = h.got;
    res.want_bits = h.want;
  }
  res.error = first_error(ws);
  for (int i = 0; i < n; ++i) res.rank_errors.push_back(ws.error_word(ws.rank(0, i)));
  return res;
}

template <class T>
StressResult stress_op(Workspace& ws, const std::vector<Algorithm>& a, DType d, ReduceOp op,
                       const std::vector<int64_t>& counts, uint64_t seed, int delay) {
  switch (op) {
    case ReduceOp::kSum: return stress_typed<T, SumOp>(ws, a, d, op, counts, seed, delay);
    case ReduceOp::kMax: return stress_typed<T, MaxOp>(ws, a, d, op, counts, seed, delay);
    case ReduceOp::kMin: return stress_typed<T, MinOp>(ws, a, d, op, counts, seed, delay);
  }
  throw std::runtime_error("unknown reduction");
}

// Captures `iters` rounds of `enqueue(rank, stream)` on every rank's stream into
// one graph, replays it `reps` times and returns microseconds per round. With
// `one_launch` a round is one `enqueue(-1, stream)` on rank 0's stream: every
// rank's call in one launch.
template <class Enqueue>
std::vector<double> time_graph(Workspace& ws, int iters, int reps, bool one_launch,
                               Enqueue&& enqueue) {
  const int n = ws.group_size();
  cudaStream_t origin;
  check_cuda(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking), "creating a stream");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  std::vector<double> out;
  auto cleanup = [&] {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    cudaStreamDestroy(origin);
  };
  try {
    check_cuda(cudaStreamBeginCapture(origin, cudaStreamCaptureModeThreadLocal), "capturing");
    check_cuda(cudaEventRecord(ws.fork_event(), origin), "capturing the fork");
    for (int r = 0; r < n; ++r)
      check_cuda(cudaStreamWaitEvent(ws.rank(0, r).stream, ws.fork_event(), 0), "capturing");
    for (int k = 0; k < iters; ++k) {
      if (one_launch) {
        check_cuda(enqueue(-1, ws.rank(0, 0).stream), "capturing a call");
        continue;
      }
      for (int r = 0; r < n; ++r) check_cuda(enqueue(r, ws.rank(0, r).stream), "capturing a call");
    }
    for (int r = 0; r < n; ++r) {
      check_cuda(cudaEventRecord(ws.rank(0, r).done, ws.rank(0, r).stream), "capturing");
      check_cuda(cudaStreamWaitEvent(origin, ws.rank(0, r).done, 0), "capturing the join");
    }
    check_cuda(cudaStreamEndCapture(origin, &graph), "ending the capture");
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiating the graph");
    check_cuda(cudaGraphLaunch(exec, origin), "launching the graph");
    check_cuda(cudaStreamSynchronize(origin), "running the graph");
    const std::string err = first_error(ws);
    if (!err.empty()) throw std::runtime_error(err);
    check_cuda(cudaEventCreate(&start), "creating an event");
    check_cuda(cudaEventCreate(&stop), "creating an event");
    for (int rep = 0; rep < reps; ++rep) {
      check_cuda(cudaEventRecord(start, origin), "timing");
      check_cuda(cudaGraphLaunch(exec, origin), "launching the graph");
      check_cuda(cudaEventRecord(stop, origin), "timing");
      check_cuda(cudaEventSynchronize(stop), "timing");
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, start, stop), "timing");
      out.push_back(ms * 1000.0 / iters);
    }
    const std::string err2 = first_error(ws);
    if (!err2.empty()) throw std::runtime_error(err2);
  } catch (...) {
    cudaStreamCaptureStatus st;
    if (cudaStreamIsCapturing(origin, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) {
      cudaGraph_t g;
      cudaStreamEndCapture(origin, &g);
      if (g) cudaGraphDestroy(g);
    }
    cudaGetLastError();
    cleanup();
    throw;
  }
  cleanup();
  return out;
}

template <class T>
void append_typed_kernels(std::vector<const void*>& out) {
  out.push_back(reinterpret_cast<const void*>(&fill_bits_kernel<T>));
  out.push_back(reinterpret_cast<const void*>(&gen_kernel<T>));
  out.push_back(reinterpret_cast<const void*>(&check_kernel<T, SumOp>));
  out.push_back(reinterpret_cast<const void*>(&check_kernel<T, MaxOp>));
  out.push_back(reinterpret_cast<const void*>(&check_kernel<T, MinOp>));
  out.push_back(reinterpret_cast<const void*>(&check_close_kernel<T>));
}

}  // namespace

std::vector<int64_t> virtual_calls(Workspace& ws, const std::vector<RankCall>& calls) {
  if (!ws.virtual_ranks()) throw std::runtime_error("virtual_calls needs a virtual-rank workspace");
  const int n = ws.group_size();
  if (static_cast<int>(calls.size()) != n) {
    throw std::runtime_error("virtual_calls needs one call per rank (" + std::to_string(n) + ")");
  }
  for (const RankCall& c : calls) {
    if (c.count <= 0) throw std::runtime_error("element counts must be positive");
    if (!has_kernel(c.algorithm, c.dtype, c.op)) {
      throw std::runtime_error("virtual_calls: no kernel for an algorithm/dtype/op combination");
    }
  }
  DeviceGuard guard(ws.rank(0, 0).ordinal);
  Buffers bufs;
  std::vector<void*> in(n), out(n);
  auto* counts = static_cast<unsigned long long*>(bufs.alloc(n * sizeof(unsigned long long)));
  check_cuda(cudaMemset(counts, 0, n * sizeof(unsigned long long)), "clearing counters");
  for (int r = 0; r < n; ++r) {
    const size_t bytes = static_cast<size_t>(calls[r].count) * dtype_bytes(calls[r].dtype);
    in[r] = bufs.alloc(bytes);
    out[r] = bufs.alloc(bytes);
    check_cuda(cudaMemset(in[r], 0x11, bytes), "filling inputs");
    check_cuda(cudaMemset(out[r], 0, bytes), "clearing outputs");
  }
  check_cuda(cudaDeviceSynchronize(), "preparing the calls");
  // The ranks on time are queued first and given a moment to be resident (spinning on
  // the late ranks); only then are the late ranks' delay kernels queued, so those have
  // to find room on an SM while the other calls occupy the GPU, as a lagging rank's
  // kernels do in a real run.
  auto launch = [&](int r) {
    const RankCall& c = calls[r];
    for (int k = 0; c.delay_us > 0 && k < c.delay_kernels; ++k)
      delay_kernel<<<1, 1, 0, ws.rank(0, r).stream>>>(static_cast<uint64_t>(c.delay_us) * 1000);
    check_cuda(launch_all_reduce(c.algorithm, c.dtype, c.op, ws.rank(0, r).view, in[r], out[r],
                                 c.count, ws.rank(0, r).stream),
               "launching an all-reduce");
  };
  bool any_late = false;
  for (int r = 0; r < n; ++r) {
    if (calls[r].skip) continue;
    if (calls[r].delay_us > 0) any_late = true;
    else launch(r);
  }
  if (any_late) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  for (int r = 0; r < n; ++r) {
    if (!calls[r].skip && calls[r].delay_us > 0) launch(r);
  }
  for (int r = 0; r < n; ++r) {
    count_poison_kernel<<<64, 256, 0, ws.rank(0, r).stream>>>(
        static_cast<const unsigned char*>(out[r]), calls[r].count, dtype_bytes(calls[r].dtype),
        counts + r);
  }
  check_cuda(cudaGetLastError(), "launching the checks");
  sync_ranks(ws);
  std::vector<unsigned long long> host(n);
  check_cuda(cudaMemcpy(host.data(), counts, n * sizeof(unsigned long long), cudaMemcpyDeviceToHost),
             "reading the counters");
  return std::vector<int64_t>(host.begin(), host.end());
}

// A fused launch's error as an exception; a protocol asked for where it cannot
// serve is the caller's (rmsnorm_refusal).
void check_rmsnorm_launch(cudaError_t e, RmsNormProtocol protocol) {
  if (e == cudaErrorNotSupported) {
    throw std::invalid_argument(std::string("all_reduce_rmsnorm: the protocol asked for cannot "
                                            "serve this call: ") +
                                rmsnorm_refusal(protocol) + "; use protocol auto or LL16");
  }
  check_cuda(e, "launching an all_reduce_rmsnorm");
}

RmsNormResult virtual_rmsnorm(Workspace& ws, DType dtype, const std::string& x,
                              const std::string& residual, const std::string& weight,
                              int64_t tokens, int64_t hidden, float eps, int absent,
                              int late, int64_t delay_us, RmsNormProtocol protocol) {
  if (!ws.virtual_ranks()) throw std::runtime_error("virtual_rmsnorm needs a virtual-rank workspace");
  const int n = ws.group_size();
  const size_t row_bytes = static_cast<size_t>(hidden) * dtype_bytes(dtype);
  const size_t block = row_bytes * static_cast<size_t>(tokens);
  if (tokens <= 0 || hidden <= 0 || x.size() != block * n || residual.size() != block ||
      weight.size() != row_bytes) {
    throw std::runtime_error("virtual_rmsnorm: x must hold (ranks, tokens, hidden), residual "
                             "(tokens, hidden) and weight (hidden,) elements");
  }
  if (const char* problem = rmsnorm_unsupported(dtype, hidden, ws.rank(0, 0).view)) {
    throw std::runtime_error(std::string("virtual_rmsnorm: unsupported ") + problem);
  }
  DeviceGuard guard(ws.rank(0, 0).ordinal);
  Buffers bufs;
  char* dx = static_cast<char*>(bufs.alloc(block * n));
  char* dres = static_cast<char*>(bufs.alloc(block));
  char* dw = static_cast<char*>(bufs.alloc(row_bytes));
  char* dnormed = static_cast<char*>(bufs.alloc(block * n));
  char* dnew = static_cast<char*>(bufs.alloc(block * n));
  check_cuda(cudaMemcpy(dx, x.data(), x.size(), cudaMemcpyHostToDevice), "copying x");
  check_cuda(cudaMemcpy(dres, residual.data(), block, cudaMemcpyHostToDevice), "copying residual");
  check_cuda(cudaMemcpy(dw, weight.data(), row_bytes, cudaMemcpyHostToDevice), "copying weight");
  check_cuda(cudaMemset(dnormed, 0, block * n), "clearing outputs");
  check_cuda(cudaMemset(dnew, 0, block * n), "clearing outputs");
  check_cuda(cudaDeviceSynchronize(), "preparing the calls");
  auto launch = [&](int r) {
    check_rmsnorm_launch(launch_all_reduce_rmsnorm(dtype, ws.rank(0, r).view, dx + r * block,
                                                   dres, dw, dnormed + r * block, dnew + r * block,
                                                   tokens, hidden, eps, ws.rank(0, r).stream,
                                                   protocol),
                         protocol);
  };
  for (int r = 0; r < n; ++r) {
    if (r != absent && r != late) launch(r);
  }
  if (late >= 0 && late < n && late != absent) {
    // the late rank's delay kernel is queued once the others' calls spin on the
    // GPU, as virtual_calls does: it must find room among their blocks
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    delay_kernel<<<1, 1, 0, ws.rank(0, late).stream>>>(static_cast<uint64_t>(delay_us) * 1000);
    launch(late);
  }
  sync_ranks(ws);
  RmsNormResult out;
  out.error = first_error(ws);
  if (!out.error.empty() && absent < 0) throw std::runtime_error(out.error);
  out.normed.assign(block * n, '\0');
  out.new_residual.assign(block * n, '\0');
  check_cuda(cudaMemcpy(out.normed.data(), dnormed, block * n, cudaMemcpyDeviceToHost), "reading normed");
  check_cuda(cudaMemcpy(out.new_residual.data(), dnew, block * n, cudaMemcpyDeviceToHost),
             "reading new_residual");
  return out;
}

GatherScatterResult virtual_gather_scatter(Workspace& ws, Collective c, Algorithm algorithm,
                                           DType dtype, const std::string& x, int64_t count) {
  if (!ws.virtual_ranks()) throw std::runtime_error("virtual_gather_scatter needs a virtual-rank workspace");
  if (c != Collective::kAllGather && c != Collective::kReduceScatter) {
    throw std::runtime_error("virtual_gather_scatter: the collective must be all_gather or psum_scatter");
  }
  if (!has_gather_scatter_kernel(c, algorithm, dtype)) {
    throw std::runtime_error("virtual_gather_scatter: no kernel for this algorithm and dtype");
  }
  const int n = ws.group_size();
  const size_t piece = static_cast<size_t>(count) * dtype_bytes(dtype);
  const bool gather = c == Collective::kAllGather;
  const size_t in_bytes = gather ? piece : piece * n;    // per rank
  const size_t out_bytes = gather ? piece * n : piece;   // per rank
  if (count <= 0 || x.size() != in_bytes * n) {
    throw std::runtime_error("virtual_gather_scatter: x must hold every rank's input back to back");
  }
  DeviceGuard guard(ws.rank(0, 0).ordinal);
  Buffers bufs;
  char* dx = static_cast<char*>(bufs.alloc(in_bytes * n));
  char* dy = static_cast<char*>(bufs.alloc(out_bytes * n));
  check_cuda(cudaMemcpy(dx, x.data(), x.size(), cudaMemcpyHostToDevice), "copying x");
  check_cuda(cudaMemset(dy, 0, out_bytes * n), "clearing outputs");
  check_cuda(cudaDeviceSynchronize(), "preparing the calls");
  for (int r = 0; r < n; ++r) {
    check_cuda(launch_gather_scatter(c, algorithm, dtype, ws.rank(0, r).view, dx + r * in_bytes,
                                     dy + r * out_bytes, count, ws.rank(0, r).stream),
               "launching a gather/scatter");
  }
  sync_ranks(ws);
  GatherScatterResult out;
  out.error = first_error(ws);
  out.y.assign(out_bytes * n, '\0');
  check_cuda(cudaMemcpy(out.y.data(), dy, out_bytes * n, cudaMemcpyDeviceToHost), "reading outputs");
  return out;
}

std::vector<const void*> testing_kernel_functions() {
  std::vector<const void*> out;
  append_typed_kernels<float>(out);
  append_typed_kernels<__nv_bfloat16>(out);
  append_typed_kernels<__half>(out);
  append_typed_kernels<int32_t>(out);
  out.push_back(reinterpret_cast<const void*>(&delay_kernel));
  out.push_back(reinterpret_cast<const void*>(&count_poison_kernel));
  return out;
}

StressResult virtual_stress(Workspace& ws, const std::vector<Algorithm>& algorithm, DType dtype,
                            ReduceOp op, const std::vector<int64_t>& counts, uint64_t seed,
                            int max_delay_us) {
  if (!ws.virtual_ranks()) throw std::runtime_error("virtual_stress needs a virtual-rank workspace");
  if (algorithm.empty()) throw std::runtime_error("virtual_stress needs at least one algorithm");
  for (Algorithm a : algorithm) {
    if (!has_kernel(a, dtype, op)) throw std::runtime_error("virtual_stress: no kernel for an algorithm/dtype/op combination");
  }
  for (int64_t c : counts) {
    if (c <= 0) throw std::runtime_error("element counts must be positive");
  }
  DeviceGuard guard(ws.rank(0, 0).ordinal);
  switch (dtype) {
    case DType::kF32: return stress_op<float>(ws, algorithm, dtype, op, counts, seed, max_delay_us);
    case DType::kBF16:
      return stress_op<__nv_bfloat16>(ws, algorithm, dtype, op, counts, seed, max_delay_us);
    case DType::kF16: return stress_op<__half>(ws, algorithm, dtype, op, counts, seed, max_delay_us);
    case DType::kI32: return stress_op<int32_t>(ws, algorithm, dtype, op, counts, seed, max_delay_us);
  }
  throw std::runtime_error("unknown dtype");
}

std::vector<double> virtual_bench(Workspace& ws, Algorithm algorithm, DType dtype, ReduceOp op,
                                  int64_t count, int iters, int reps, bool one_launch) {
  if (!ws.virtual_ranks()) throw std::runtime_error("virtual_bench needs a virtual-rank workspace");
  if (count <= 0 || iters <= 0 || reps <= 0) throw std::runtime_error("count, iters and reps must be positive");
  DeviceGuard guard(ws.rank(0, 0).ordinal);
  const int n = ws.group_size();
  const size_t bytes = static_cast<size_t>(count) * dtype_bytes(dtype);
  Buffers bufs;
  std::vector<void*> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    in[r] = bufs.alloc(bytes);
    out[r] = bufs.alloc(bytes);
    // Small nonzero values: repeated sums stay finite for every dtype.
    check_cuda(cudaMemset(in[r], 0x11, bytes), "filling inputs");
  }
  check_cuda(cudaDeviceSynchronize(), "preparing the benchmark");
  const std::vector<RankView> views = ws.views(0);
  std::vector<const void*> ins(in.begin(), in.end());
  return time_graph(ws, iters, reps, one_launch, [&](int r, cudaStream_t s) {
    if (r < 0) {
      return launch_all_reduce_group(algorithm, dtype, op, views.data(), n, ins.data(), out.data(),
                                     count, s);
    }
    return launch_all_reduce(algorithm, dtype, op, ws.rank(0, r).view, in[r], out[r], count, s);
  });
}

std::vector<double> virtual_rmsnorm_bench(Workspace& ws, DType dtype, int64_t tokens,
                                          int64_t hidden, int iters, int reps,
                                          RmsNormProtocol protocol, bool one_launch) {
  if (!ws.virtual_ranks()) throw std::runtime_error("virtual_rmsnorm_bench needs a virtual-rank workspace");
  if (tokens <= 0 || hidden <= 0 || iters <= 0 || reps <= 0) {
    throw std::runtime_error("tokens, hidden, iters and reps must be positive");
  }
  if (const char* problem = rmsnorm_unsupported(dtype, hidden, ws.rank(0, 0).view)) {
    throw std::runtime_error(std::string("virtual_rmsnorm_bench: unsupported ") + problem);
  }
  DeviceGuard guard(ws.rank(0, 0).ordinal);
  const int n = ws.group_size();
  const size_t bytes = static_cast<size_t>(tokens * hidden) * dtype_bytes(dtype);
  Buffers bufs;
  void* w = bufs.alloc(static_cast<size_t>(hidden) * dtype_bytes(dtype));
  check_cuda(cudaMemset(w, 0x11, static_cast<size_t>(hidden) * dtype_bytes(dtype)), "filling the weight");
  std::vector<void*> x(n), res(n), normed(n), nres(n);
  for (int r = 0; r < n; ++r) {
    x[r] = bufs.alloc(bytes);
    res[r] = bufs.alloc(bytes);
    normed[r] = bufs.alloc(bytes);
    nres[r] = bufs.alloc(bytes);
    // small nonzero values (finite sums and norms for every dtype)
    check_cuda(cudaMemset(x[r], 0x11, bytes), "filling inputs");
    check_cuda(cudaMemset(res[r], 0x11, bytes), "filling inputs");
  }
  check_cuda(cudaDeviceSynchronize(), "preparing the benchmark");
  if (plan_all_reduce_rmsnorm(dtype, ws.rank(0, 0).view, tokens, hidden, protocol).blocks == 0)
    check_rmsnorm_launch(cudaErrorNotSupported, protocol);
  const std::vector<RankView> views = ws.views(0);
  std::vector<RmsNormOperands> ops(n);
  for (int r = 0; r < n; ++r) ops[r] = {x[r], res[r], w, normed[r], nres[r]};
  return time_graph(ws, iters, reps, one_launch, [&](int r, cudaStream_t s) {
    if (r < 0) {
      return launch_all_reduce_rmsnorm_group(dtype, views.data(), n, ops.data(), tokens, hidden,
                                             1e-6f, s, protocol);
    }
    return launch_all_reduce_rmsnorm(dtype, ws.rank(0, r).view, x[r], res[r], w, normed[r],
                                     nres[r], tokens, hidden, 1e-6f, s, protocol);
  });
}

std::vector<double> virtual_gather_scatter_bench(Workspace& ws, Collective c, Algorithm algorithm,
                                                 DType dtype, int64_t count, int iters, int reps) {
  if (!ws.virtual_ranks()) throw std::runtime_error("virtual_gather_scatter_bench needs a virtual-rank workspace");
  if (count <= 0 || iters <= 0 || reps <= 0) throw std::runtime_error("count, iters and reps must be positive");
  if (!has_gather_scatter_kernel(c, algorithm, dtype)) {
    throw std::runtime_error("virtual_gather_scatter_bench: no kernel for this collective, algorithm and dtype");
  }
  DeviceGuard guard(ws.rank(0, 0).ordinal);
  const int n = ws.group_size();
  const size_t piece = static_cast<size_t>(count) * dtype_bytes(dtype);
  const size_t in_bytes = c == Collective::kAllGather ? piece : piece * n;
  const size_t out_bytes = c == Collective::kAllGather ? piece * n : piece;
  Buffers bufs;
  std::vector<void*> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    in[r] = bufs.alloc(in_bytes);
    out[r] = bufs.alloc(out_bytes);
    check_cuda(cudaMemset(in[r], 0x11, in_bytes), "filling inputs");
  }
  check_cuda(cudaDeviceSynchronize(), "preparing the benchmark");
  return time_graph(ws, iters, reps, false, [&](int r, cudaStream_t s) {
    return launch_gather_scatter(c, algorithm, dtype, ws.rank(0, r).view, in[r], out[r], count, s);
  });
}

std::vector<double> virtual_floor(Workspace& ws, int iters, int reps, bool one_launch) {
  if (!ws.virtual_ranks()) throw std::runtime_error("virtual_floor needs a virtual-rank workspace");
  DeviceGuard guard(ws.rank(0, 0).ordinal);
  return time_graph(ws, iters, reps, one_launch, [&](int, cudaStream_t s) { return launch_empty(s); });
}

}  // namespace jaxll
