#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "jaxll/rank_view.h"

namespace custom_collective {

// Broadcasts `bytes` bytes of `x` on rank `root` into `y` on every rank of
// `view`'s group (each rank calls it with its own view, the same bytes/root).
cudaError_t launch_broadcast(const jaxll::RankView& view, const void* x, void* y, int64_t bytes,
                             int root, cudaStream_t stream);

// Loads the kernel on CUDA device `ordinal` with the shared-memory carveout
// `carveout` (< 0: the driver's choice), restoring the current device: the work
// of the loader registered with jaxll's register_loader (jaxll/extension.h).
cudaError_t load_broadcast_kernel(int ordinal, int carveout);

}  // namespace custom_collective
