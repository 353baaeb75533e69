// The kernels the testing tools launch (the library's, their group twins and
// the drivers' own): loaded with every workspace the runtime builds, and the
// grid bound they allow.
#pragma once

#include <cstddef>

namespace jaxll {

// A kernel loader for the runtime (ExtensionApi::register_loader).
int load_tool_kernels(int ordinal, int carveout, char* error, size_t error_len);
// SMs times the lowest occupancy of the collective kernels among these on CUDA
// device `ordinal` (loads them all first): the most co-resident blocks.
int tool_block_bound(int ordinal, int carveout);

}  // namespace jaxll
