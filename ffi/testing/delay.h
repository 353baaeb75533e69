// A one-thread kernel that holds a stream for a while: how the tools make a
// rank late.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace jaxll {

void launch_delay(cudaStream_t stream, uint64_t ns);
const void* delay_kernel_function();

}  // namespace jaxll
