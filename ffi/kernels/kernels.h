// Every kernel of the library, for loading on a device before first use and
// for bounding grids by their occupancy (ffi/runtime/kernel_loading.cc).
#pragma once

#include <vector>

namespace jaxll {

std::vector<const void*> kernel_functions();

}  // namespace jaxll
