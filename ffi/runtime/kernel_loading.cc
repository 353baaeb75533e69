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
  load_functions(kernel_functions(), carveout);
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
  return sms * fewest_blocks_per_sm(kernel_functions());
}

}  // namespace jaxll
