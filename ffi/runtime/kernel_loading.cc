#include "runtime/kernel_loading.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "jaxll/workspace_layout.h"
#include "kernels/kernels.h"
#include "runtime/workspace.h"

namespace jaxll {
namespace {

std::mutex g_loaders_mutex;

std::vector<KernelLoader>& loaders() {
  static std::vector<KernelLoader> kept;
  return kept;
}

// Loads kernel `fn` on the current device and sets its shared-memory carveout.
void load_kernel(const void* fn, int carveout) {
  cudaFuncAttributes attr;  // querying the attributes loads the kernel
  check_cuda(cudaFuncGetAttributes(&attr, fn), "loading jaxll kernels");
  if (carveout >= 0) {
    check_cuda(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, carveout),
               "setting the shared-memory carveout of jaxll kernels");
  }
}

// Occupancy of the least-occupying kernel at kBlockThreads threads (current device).
int min_blocks_per_sm() {
  int best = 1 << 30;
  for (const void* fn : kernel_functions()) {
    int blocks = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, kBlockThreads, 0),
               "querying kernel occupancy");
    best = std::min(best, blocks);
  }
  return best == (1 << 30) ? 1 : std::max(best, 1);
}

}  // namespace

void run_loader(KernelLoader load, int ordinal, int carveout) {
  char error[512] = {0};
  if (load(ordinal, carveout, error, sizeof(error)) != 0) {
    throw std::runtime_error("an extension's kernel loader (register_loader) failed on CUDA device " +
                             std::to_string(ordinal) + ": " + error);
  }
}

void keep_loader(KernelLoader load) {
  std::lock_guard<std::mutex> lock(g_loaders_mutex);
  if (std::find(loaders().begin(), loaders().end(), load) == loaders().end()) {
    loaders().push_back(load);
  }
}

void load_kernels(int ordinal, int carveout) {
  DeviceGuard guard(ordinal);
  for (const void* fn : kernel_functions()) load_kernel(fn, carveout);
  std::vector<KernelLoader> kept;
  {
    std::lock_guard<std::mutex> lock(g_loaders_mutex);
    kept = loaders();
  }
  for (KernelLoader load : kept) run_loader(load, ordinal, carveout);
}

int device_block_bound(int ordinal, int carveout) {
  load_kernels(ordinal, carveout);
  DeviceGuard guard(ordinal);
  int sms = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal),
             "querying the multiprocessor count");
  return sms * min_blocks_per_sm();
}

}  // namespace jaxll
