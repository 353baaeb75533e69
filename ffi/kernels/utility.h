// Small kernels of the runtime and the tools: the floor under any custom call
// that launches a kernel, and a scalar fill.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/status.h"

namespace jaxll {

// An empty kernel of one warp.
Status launch_empty(cudaStream_t stream);
// *out = value.
Status launch_fill_i32(int32_t* out, int32_t value, cudaStream_t stream);
std::vector<const void*> utility_kernel_functions();

}  // namespace jaxll
