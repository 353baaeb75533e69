// Every kernel of the library, and loading them on a device before first use
// and bounding grids by their occupancy (ffi/runtime/kernel_loading.cc; the
// testing tools do the same for the group twins, kernels/group_launch.h).
//
// The library is a shared library linked with CUDA's static runtime, which
// knows only the kernels of its own library: every call that takes one of its
// kernels (a launch, an attribute, an occupancy query) is made here.
#pragma once

#include <vector>

namespace jaxll {

// The kernels the runtime launches (the group twins are apart).
std::vector<const void*> kernel_functions();

// Loads each of `fns` (this library's kernels) on the current device (querying
// a kernel's attributes loads it) and, where `carveout` >= 0, sets its
// shared-memory carveout preference. Throws std::runtime_error on failure.
void load_functions(const std::vector<const void*>& fns, int carveout);

// The fewest blocks of kBlockThreads threads of any of `fns` that one SM of the
// current device holds at once (at least 1). Throws std::runtime_error.
int fewest_blocks_per_sm(const std::vector<const void*>& fns);

}  // namespace jaxll
