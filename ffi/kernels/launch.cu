// Launch helpers shared by every kernel file (and linked by the standalone
// harness tests/gpu_scripts/fused_rmsnorm_harness.cu): element sizes, the PDL
// rule and the one launch path.
#include <cuda_runtime.h>

#include <cstdint>

#include "all_reduce.h"
#include "all_reduce_kernels.h"

namespace jaxll {

int dtype_bytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kI32: return 4;
  }
  return 0;
}

bool launches_early(const RankView& view, int64_t blocks) {
  // With programmatic dependent launch a kernel may be scheduled while the one
  // ahead of it on the stream still runs, so two of this rank's grids can be
  // resident at once. That is safe where both fit beside every other rank's
  // grid: only grids of at most half the co-residency bound take part (they
  // launch early, and they let their successor launch early).
  return view.pdl && 2 * blocks <= view.max_blocks;
}

cudaError_t launch_collective(const void* fn, int64_t blocks, int threads, bool pdl, void* args,
                              cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(threads);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  if (pdl) {
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  void* params[] = {args};
  return cudaLaunchKernelExC(&config, fn, params);
}

}  // namespace jaxll
