#include "testing/tool_kernels.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <vector>

#include "jaxll/workspace_layout.h"
#include "kernels/cuda_call.h"
#include "kernels/kernels.h"
#include "testing/group_launch.h"
#include "testing/virtual_drivers.h"

namespace jaxll {
namespace {

// The collective kernels (their grids must be co-resident), then the drivers' own.
std::vector<const void*> collective_kernels() {
  std::vector<const void*> out = kernel_functions();
  const std::vector<const void*> twins = group_kernel_functions();
  out.insert(out.end(), twins.begin(), twins.end());
  return out;
}

std::vector<const void*> tool_kernels() {
  std::vector<const void*> out = collective_kernels();
  for (const std::vector<const void*>& more : {stress_kernel_functions(), call_kernel_functions()}) {
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

void load(int ordinal, int carveout) {
  DeviceGuard guard(ordinal);
  for (const void* fn : tool_kernels()) {
    cudaFuncAttributes attr;  // querying the attributes loads the kernel
    check_cuda(cudaFuncGetAttributes(&attr, fn), "loading jaxll's testing kernels");
    if (carveout >= 0) {
      check_cuda(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, carveout),
                 "setting the shared-memory carveout of jaxll's testing kernels");
    }
  }
}

}  // namespace

int load_tool_kernels(int ordinal, int carveout, char* error, size_t error_len) {
  try {
    load(ordinal, carveout);
    return 0;
  } catch (const std::exception& e) {
    if (error != nullptr && error_len > 0) std::snprintf(error, error_len, "%s", e.what());
    return 1;
  }
}

int tool_block_bound(int ordinal, int carveout) {
  load(ordinal, carveout);
  DeviceGuard guard(ordinal);
  int sms = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal),
             "querying the multiprocessor count");
  int fewest = 1 << 30;
  for (const void* fn : collective_kernels()) {
    int blocks = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, kBlockThreads, 0),
               "querying kernel occupancy");
    fewest = std::min(fewest, blocks);
  }
  return sms * std::max(fewest == (1 << 30) ? 1 : fewest, 1);
}

}  // namespace jaxll
