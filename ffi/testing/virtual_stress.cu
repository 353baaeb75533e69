// The randomized stress test of virtual_drivers.h: long sequences of calls,
// ranks skewed against each other, every element checked on the device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>
#include <type_traits>

#include "jaxll/elements.cuh"
#include "jaxll/spin_wait.cuh"
#include "kernels/all_reduce.h"
#include "kernels/cuda_call.h"
#include "testing/delay.h"
#include "testing/device_buffers.h"
#include "testing/virtual_drivers.h"

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

bool reproducible(Algorithm a) { return a != Algorithm::kTwoShotLL128Atomic; }

template <class T>
float accumulation_eps() {
  return sizeof(T) == 4 ? 1.0f / (1 << 23) : (std::is_same<T, __half>::value ? 1.0f / 1024 : 1.0f / 128);
}

template <class T, class Op>
StressResult stress_typed(VirtualGroup& g, const std::vector<Algorithm>& algorithms, DType dtype,
                          ReduceOp op, const std::vector<int64_t>& counts, uint64_t seed,
                          int max_delay_us) {
  const int n = g.size();
  const int64_t max_count = counts.empty() ? 1 : *std::max_element(counts.begin(), counts.end());
  const int64_t buf_len = kGuardFront + max_count + 1 + kGuardBack;
  const uint32_t guard = sizeof(T) == 2 ? 0xA5A5u : 0xA5A5A5A5u;
  DeviceBuffers bufs;
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
      cudaStream_t s = g.rank(r).stream;
      fill_bits_kernel<T><<<grid, threads, 0, s>>>(out[r], buf_len, guard);
      gen_kernel<T><<<grid, threads, 0, s>>>(in[r] + off, count, seed, c, r);
      const uint64_t h = mix64(seed ^ (c * 131 + r));
      if (max_delay_us > 0 && (h & 3) == 0) {
        launch_delay(s, (h >> 8) % (static_cast<uint64_t>(max_delay_us) * 1000 + 1));
      }
    }
    for (int r = 0; r < n; ++r) {
      check_status(launch_all_reduce(algorithm, dtype, op, g.rank(r).view, in[r] + off,
                                     out[r] + off, count, g.rank(r).stream),
                   "launching an all-reduce of " + std::to_string(count) + " elements");
    }
    if (reproducible(algorithm)) {
      for (int r = 0; r < n; ++r) {
        check_kernel<T, Op><<<grid, threads, 0, g.rank(r).stream>>>(
            out[r], buf_len, off, count, n, seed, c, r, guard, mm);
      }
    } else {
      // Compare all ranks' outputs on rank 0's stream, then let every rank go on.
      cudaStream_t s0 = g.rank(0).stream;
      for (int r = 1; r < n; ++r) {
        check_cuda(cudaEventRecord(events[r], g.rank(r).stream), "recording an event");
        check_cuda(cudaStreamWaitEvent(s0, events[r], 0), "joining the ranks");
      }
      check_close_kernel<T><<<grid, threads, 0, s0>>>(outs, buf_len, off, count, n, seed, c,
                                                        guard, accumulation_eps<T>(), mm);
      check_cuda(cudaEventRecord(events[n], s0), "recording an event");
      for (int r = 1; r < n; ++r)
        check_cuda(cudaStreamWaitEvent(g.rank(r).stream, events[n], 0), "forking the ranks");
    }
    check_cuda(cudaGetLastError(), "launching the stress kernels");
  }
  g.sync();
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
  res.error = g.refresh();
  return res;
}

template <class T>
StressResult stress_op(VirtualGroup& g, const std::vector<Algorithm>& a, DType d, ReduceOp op,
                       const std::vector<int64_t>& counts, uint64_t seed, int delay) {
  switch (op) {
    case ReduceOp::kSum: return stress_typed<T, SumOp>(g, a, d, op, counts, seed, delay);
    case ReduceOp::kMax: return stress_typed<T, MaxOp>(g, a, d, op, counts, seed, delay);
    case ReduceOp::kMin: return stress_typed<T, MinOp>(g, a, d, op, counts, seed, delay);
  }
  throw std::runtime_error("unknown reduction");
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

StressResult virtual_stress(VirtualGroup& g, const std::vector<Algorithm>& algorithm, DType dtype,
                            ReduceOp op, const std::vector<int64_t>& counts, uint64_t seed,
                            int max_delay_us) {
  if (algorithm.empty()) throw std::runtime_error("virtual_stress needs at least one algorithm");
  for (Algorithm a : algorithm) {
    if (!has_kernel(a, dtype, op)) throw std::runtime_error("virtual_stress: no kernel for an algorithm/dtype/op combination");
  }
  for (int64_t c : counts) {
    if (c <= 0) throw std::runtime_error("element counts must be positive");
  }
  DeviceGuard guard(g.ordinal());
  g.refresh();  // (the views: calls on a workspace in error poison, and say so at the end)
  switch (dtype) {
    case DType::kF32: return stress_op<float>(g, algorithm, dtype, op, counts, seed, max_delay_us);
    case DType::kBF16:
      return stress_op<__nv_bfloat16>(g, algorithm, dtype, op, counts, seed, max_delay_us);
    case DType::kF16: return stress_op<__half>(g, algorithm, dtype, op, counts, seed, max_delay_us);
    case DType::kI32: return stress_op<int32_t>(g, algorithm, dtype, op, counts, seed, max_delay_us);
  }
  throw std::runtime_error("unknown dtype");
}

std::vector<const void*> stress_kernel_functions() {
  std::vector<const void*> out;
  append_typed_kernels<float>(out);
  append_typed_kernels<__nv_bfloat16>(out);
  append_typed_kernels<__half>(out);
  append_typed_kernels<int32_t>(out);
  return out;
}

}  // namespace jaxll
