#include "testing/sol_probe.h"

#include <stdexcept>
#include <string>

#include "jaxll/spin_wait.cuh"
#include "kernels/cuda_call.h"

namespace jaxll {
namespace {

// One thread: `iters` fences, each after a store when `with_store` is set.
__global__ void fence_loop_kernel(int iters, int with_store, unsigned int* scratch,
                                  unsigned long long* out_ns) {
  const uint64_t t0 = globaltimer_ns();
  for (int i = 0; i < iters; ++i) {
    if (with_store) *reinterpret_cast<volatile unsigned int*>(scratch) = i;
    __threadfence();
  }
  *out_ns = globaltimer_ns() - t0;
}

__device__ __forceinline__ void store_flag(unsigned int* p, unsigned int v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned int load_flag(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Waits until *mine == v; false after one second.
__device__ bool wait_flag(const unsigned int* mine, unsigned int v) {
  const uint64_t start = globaltimer_ns();
  for (uint32_t spins = 0; load_flag(mine) != v; ++spins) {
    if ((spins & 1023u) == 0 && globaltimer_ns() - start > 1000000000ull) return false;
  }
  return true;
}

// The initiator stores i to the responder's flag and waits for the echo in its own.
__global__ void ping_kernel(unsigned int* mine, unsigned int* theirs, int iters,
                            unsigned long long* out_ns, int* ok) {
  const uint64_t t0 = globaltimer_ns();
  for (int i = 1; i <= iters; ++i) {
    store_flag(theirs, i);
    if (!wait_flag(mine, i)) {
      *ok = 0;
      return;
    }
  }
  *out_ns = globaltimer_ns() - t0;
  *ok = 1;
}

__global__ void pong_kernel(unsigned int* mine, unsigned int* theirs, int iters, int* ok) {
  for (int i = 1; i <= iters; ++i) {
    if (!wait_flag(mine, i)) {
      *ok = 0;
      return;
    }
    store_flag(theirs, i);
  }
  *ok = 1;
}

struct DeviceBuffer {
  int device = -1;
  void* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr) {
      DeviceGuard g(device);
      cudaFree(ptr);
    }
  }
};

}  // namespace

double probe_l2_fence_us(int device, int iters, bool with_store) {
  DeviceGuard guard(device);
  DeviceBuffer buf;
  buf.device = device;
  check_cuda(cudaMalloc(&buf.ptr, 256), "allocating probe memory");
  auto* scratch = static_cast<unsigned int*>(buf.ptr);
  auto* out = reinterpret_cast<unsigned long long*>(static_cast<char*>(buf.ptr) + 128);
  fence_loop_kernel<<<1, 1>>>(100, with_store, scratch, out);  // warm up
  fence_loop_kernel<<<1, 1>>>(iters, with_store, scratch, out);
  check_cuda(cudaGetLastError(), "launching the fence probe");
  unsigned long long ns = 0;
  check_cuda(cudaMemcpy(&ns, out, sizeof(ns), cudaMemcpyDeviceToHost), "reading the fence probe");
  return ns / 1000.0 / iters;
}

double probe_pingpong_one_way_us(int device_a, int device_b, int iters) {
  if (device_a != device_b) {
    int ab = 0, ba = 0;
    check_cuda(cudaDeviceCanAccessPeer(&ab, device_a, device_b), "querying peer access");
    check_cuda(cudaDeviceCanAccessPeer(&ba, device_b, device_a), "querying peer access");
    if (!ab || !ba) {
      throw std::runtime_error("devices " + std::to_string(device_a) + " and " +
                               std::to_string(device_b) + " cannot access each other");
    }
    for (auto [x, y] : {std::pair<int, int>{device_a, device_b}, {device_b, device_a}}) {
      DeviceGuard g(x);
      cudaError_t e = cudaDeviceEnablePeerAccess(y, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError(); else check_cuda(e, "enabling peer access");
    }
  }
  DeviceGuard guard;
  // Load both kernels on both devices first: a kernel loaded lazily while its
  // partner already spins could miss the partner's deadline.
  for (int d : {device_a, device_b}) {
    check_cuda(cudaSetDevice(d), "selecting a device");
    cudaFuncAttributes attr;
    check_cuda(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(&ping_kernel)), "loading probes");
    check_cuda(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(&pong_kernel)), "loading probes");
  }
  DeviceBuffer a, b;
  a.device = device_a;
  b.device = device_b;
  // Each side's flag lives in its own memory, on its own 128-byte line; results after.
  check_cuda(cudaSetDevice(device_a), "selecting a device");
  check_cuda(cudaMalloc(&a.ptr, 512), "allocating probe memory");
  check_cuda(cudaMemset(a.ptr, 0, 512), "clearing probe memory");
  check_cuda(cudaSetDevice(device_b), "selecting a device");
  check_cuda(cudaMalloc(&b.ptr, 512), "allocating probe memory");
  check_cuda(cudaMemset(b.ptr, 0, 512), "clearing probe memory");
  auto* flag_a = static_cast<unsigned int*>(a.ptr);
  auto* flag_b = static_cast<unsigned int*>(b.ptr);
  auto* out = reinterpret_cast<unsigned long long*>(static_cast<char*>(a.ptr) + 128);
  auto* ok_a = reinterpret_cast<int*>(static_cast<char*>(a.ptr) + 256);
  auto* ok_b = reinterpret_cast<int*>(static_cast<char*>(b.ptr) + 256);

  cudaStream_t sa, sb;
  check_cuda(cudaSetDevice(device_b), "selecting a device");
  check_cuda(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking), "creating a stream");
  check_cuda(cudaSetDevice(device_a), "selecting a device");
  check_cuda(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking), "creating a stream");
  // Responder first, so it is resident before the first ping.
  check_cuda(cudaSetDevice(device_b), "selecting a device");
  pong_kernel<<<1, 32, 0, sb>>>(flag_b, flag_a, iters, ok_b);
  check_cuda(cudaGetLastError(), "launching the pong probe");
  check_cuda(cudaSetDevice(device_a), "selecting a device");
  ping_kernel<<<1, 32, 0, sa>>>(flag_a, flag_b, iters, out, ok_a);
  check_cuda(cudaGetLastError(), "launching the ping probe");
  cudaError_t ea = cudaStreamSynchronize(sa);
  check_cuda(cudaSetDevice(device_b), "selecting a device");
  cudaError_t eb = cudaStreamSynchronize(sb);
  cudaStreamDestroy(sb);
  check_cuda(cudaSetDevice(device_a), "selecting a device");
  cudaStreamDestroy(sa);
  check_cuda(ea, "running the ping probe");
  check_cuda(eb, "running the pong probe");
  int oka = 0, okb = 0;
  unsigned long long ns = 0;
  check_cuda(cudaMemcpy(&oka, ok_a, sizeof(int), cudaMemcpyDeviceToHost), "reading the probe");
  check_cuda(cudaMemcpy(&ns, out, sizeof(ns), cudaMemcpyDeviceToHost), "reading the probe");
  check_cuda(cudaSetDevice(device_b), "selecting a device");
  check_cuda(cudaMemcpy(&okb, ok_b, sizeof(int), cudaMemcpyDeviceToHost), "reading the probe");
  if (!oka || !okb) throw std::runtime_error("the ping-pong probe timed out (blocks not co-scheduled?)");
  return ns / 1000.0 / (2.0 * iters);
}

}  // namespace jaxll
