#include "testing/tool_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <vector>

#include "kernels/cuda_call.h"
#include "kernels/group_launch.h"
#include "kernels/kernels.h"
#include "testing/virtual_drivers.h"

namespace jaxll {
namespace {

// The collective kernels the tools launch (their grids must be co-resident):
// the library's and their group twins, loaded by the library (kernels.h).
std::vector<const void*> collective_kernels() {
  std::vector<const void*> out = kernel_functions();
  const std::vector<const void*> twins = group_kernel_functions();
  out.insert(out.end(), twins.begin(), twins.end());
  return out;
}

void load(int ordinal, int carveout) {
  DeviceGuard guard(ordinal);
  load_functions(collective_kernels(), carveout);
  // the drivers' own kernels, this module's
  for (const std::vector<const void*>& own : {stress_kernel_functions(), call_kernel_functions()}) {
    for (const void* fn : own) {
      cudaFuncAttributes attr;  // querying the attributes loads the kernel
      check_cuda(cudaFuncGetAttributes(&attr, fn), "loading jaxll's testing kernels");
      if (carveout >= 0) {
        check_cuda(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, carveout),
                   "setting the shared-memory carveout of jaxll's testing kernels");
      }
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
  return sms * fewest_blocks_per_sm(collective_kernels());
}

}  // namespace jaxll
