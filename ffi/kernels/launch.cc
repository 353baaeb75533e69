#include "kernels/launch.h"

#include <cstring>
#include <mutex>
#include <vector>

namespace jaxll {

bool launches_early(const RankView& view, int64_t blocks) {
  return view.pdl && 2 * blocks <= view.max_blocks;
}

namespace {
thread_local LaunchCapture* t_capture = nullptr;
}  // namespace

LaunchCapture::LaunchCapture() : outer_(t_capture) { t_capture = this; }

LaunchCapture::~LaunchCapture() { t_capture = outer_; }

Status launch_collective(const void* fn, int64_t blocks, int threads, bool pdl, const void* args,
                         size_t args_bytes, cudaStream_t stream, int cluster, int ranks) {
  if (LaunchCapture* c = t_capture) {
    if (c->count_ > 0 || ranks != 1 || args_bytes > CapturedLaunch::kMaxArgsBytes ||
        (cluster > 1 && blocks % cluster != 0)) {
      c->refused_ = true;
      return Status::NoPlan();
    }
    CapturedLaunch& l = c->launch_;
    l.fn = fn;
    l.blocks = blocks;
    l.threads = threads;
    l.cluster = cluster;
    l.pdl = pdl;
    l.args_bytes = args_bytes;
    std::memcpy(l.args, args, args_bytes);
    c->count_ = 1;
    return Status::Ok();
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(ranks));
  config.blockDim = dim3(threads);
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  unsigned count = 0;
  if (pdl) {
    attribute[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (cluster > 1) {
    if (blocks % cluster != 0) return Status::NoPlan();
    attribute[count].id = cudaLaunchAttributeClusterDimension;
    attribute[count].val.clusterDim.x = static_cast<unsigned>(cluster);
    attribute[count].val.clusterDim.y = 1;
    attribute[count].val.clusterDim.z = 1;
    ++count;
  }
  config.attrs = count ? attribute : nullptr;
  config.numAttrs = count;
  void* params[] = {const_cast<void*>(args)};
  return Status::Cuda(cudaLaunchKernelExC(&config, fn, params));
}

cudaFunction_t kernel_handle(const void* fn) {
  cudaFunction_t handle = nullptr;
  if (cudaGetFuncBySymbol(&handle, fn) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return handle;
}

namespace {

struct ClusterCapacity {
  int device;
  const void* fn;
  int cluster, threads;
  int64_t capacity;  // clusters the device holds at once
  int64_t bound;     // SMs x fn's blocks per SM at kBlockThreads
};

// The device's capacity for clusters of this shape (0 where it launches none).
ClusterCapacity measure_capacity(int device, const void* fn, int cluster, int threads) {
  ClusterCapacity e{device, fn, cluster, threads, 0, 0};
  int can = 0, sms = 0, per_sm = 0, clusters = 0;
  cudaFuncAttributes attr{};
  // (the kernel's code must be built for sm_90 or newer: PTX of an older
  // architecture, JIT-compiled here, has no cluster path)
  if (cudaFuncGetAttributes(&attr, fn) != cudaSuccess || attr.binaryVersion < 90 ||
      cudaDeviceGetAttribute(&can, cudaDevAttrClusterLaunch, device) != cudaSuccess || !can ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, kBlockThreads, 0) != cudaSuccess) {
    return e;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(cluster));
  config.blockDim = dim3(threads);
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  if (cudaOccupancyMaxActiveClusters(&clusters, fn, &config) == cudaSuccess) {
    e.capacity = clusters;
    e.bound = static_cast<int64_t>(sms) * per_sm;
  } else {
    (void)cudaGetLastError();  // clear the refused query's (non-sticky) error only
  }
  return e;
}

}  // namespace

int64_t cluster_allowance(const void* fn, int cluster, int threads, const RankView& view) {
  static std::mutex mu;
  static std::vector<ClusterCapacity> cache;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  ClusterCapacity e{};
  {
    std::lock_guard<std::mutex> lock(mu);
    bool found = false;
    for (const ClusterCapacity& c : cache) {
      if (c.device == device && c.fn == fn && c.cluster == cluster && c.threads == threads) {
        e = c;
        found = true;
        break;
      }
    }
    if (!found) {
      e = measure_capacity(device, fn, cluster, threads);
      cache.push_back(e);
    }
  }
  if (e.capacity <= 0 || e.bound <= 0) return 0;
  return e.capacity * view.max_blocks / e.bound;
}

}  // namespace jaxll
