#include "kernels/kernels.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "jaxll/workspace_layout.h"
#include "kernels/all_reduce.h"
#include "kernels/cuda_call.h"
#include "kernels/exchange.h"
#include "kernels/ragged.h"
#include "kernels/gather_scatter.h"
#include "kernels/rmsnorm.h"
#include "kernels/utility.h"

namespace jaxll {

std::vector<const void*> kernel_functions() {
  std::vector<const void*> out;
  for (const KernelEntry& e : all_reduce_kernels().entries()) out.push_back(e.fn);
  for (const void* fn : rmsnorm_kernel_functions()) out.push_back(fn);
  for (const void* fn : gather_scatter_kernel_functions()) out.push_back(fn);
  for (const void* fn : exchange_kernel_functions()) out.push_back(fn);
  for (const void* fn : ragged_kernel_functions()) out.push_back(fn);
  for (const void* fn : utility_kernel_functions()) out.push_back(fn);
  return out;
}

void load_functions(const std::vector<const void*>& fns, int carveout) {
  for (const void* fn : fns) {
    cudaFuncAttributes attr;
    check_cuda(cudaFuncGetAttributes(&attr, fn), "loading jaxll kernels");
    if (carveout >= 0) {
      check_cuda(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, carveout),
                 "setting the shared-memory carveout of jaxll kernels");
    }
  }
}

int fewest_blocks_per_sm(const std::vector<const void*>& fns) {
  int fewest = 1 << 30;
  for (const void* fn : fns) {
    int blocks = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, kBlockThreads, 0),
               "querying kernel occupancy");
    fewest = std::min(fewest, blocks);
  }
  return fewest == (1 << 30) ? 1 : std::max(fewest, 1);
}

}  // namespace jaxll
