#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "jaxll/rank_view.h"

namespace custom_collective {

// Broadcasts `bytes` bytes of `x` on rank `root` into `y` on every rank of
// `view`'s group (each rank calls it with its own view, the same bytes/root).
cudaError_t launch_broadcast(const jaxll::RankView& view, const void* x, void* y, int64_t bytes,
                             int root, cudaStream_t stream);

// The kernel's address, for jaxll's register_kernels (jaxll/extension.h).
const void* broadcast_kernel_address();

}  // namespace custom_collective
