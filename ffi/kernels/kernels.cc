#include "kernels/kernels.h"

#include "kernels/all_reduce.h"
#include "kernels/gather_scatter.h"
#include "kernels/rmsnorm.h"
#include "kernels/utility.h"

namespace jaxll {

std::vector<const void*> kernel_functions() {
  std::vector<const void*> out;
  for (const KernelEntry& e : all_reduce_kernels().entries()) out.push_back(e.fn);
  for (const void* fn : rmsnorm_kernel_functions()) out.push_back(fn);
  for (const void* fn : gather_scatter_kernel_functions()) out.push_back(fn);
  for (const void* fn : utility_kernel_functions()) out.push_back(fn);
  return out;
}

}  // namespace jaxll
